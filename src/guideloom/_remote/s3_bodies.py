"""The bodies of S3 GET requests made through s3fs's client directly: read whole, or streamed into a file.

``ObjectStore`` reads and downloads S3 objects this way (one GET, where fsspec's generic calls may first
HEAD and list, and a body streamed into the file rather than collected): each body's length is checked
against the response's ``Content-Length``, so one cut short is a ``ShortBody`` the store retries.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from guideloom._remote.retries import ShortBody

DOWNLOAD_CHUNK = 4 * 1024 * 1024


class Decoder(Protocol):
    """What a download's bytes go through on their way into the file (a decompressor)."""

    def write(self, chunk: bytes) -> None: ...

    def finish(self) -> None: ...


async def read_s3_object(fs: Any, bucket: str, key: str, arguments: dict[str, str]) -> bytes:
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **arguments)
    body = response["Body"]
    try:
        data = bytes(await body.read())
    finally:
        body.close()
    check_length(len(data), response, f"{bucket}/{key}")
    return data


async def stream_s3_object(
    fs: Any, bucket: str, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None
) -> None:
    """Stream an S3 object's body into a local file (several times faster than fsspec's cat_file)."""
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    body = response["Body"]
    received = 0
    try:
        with open(destination, "wb") as file:
            decoding = None if decoder is None else decoder(file)
            while chunk := await body.read(DOWNLOAD_CHUNK):
                received += len(chunk)
                if decoding is None:
                    file.write(chunk)
                else:
                    decoding.write(chunk)
            check_length(received, response, f"{bucket}/{key}")
            if decoding is not None:
                decoding.finish()
    finally:
        body.close()


def check_length(received: int, response: dict[str, Any], name: str) -> None:
    expected = response.get("ContentLength")
    if isinstance(expected, int) and received != expected:
        raise ShortBody(f"the body of {name} ended after {received} of {expected} bytes")
