"""Compressed inputs, read transparently: gzip, zstd, bz2 and xz, known by their name and their first bytes.

A :class:`DecompressingReader` turns a compressed file into its decompressed bytes, stream after stream
(``cat a.gz b.gz`` is a valid gzip file), and reports damaged or truncated data as a
:class:`~guideloom.TokenizeInputError` naming the file. It counts the compressed bytes it has read, so
progress is measured on the file as it lies on disk.
"""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from guideloom._core.errors import TokenizeInputError

INSTALL_HINT = "pip install 'guideloom[tokenize]'"
READ_CHUNK = 1 << 16  # compressed bytes per read: text expands ~3-10x
MAGIC_LENGTH = 10


@dataclass(frozen=True)
class Codec:
    """One compression: its name, file suffix, first bytes, and how to make a decompressor for one stream."""

    name: str
    suffix: str
    magic: bytes
    new_decompressor: Callable[[], Any]  # an object with decompress(data), eof and unused_data
    errors: tuple[type[BaseException], ...]  # what its decompressor raises on damaged data


def _zstd_decompressor() -> Any:
    try:
        import zstandard
    except ImportError as error:
        raise ImportError(f"reading zstd-compressed input needs the zstandard package: {INSTALL_HINT}") from error
    return zstandard.ZstdDecompressor().decompressobj()


def _zstd_errors() -> tuple[type[BaseException], ...]:
    try:
        import zstandard
    except ImportError:
        return ()
    return (zstandard.ZstdError,)


CODECS = (
    Codec("gzip", ".gz", b"\x1f\x8b", lambda: zlib.decompressobj(wbits=31), (zlib.error,)),
    Codec("zstd", ".zst", b"\x28\xb5\x2f\xfd", _zstd_decompressor, ()),
    Codec("bz2", ".bz2", b"BZh", bz2.BZ2Decompressor, (OSError, ValueError)),
    Codec("xz", ".xz", b"\xfd7zXZ\x00", lzma.LZMADecompressor, (lzma.LZMAError,)),
)


def codec_for_suffix(path: Path) -> Codec | None:
    """The codec the file's name promises (``corpus.jsonl.gz``: gzip), or None."""
    suffix = path.suffix.lower()
    return next((codec for codec in CODECS if codec.suffix == suffix), None)


def codec_for_data(head: bytes) -> Codec | None:
    """The codec whose magic bytes ``head`` (a file's first bytes) starts with, or None."""
    for codec in CODECS:
        if codec.name == "bz2":  # "BZh" is plain text too: also require the block size digit and block magic
            if head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:10] == b"1AY&SY":
                return codec
        elif head.startswith(codec.magic):
            return codec
    return None


def read_head(path: Path) -> bytes:
    """The first bytes of the file, enough to recognise any codec."""
    with open(path, "rb") as file:
        return file.read(MAGIC_LENGTH)


class DecompressingReader(io.RawIOBase):
    """The decompressed bytes of ``raw``; ``consumed`` is how many compressed bytes were read so far."""

    def __init__(self, raw: BinaryIO, codec: Codec, path: Path) -> None:
        super().__init__()
        self._raw, self._codec, self._path = raw, codec, path
        self._errors = codec.errors + (_zstd_errors() if codec.name == "zstd" else ())
        self._decompressor = codec.new_decompressor()
        self._in_stream = False  # the current stream has begun and not ended
        self._pending = b""
        self._offset = 0
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._offset >= len(self._pending):
            if not self._decompress_more():
                return 0
        count = min(len(buffer), len(self._pending) - self._offset)
        buffer[:count] = memoryview(self._pending)[self._offset : self._offset + count]
        self._offset += count
        return count

    def _decompress_more(self) -> bool:
        """Decompress the next chunk into ``_pending``; False at the end of the file."""
        data = self._raw.read(READ_CHUNK)
        if not data:
            if self._in_stream:
                raise TokenizeInputError(f"{self._path}: the {self._codec.name} data ends early (a truncated file?)")
            return False
        self.consumed += len(data)
        pieces = []
        while data:
            if not self._in_stream and self._codec.name == "gzip":
                data = data.lstrip(b"\0")  # zeros may pad a gzip file between and after its members
                if not data:
                    break
            try:
                pieces.append(self._decompressor.decompress(data))
            except self._errors as error:
                raise TokenizeInputError(f"{self._path}: damaged {self._codec.name} data ({error})") from None
            self._in_stream = not self._decompressor.eof
            if self._in_stream:
                break
            data = self._decompressor.unused_data  # the next stream, if the file holds several
            self._decompressor = self._codec.new_decompressor()
        self._pending, self._offset = b"".join(pieces), 0
        return True
