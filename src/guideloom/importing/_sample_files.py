"""What MDS shards and LitData chunks share: the same layout (LitData's chunks follow MDS's shards).

A file is ``uint32 count | uint32 offsets[count + 1] | samples``; a sample is the sizes of its parts, then
the parts' bytes in the order the index lists them. Both read a damaged file as an ImportInputError naming
the row, and decide the fields an encoding leaves open (``bytes``, an array of no stated dtype) from the
first sample's values. :class:`Words` keeps each format's own names in messages.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from guideloom.importing._arrow_columns import sniff_media
from guideloom.importing._errors import ImportInputError
from guideloom.importing._schema import FieldSpec
from guideloom.importing._stream import Piece, Row


@dataclass(frozen=True)
class Words:
    """How a format names its parts in messages."""

    sample: str  #: "item", "sample"
    file: str  #: "chunk", "shard"
    parts: str  #: "leaves", "columns"
    damaged: str  #: "a damaged LitData chunk"


def samples(data: bytes, words: Words) -> Iterator[bytes]:
    """Each sample's bytes, in order; ValueError when the offsets table does not fit ``data``."""
    count = int(np.frombuffer(data, np.uint32, 1)[0])
    offsets = np.frombuffer(data, np.uint32, count + 1, 4).tolist()
    if offsets[-1] > len(data) or any(b < a for a, b in itertools.pairwise(offsets)):
        raise ValueError(f"the {words.sample} offsets run past the {words.file}'s {len(data)} bytes")
    for begin, end in itertools.pairwise(offsets):
        yield data[begin:end]


def record(
    sample: bytes,
    position: int,
    parts: Iterable[tuple[str, str, int]],
    decode: Callable[[str, bytes], Any],
    words: Words,
) -> dict[str, Any]:
    """The record of ``parts`` (name, encoding, size), read from ``position`` on; ValueError unless they fill
    the sample exactly."""
    values = {}
    for name, encoding, size in parts:
        values[name] = decode(encoding, sample[position : position + size])
        position += size
    if position != len(sample):
        article = "an" if words.sample[0] in "aeiou" else "a"
        raise ValueError(f"{article} {words.sample} of {len(sample)} bytes whose {words.parts} hold {position}")
    return values


def guarded(path: Path, records: Iterator[dict[str, Any]], first_row: int, words: Words) -> Iterator[dict[str, Any]]:
    """``records``, where a damaged file is an ImportInputError naming ``path`` and the row."""
    row = first_row
    try:
        for values in records:
            yield values
            row += 1
    except (ImportInputError, ImportError, FileNotFoundError, PermissionError):
        raise
    except Exception as error:
        raise ImportInputError(f"{path}: {words.damaged}, at row {row} ({error})") from None


def field_of_value(value: Any) -> FieldSpec | None:
    """The field a first value shows: media for bytes that start as a media file does, tokens (one dimension of
    integers) or an array for an ndarray; None when it shows nothing more than its encoding."""
    if isinstance(value, bytes):
        media = sniff_media(value)
        return None if media is None else FieldSpec(media)
    if isinstance(value, np.ndarray):
        return FieldSpec("tokens" if value.ndim == 1 and value.dtype.kind in "iu" else "array", value.dtype.name)
    return None


def piece_rows(piece: Piece, records: Iterator[dict[str, Any]], start: int) -> Iterator[Row]:
    """The piece's rows from ``start`` on, with the bytes read so far (estimated by rows)."""
    rows_in = max(1, piece.rows or 1)
    for offset, values in enumerate(records):
        row = piece.first_row + offset
        if row >= start:
            yield row, values, piece.size * (offset + 1) // rows_in
