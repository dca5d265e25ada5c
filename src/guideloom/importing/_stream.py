"""The one record stream every source format offers: its inputs cut into pieces, and each piece's rows in order.

A source format is a module with two functions: ``describe(path, shard_size, options)`` (the fields its rows hold and
the pieces it is cut into, checked before anything is written) and ``rows(piece, start)`` (the piece's rows
from row ``start`` of its input on, each as ``(row, values, bytes read)``, where ``values`` is a dict of the
source's column values or a :class:`Skipped` saying why that row is left out). Rows are numbered from 0
within the input; a piece holds consecutive rows of one input.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from guideloom.importing._files import InputPath
from guideloom.importing._schema import Fields


@dataclass(frozen=True)
class Piece:
    """Consecutive rows of one input: ``first_row`` on, ``rows`` of them when known; ``size`` input bytes."""

    path: InputPath  #: the input, as provenance names it (a file or URL, or the folder of an MDS / LitData dataset)
    kind: str  #: its format: "parquet", "arrow", "jsonl", "webdataset", "mds", "litdata"
    first_row: int
    rows: int | None
    size: int
    detail: tuple[Any, ...] = ()  #: what the format needs to find the piece (row groups, a shard file)
    options: dict[str, Any] | None = field(default=None, compare=False)  #: fsspec's, for an input on an object store


@dataclass(frozen=True)
class Skipped:
    """A row left out, and why (a link in a tar, a member without a field type)."""

    reason: str


Row = tuple[int, "dict[str, Any] | Skipped", int]


@dataclass(frozen=True)
class Described:
    """An input checked: the fields its rows hold and its pieces, in row order."""

    fields: Fields
    pieces: list[Piece]


def numbered(rows: Iterator[Row], start: int) -> Iterator[Row]:
    """The rows from row ``start`` on (the earlier ones read and left out)."""
    for row in rows:
        if row[0] >= start:
            yield row
