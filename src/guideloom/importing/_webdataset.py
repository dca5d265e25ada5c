"""WebDataset tars: members grouped into samples by key, one field per extension, read as data only.

A member ``dir/abc.seg.png`` has key ``dir/abc`` (the name up to the first dot of its base name) and
extension ``seg.png``; consecutive members with one key make one sample, one row, whose fields are the
extensions (as WebDataset names them) and whose key is kept as ``__key__``. The last suffix decides the
field type: ``jpg``/``jpeg``/``png``/``webp`` -> ``Image``, ``flac``/``wav``/``mp3``/``ogg`` -> ``Audio``,
``mp4``/``webm`` -> ``Video``, ``txt`` -> ``Text``, ``json`` -> ``Json``, ``cls`` -> ``Scalar(int64)``.

The tar is read member by member (``_tar_members``: plain tars header by header, gzip, bz2 and xz tars as
a stream through ``tarfile``), never extracted, so nothing is written anywhere and no member is followed:

* symbolic and hard links, devices, FIFOs and other non-regular members are skipped, each counted in
  the summary's skipped rows with the reason (a link would point at data the tar does not hold);
* a member whose name is absolute or holds ``..`` is refused: the import stops with an error naming the
  tar and the member (a tar built to escape a folder is not a data set to trust);
* a member whose extension has no field type (``.npy``, ``.pyd``, ...) and one without an extension are
  skipped with the reason; pickles are never loaded;
* a truncated or damaged tar is an error naming the tar and the sample where it ends.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from guideloom.importing._errors import ImportInputError
from guideloom.importing._files import InputPath, open_binary, read_head, size_of
from guideloom.importing._schema import KEY_FIELD, Fields, FieldSpec, merge_fields
from guideloom.importing._stream import Described, Piece, Row, Skipped
from guideloom.importing._tar_members import END_OF_ARCHIVE, TarMembers

FIELD_KINDS = {
    "jpg": "image",
    "jpeg": "image",
    "png": "image",
    "webp": "image",
    "flac": "audio",
    "wav": "audio",
    "mp3": "audio",
    "ogg": "audio",
    "mp4": "video",
    "webm": "video",
    "txt": "text",
    "json": "json",
    "cls": "scalar",
}
INFER_SAMPLES = 256


def format_of_compression(path: InputPath, options: dict[str, Any] | None) -> bool:
    """Whether the tar is compressed (its decompressor then notices truncation itself)."""
    head = read_head(path, options, 6)
    return head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00"))


def _kind(extension: str) -> str | None:
    return FIELD_KINDS.get(extension.rsplit(".", 1)[-1].lower())


def _spec(extension: str) -> FieldSpec:
    kind = _kind(extension)
    assert kind is not None
    return FieldSpec(kind, "int64" if kind == "scalar" else None)


def _split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name, None without an extension."""
    if "//" in name or "/./" in name or name.startswith("./") or name.endswith(("/", "/.")):
        name = str(PurePosixPath(name))  # spelled unusually: as a path names it
    parent, _, base = name.rpartition("/")
    base, dot, extension = base.partition(".")
    if not dot or not base or not extension:
        return None
    return (f"{parent}/{base}" if parent else base), extension


def _value(path: InputPath, sample: int, extension: str, data: bytes) -> Any:
    kind = _kind(extension)
    try:
        if kind == "text":
            return data.decode("utf-8")
        if kind == "json":
            return json.loads(data)
        if kind == "scalar":
            return int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ImportInputError(f"{path}: row {sample}: member .{extension} is not a {kind} value ({error})") from None
    return data


def _samples(path: InputPath, options: dict[str, Any] | None, values: bool = True) -> Iterator[Row]:
    """``(sample index, fields, bytes read)`` in tar order; members left out come as :class:`Skipped` values, with
    the index of the sample they lie in. Without ``values`` the fields' values are None (their data is not read)."""
    key: str | None = None
    fields: dict[str, Any] = {}
    sample = 0
    compressed = format_of_compression(path, options)
    size = size_of(path, options)
    try:
        with open_binary(path, options) as raw, TarMembers(raw, compressed) as tar:
            for member in tar:
                name = member.name
                if name.startswith("/") or ".." in name.split("/"):
                    raise ImportInputError(
                        f"{path}: member {name!r} has an absolute name or one with '..'; such a tar is refused"
                    )
                if member.kind == "directory":
                    continue
                if member.kind != "file":
                    what = "links" if member.kind == "link" else "devices and other special files"
                    yield sample, Skipped(f"tar members that are {what}"), member.end
                    continue
                split = _split_name(name)
                if split is None or _kind(split[1]) is None:
                    what = "without an extension" if split is None else f"with extension .{split[1]} (no field type)"
                    yield sample, Skipped(f"tar members {what}"), member.end
                    continue
                member_key, extension = split
                if member_key != key:
                    if key is not None:
                        yield sample, fields, member.offset
                        sample += 1
                    key, fields = member_key, {KEY_FIELD: member_key}
                if extension in fields:
                    raise ImportInputError(f"{path}: row {sample}: key {key!r} holds .{extension} twice")
                fields[extension] = _value(path, sample, extension, tar.read(member)) if values else None
        if not compressed and size < tar.end + END_OF_ARCHIVE:
            raise EOFError("the tar ends without its end-of-archive blocks")
    except ImportInputError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as error:
        if isinstance(error, FileNotFoundError | PermissionError):
            raise
        raise ImportInputError(f"{path}: a truncated or damaged tar, at row {sample} ({error})") from None
    if key is not None:
        yield sample, fields, size


def describe(path: InputPath, shard_size: int, options: dict[str, Any] | None = None) -> Described:
    del shard_size
    fields: Fields = {KEY_FIELD: FieldSpec("text")}
    seen = 0
    for _, values, _ in _samples(path, options, values=False):  # the members' names say the fields
        if isinstance(values, Skipped):
            continue
        found: Fields = {KEY_FIELD: FieldSpec("text")}
        found.update({extension: _spec(extension) for extension in values if extension != KEY_FIELD})
        fields = found if seen == 0 else merge_fields(fields, found, str(path))
        seen += 1
        if seen >= INFER_SAMPLES:
            break
    return Described(fields, [Piece(path, "webdataset", 0, None, size_of(path, options), (), options)])


def rows(piece: Piece, fields: Any, start: int) -> Iterator[Row]:
    del fields
    for sample, values, position in _samples(piece.path, piece.options):
        if sample >= start:
            yield sample, values, min(piece.size, position)
