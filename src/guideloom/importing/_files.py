"""Where an input's bytes are: a local file, or an object on an object store (``s3://``, ``gs://``, ... via fsspec).

Inputs are ``Path`` values when local and URL strings when on an object store; Parquet and Arrow files,
JSON Lines and WebDataset tars are read from either (fsspec's file objects: ranged reads, as pyarrow
asks), with ``storage_options`` handed to fsspec (credentials, an endpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

InputPath = Path | str  # a local file, or an object store URL


def is_remote(path: InputPath) -> bool:
    return isinstance(path, str)


def _filesystem(url: str, options: dict[str, Any] | None) -> tuple[Any, str]:
    try:
        import fsspec.core
    except ImportError as error:
        raise ImportError("reading sources on an object store needs fsspec: pip install 'guideloom[remote]'") from error
    filesystem, location = fsspec.core.url_to_fs(url, **(options or {}))
    return filesystem, location


def open_binary(path: InputPath, options: dict[str, Any] | None) -> IO[bytes]:
    """The input's bytes, opened for reading (seekable)."""
    if isinstance(path, Path):
        return open(path, "rb")
    filesystem, location = _filesystem(path, options)
    handle: IO[bytes] = filesystem.open(location, "rb")
    return handle


def size_of(path: InputPath, options: dict[str, Any] | None) -> int:
    if isinstance(path, Path):
        return path.stat().st_size
    filesystem, location = _filesystem(path, options)
    return int(filesystem.size(location))


def read_head(path: InputPath, options: dict[str, Any] | None, count: int = 10) -> bytes:
    with open_binary(path, options) as file:
        return file.read(count)


def remote_entries(url: str, options: dict[str, Any] | None) -> tuple[bool, list[str]]:
    """Whether ``url`` is a folder (a prefix holding objects) and, if so, its objects' URLs, sorted; FileNotFoundError
    when it names nothing."""
    filesystem, location = _filesystem(url, options)
    scheme = url.split("://", 1)[0]
    if filesystem.isfile(location):
        return False, []
    found = sorted(filesystem.find(location))
    if not found:
        raise FileNotFoundError(f"source not found: {url}")
    return True, [f"{scheme}://{name}" for name in found]
