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
        # The joined stream's shard j is shard owner_shards[j] of reader owner_readers[j].
        self.owner_readers = np.repeat(np.arange(len(readers)), [len(reader.infos) for reader in readers])
        self.owner_shards = np.concatenate(
            [np.arange(len(reader.infos), dtype=np.int64) for reader in readers] or [np.empty(0, np.int64)]
        )

    def read(self, components: npt.NDArray[np.int64], samples: npt.NDArray[np.int64], out: np.ndarray) -> None:
        """Window ``samples[i]`` of reader ``components[i]`` into row ``i`` of ``out`` (ids cast to its dtype)."""
        for reader in self.readers:
            reader.check_open()
        length = self.sequence_length
        starts = self.bases[components] + samples * length
        positions = np.searchsorted(self.shard_starts, starts, side="right") - 1
        offsets = (starts - self.shard_starts[positions]).tolist()
        readers = self.readers
        owners = zip(self.owner_readers[positions].tolist(), self.owner_shards[positions].tolist(), strict=True)
        for row, ((k, local), offset) in enumerate(zip(owners, offsets, strict=True)):
            reader = readers[k]
            tokens = reader.shard_tokens(local)
            if offset + length <= len(tokens):
                out[row] = tokens[offset : offset + length]
            else:  # the window crosses into its reader's next shard(s)
                start = int(reader.token_starts[local]) + offset
                reader.read_tokens(start, start + length, out=out[row])
