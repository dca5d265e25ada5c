"""Token windows of several readers' streams read in one pass, as a mixture of plain windows needs.

The streams are laid end to end: window ``s`` of reader ``k`` starts at ``base[k] + s·S`` of the joined
stream, so a batch's windows, whatever their readers, are located by one search and copied by one loop,
each into its own row (no per-reader calls, no sorting by reader, no second copy to interleave them).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from guideloom._shards.reader import TokenReader

__all__ = ["MixedWindows"]


class MixedWindows:
    """The windows of ``readers``' token streams, each window within one reader's stream."""

    def __init__(self, readers: list[TokenReader], sequence_length: int) -> None:
        self.readers = readers
        self.sequence_length = sequence_length
        counts = np.array([reader.token_count for reader in readers], np.int64)
        self.bases = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        starts = [reader.token_starts[:-1] + base for reader, base in zip(readers, self.bases.tolist(), strict=True)]
        self.shard_starts = np.concatenate([*starts, [int(counts.sum())]]).astype(np.int64)
        self.owners = [(k, position) for k, reader in enumerate(readers) for position in range(len(reader.infos))]
        # Local shards stay mapped for the readers' whole life: their token views can be kept here.
        self._keeps = all(reader.shard_set.max_open is None for reader in readers)
        self._tokens: list[np.ndarray | None] = [None] * len(self.owners)

    def read(self, components: npt.NDArray[np.int64], samples: npt.NDArray[np.int64], out: np.ndarray) -> None:
        """Window ``samples[i]`` of reader ``components[i]`` into row ``i`` of ``out`` (ids cast to its dtype)."""
        for reader in self.readers:
            reader.check_open()
        length = self.sequence_length
        starts = self.bases[components] + samples * length
        positions = np.searchsorted(self.shard_starts, starts, side="right") - 1
        offsets = (starts - self.shard_starts[positions]).tolist()
        token_arrays = self._tokens
        for row, (position, offset) in enumerate(zip(positions.tolist(), offsets, strict=True)):
            tokens = token_arrays[position]
            if tokens is None:
                tokens = self._shard_tokens(position)
            if offset + length <= len(tokens):
                out[row] = tokens[offset : offset + length]
            else:  # the window crosses into its reader's next shard(s)
                k, local = self.owners[position]
                reader = self.readers[k]
                start = int(reader.token_starts[local]) + offset
                reader.read_tokens(start, start + length, out=out[row])

    def _shard_tokens(self, position: int) -> np.ndarray:
        k, local = self.owners[position]
        tokens = self.readers[k].shard_tokens(local)
        if self._keeps:
            self._tokens[position] = tokens
        return tokens
