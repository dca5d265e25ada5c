"""One object downloaded as several ranged GETs side by side, each written at its offset into the same file.

A GET waits for its first byte (a request's round trip and the store's own time, tens of milliseconds)
before its body moves, and one connection's stream is limited on its own (AWS recommends byte-range
fetches in parallel for large objects). A shard downloaded in parts keeps several requests in flight
without taking more cache room than the shard: the link stays busy while each part waits for its answer.

The rule (``part_ranges``): an object of up to ``WHOLE_GET_BYTES`` (256 MiB) is one GET. Measured on the
benchmark's link (20 ms a request, 25 MB/s, 1 MiB shards, a quarter-corpus cache, K=12), 4 parts a shard made
the epoch 11% faster (1.15x the link's limit against 1.29x) but the first batch 25% slower (0.29 s against
0.23 s: the first batch's shards share the link with the parts of the others) at 4x the requests; shards
prefetched side by side already keep several requests in flight. A larger object comes in parts of at least
``MIN_PART_BYTES``, ``PARTS_AT_ONCE`` at a time, none larger than ``LARGEST_PART_BYTES`` (a 1 GiB shard is 64
GETs of 16 MiB), as AWS recommends for large objects. Each part is retried on its own under the store's policy
(``Retrying.call_async``); a part that fails for good cancels the others and fails the download. A service's
backend gives the one ranged GET (``RangeFetch``) and the event loop its client runs on (``s3_backend``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from guideloom._remote.retries import Retrying

WHOLE_GET_BYTES = 256 << 20  # an object up to this size is one GET (see above)
MIN_PART_BYTES = 256 << 10  # smaller parts would cost a request each for little transfer
PARTS_AT_ONCE = 4  # a shard's requests in flight; with 4 prefetches at once, 16 (see docs/object-storage.md)
LARGEST_PART_BYTES = 16 << 20  # the part size AWS suggests for parallel byte-range GETs: 8-16 MB
# One ranged GET of the bytes [start, end): each chunk of its body handed to the writer in order, the body's
# length checked against what the answer promised (``ShortBody`` if it came short).
RangeFetch = Callable[[int, int, Callable[[bytes], None]], Awaitable[None]]


def part_ranges(size: int) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` an object of ``size`` bytes is downloaded in, of near-equal lengths."""
    if size <= WHOLE_GET_BYTES:
        return [(0, size)]
    count = min(size // MIN_PART_BYTES, max(PARTS_AT_ONCE, -(-size // LARGEST_PART_BYTES)))
    count = max(1, count)
    return [(size * part // count, size * (part + 1) // count) for part in range(count)]


async def download_parts(
    fetch: RangeFetch, destination: Path, ranges: list[tuple[int, int]], retrying: Retrying, doing: str
) -> None:
    """Write the object's ``ranges`` into ``destination`` (created or truncated), ``PARTS_AT_ONCE`` at a time.

    Runs on the event loop of the client that ``fetch`` uses. The first part that fails for good (after its
    retries) is raised once the other parts have stopped, so nothing writes into the file after this returns.
    """
    descriptor = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        at_once = asyncio.Semaphore(PARTS_AT_ONCE)

        async def part(start: int, end: int) -> None:
            async with at_once:

                async def attempt(_: int) -> None:
                    await fetch(start, end, _Writer(descriptor, start).write)

                await retrying.call_async(f"{doing} (bytes {start}-{end - 1})", attempt)

        tasks = [asyncio.ensure_future(part(start, end)) for start, end in ranges]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        os.close(descriptor)


class _Writer:
    """Writes a part's body, chunk after chunk, from its start on."""

    def __init__(self, descriptor: int, offset: int) -> None:
        self.descriptor = descriptor
        self.offset = offset

    def write(self, chunk: bytes) -> None:
        write_at(self.descriptor, chunk, self.offset)
        self.offset += len(chunk)


def write_at(descriptor: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` into the file at ``offset``."""
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view, offset)
        view, offset = view[written:], offset + written
