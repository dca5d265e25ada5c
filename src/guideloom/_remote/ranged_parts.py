"""One S3 object downloaded as several ranged GETs side by side, each written at its offset into the same file.

A GET waits for its first byte (a request's round trip and the store's own time, tens of milliseconds)
before its body moves, and one connection's stream is limited on its own (AWS recommends byte-range
fetches in parallel for large objects). A shard downloaded in parts keeps several requests in flight
without taking more cache room than the shard: the link stays busy while each part waits for its answer.

The rule (``part_ranges``): parts of at least ``MIN_PART_BYTES`` (an object smaller than two of them is one
GET), ``PARTS_AT_ONCE`` parts of an object at a time, and no part larger than ``LARGEST_PART_BYTES`` (a larger
object is more parts, still ``PARTS_AT_ONCE`` at a time). So a 1 MiB shard is 4 GETs of 256 KiB, a 64 MiB
shard 4 of 16 MiB, a 1 GiB shard 64 of 16 MiB. Each part is retried on its own under the store's policy
(``Retrying.call_async``); a part that fails for good cancels the others and fails the download.
"""

from __future__ import annotations

import asyncio
import os
from functools import partial
from pathlib import Path
from typing import Any

from guideloom._remote.retries import Retrying
from guideloom._remote.s3_bodies import DOWNLOAD_CHUNK, check_length

MIN_PART_BYTES = 256 << 10  # smaller parts would cost a request each for little transfer
PARTS_AT_ONCE = 4  # a shard's requests in flight; with 4 prefetches at once, 16 (see docs/object-storage.md)
LARGEST_PART_BYTES = 16 << 20  # the part size AWS suggests for parallel byte-range GETs: 8-16 MB


def part_ranges(size: int) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` an object of ``size`` bytes is downloaded in, of near-equal lengths."""
    count = min(size // MIN_PART_BYTES, max(PARTS_AT_ONCE, -(-size // LARGEST_PART_BYTES)))
    count = max(1, count)
    return [(size * part // count, size * (part + 1) // count) for part in range(count)]


async def download_parts(
    fs: Any, bucket: str, key: str, destination: Path, ranges: list[tuple[int, int]], retrying: Retrying, doing: str
) -> None:
    """Write the object's ``ranges`` into ``destination`` (created or truncated), ``PARTS_AT_ONCE`` at a time.

    Runs on s3fs's event loop. The first part that fails for good (after its retries) is raised once the
    other parts have stopped, so nothing writes into the file after this returns.
    """
    descriptor = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        at_once = asyncio.Semaphore(PARTS_AT_ONCE)

        async def part(start: int, end: int) -> None:
            async with at_once:
                fetch = partial(_get_part, fs, bucket, key, descriptor, start, end)
                await retrying.call_async(f"{doing} (bytes {start}-{end - 1})", fetch)

        tasks = [asyncio.ensure_future(part(start, end)) for start, end in ranges]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        os.close(descriptor)


async def _get_part(fs: Any, bucket: str, key: str, descriptor: int, start: int, end: int, _attempt: int) -> None:
    """One ranged GET, its body written from ``start`` on and checked against its ``Content-Length``."""
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
    body = response["Body"]
    offset = start
    try:
        while chunk := await body.read(DOWNLOAD_CHUNK):
            write_at(descriptor, chunk, offset)
            offset += len(chunk)
        check_length(offset - start, response, f"{bucket}/{key} (bytes {start}-{end - 1})")
    finally:
        body.close()


def write_at(descriptor: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` into the file at ``offset``."""
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view, offset)
        view, offset = view[written:], offset + written
