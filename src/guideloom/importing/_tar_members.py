"""A tar's members in order, read as data: a plain tar header by header, anything else through ``tarfile``.

``tarfile`` builds a ``TarInfo`` of some 20 fields from each header (about 50 us a member), which is most of
the time of importing small images. The headers WebDataset and most tools write are plain ustar ones,
512 bytes that say a name, a type and a size, so a plain tar is read here header by header: the checksum
checked, the data read with one call. At the first header this reader does not handle (pax and GNU
extension headers, sparse files, sizes in base-256) the tar is read again through ``tarfile`` from
the start, past the members already given. A compressed tar is read by ``tarfile`` as a stream throughout.

Unlike ``tarfile``, which ends a tar quietly at a damaged header after the first, a damaged header here is
an error: the rest of a data set is not dropped unnoticed.
"""

from __future__ import annotations

import struct
import tarfile
from collections.abc import Iterator
from typing import IO, NamedTuple

BLOCK = tarfile.BLOCKSIZE
END_OF_ARCHIVE = 2 * BLOCK  # two zero blocks end every tar (tarfile, GNU tar and bsdtar write them)
READ_BUFFER = 1 << 20  # bytes per read of a compressed tar's stream (tarfile reads 10 KiB at a time by default)
ZERO_BLOCK = bytes(BLOCK)
PLAIN_TYPES = {b"0": "file", b"\0": "file", b"7": "file", b"5": "directory", b"1": "link", b"2": "link"}
SPECIAL_TYPES = frozenset(b"346")  # character and block devices, FIFOs
SIGNED_CHECKSUM = struct.Struct("148b8x356b")


class TarMember(NamedTuple):
    """One member: its name as ``tarfile`` spells it, what it is (``file``, ``directory``, ``link``, ``special``),
    its data's size, and the offsets of its header and of what follows its data."""

    name: str
    kind: str
    size: int
    offset: int
    end: int
    info: tarfile.TarInfo | None = None  #: ``tarfile``'s member, where ``tarfile`` read it


class NotPlain(Exception):
    """A header that only ``tarfile`` reads."""


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes, offset: int) -> int:
    if field[0] & 0x80:
        raise NotPlain  # base-256: a size or time past what octal digits hold
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits or b"0", 8)
    except ValueError:
        raise tarfile.HeaderError(f"the header at byte {offset} holds a number that is not octal") from None


def _checked(header: bytes, offset: int) -> None:
    recorded = _number(header[148:156], offset)
    if 256 + sum(header[:148]) + sum(header[156:]) == recorded:
        return
    if 256 + sum(SIGNED_CHECKSUM.unpack_from(header)) != recorded:  # some old tars sum signed bytes
        raise tarfile.HeaderError(f"the header at byte {offset} does not match its checksum: damaged")


def _plain_member(header: bytes, offset: int) -> TarMember:
    """The member a plain ustar (or v7, or GNU without extensions) header describes; NotPlain for any other."""
    _checked(header, offset)
    flag = header[156:157]
    kind = PLAIN_TYPES.get(flag) or ("special" if flag and flag[0] in SPECIAL_TYPES else None)
    if kind is None:
        raise NotPlain
    name = _text(header[0:100])
    if flag == b"\0" and name.endswith("/"):
        kind = "directory"  # the old v7 way to write a folder
    if kind == "directory":
        name = name.rstrip("/")
    prefix = _text(header[345:500])
    if prefix:
        name = f"{prefix}/{name}"
    size = _number(header[124:136], offset) if kind == "file" else 0
    return TarMember(name, kind, size, offset, offset + BLOCK + _padded(size))


class TarMembers:
    """The members of the tar read from ``raw`` (``compressed``: gzip, bz2 or xz), in order, and their data."""

    def __init__(self, raw: IO[bytes], compressed: bool) -> None:
        self._raw = raw
        self._compressed = compressed
        self._tar: tarfile.TarFile | None = None
        self.end = 0  #: where the last header read ends: the end-of-archive blocks, once all are read

    def __iter__(self) -> Iterator[TarMember]:
        given = 0
        if not self._compressed:
            try:
                for member in self._plain():
                    yield member
                    given += 1
                return
            except NotPlain:
                self._raw.seek(0)
        yield from self._through_tarfile(given)

    def read(self, member: TarMember) -> bytes:
        """The member's data (a file's)."""
        if member.info is None:
            self._raw.seek(member.offset + BLOCK)
            data = self._raw.read(member.size)
        else:
            assert self._tar is not None
            extracted = self._tar.extractfile(member.info)
            assert extracted is not None
            data = extracted.read()
        if len(data) != member.size:
            raise EOFError(f"member {member.name!r} holds {len(data)} of its {member.size} bytes")
        return data

    def __enter__(self) -> TarMembers:
        return self

    def __exit__(self, *exception: object) -> None:
        if self._tar is not None:
            self._tar.close()

    def _plain(self) -> Iterator[TarMember]:
        raw, offset = self._raw, 0
        while True:
            raw.seek(offset)
            header = raw.read(BLOCK)
            if len(header) < BLOCK:
                self.end = offset
                raise EOFError("the tar ends without its end-of-archive blocks")
            if header == ZERO_BLOCK:
                self.end = offset
                return
            member = _plain_member(header, offset)
            yield member
            offset = member.end

    def _through_tarfile(self, given: int) -> Iterator[TarMember]:
        if self._compressed:
            self._tar = tarfile.open(fileobj=self._raw, mode="r|*", bufsize=READ_BUFFER)
        else:
            self._tar = tarfile.open(fileobj=self._raw, mode="r:")
        for number, info in enumerate(self._tar):
            self.end = self._tar.offset
            if number < given:
                continue
            if info.isfile():
                kind = "file"
            elif info.isdir():
                kind = "directory"
            else:
                kind = "link" if info.issym() or info.islnk() else "special"
            yield TarMember(info.name, kind, info.size, info.offset, self._tar.offset, info)
        self.end = self._tar.offset
