"""Parts of shards: what a machine reads of a shard its share shares (`PlannedPart`), an epoch's `ReadPlan` of
them, and `ShardPart`, the type a reader opens for a part's byte range.

A windowed epoch cuts the shards into equal machine shares, so a share begins and ends inside a shard, and a
machine needs only its part of such a boundary shard. The loader's process computes the epoch's plan once and
sends it with the work (to its worker processes too); a remote shard set downloads the planned parts (see
``_remote.shard_parts``) and opens each as a `ShardPart`, which holds only the data bytes of the whole
checkpoint pieces that cover the part. A reader asks a shard whether it `covers` what it reads, and opens the
whole shard where it does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardFile

__all__ = ["PlannedPart", "ReadPlan", "ShardPart"]


@dataclass(frozen=True)
class PlannedPart:
    """What a machine reads of a shard: elements (tokens, or bytes of records) or whole records ``first ..
    stop - 1``, counted within the shard."""

    first: int
    stop: int
    in_records: bool

    def joined(self, other: PlannedPart) -> PlannedPart:
        """The part that holds this one and ``other`` (counted alike)."""
        return PlannedPart(min(self.first, other.first), max(self.stop, other.stop), self.in_records)

    def data_range(self, offsets: np.ndarray, header: StorageHeader, data_size: int) -> tuple[int, int]:
        """The data bytes that hold this part: the whole checkpoint pieces that cover it (``low .. high - 1``),
        given the shard's record ``offsets`` (in elements) and its data size."""
        checkpoint_bytes = header.checkpoint_bytes
        assert checkpoint_bytes is not None
        if self.in_records:
            last = len(offsets) - 1
            low, high = int(offsets[min(self.first, last)]), int(offsets[min(self.stop, last)])
        else:
            elements = data_size // header.element_size
            low, high = min(self.first, elements), min(self.stop, elements)
        low, high = low * header.element_size, high * header.element_size
        if low >= high:
            return 0, 0
        pieces_high = -(-high // checkpoint_bytes) * checkpoint_bytes
        return low // checkpoint_bytes * checkpoint_bytes, min(pieces_high, data_size)


@dataclass(frozen=True)
class ReadPlan:
    """What a machine reads in parts this epoch: the planned part of each boundary shard, by the shard's position
    in the snapshot (the others are read whole). A small value: the loader makes it once an epoch segment and
    sends it with every batch's work."""

    parts: tuple[tuple[int, PlannedPart], ...] = ()
    _by_position: dict[int, PlannedPart] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_position.update(self.parts)

    @classmethod
    def of(cls, parts: Mapping[int, PlannedPart]) -> ReadPlan:
        return cls(tuple(sorted(parts.items())))

    def part(self, position: int) -> PlannedPart | None:
        """The planned part of the shard at ``position``, or None: it is read whole."""
        return self._by_position.get(position)

    def __iter__(self) -> Iterator[tuple[int, PlannedPart]]:
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)


NO_PARTS = ReadPlan()


def joined_parts(parts: Iterable[Mapping[int, PlannedPart]]) -> dict[int, PlannedPart]:
    """The parts of several ranges of samples, joined shard by shard."""
    joined: dict[int, PlannedPart] = {}
    for some in parts:
        for position, part in some.items():
            known = joined.get(position)
            joined[position] = part if known is None else known.joined(part)
    return joined


class ShardPart(ShardFile):
    """A part of a shard, downloaded alone: mapped as the whole shard is (a sparse file as large as it), holding
    only the data bytes of the pieces that cover its `PlannedPart`, and the shard's whole tail."""

    def __init__(self, path: Path, shard: int, header: StorageHeader, part: PlannedPart) -> None:
        super().__init__(path.parent, shard, header, file=path)
        self.part = part
        low, high = part.data_range(self.offsets, header, self.data_size)
        self.held = (low // self.element_size, high // self.element_size)
