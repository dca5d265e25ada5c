"""Sources over a token storage: what they share (`TokenSource`), and plain token windows (`TokenWindowSource`).

Every such source reads windows of ``S`` tokens of the storage's stream (or rows of ``S`` tokens) as
int64 or int32; each window mode's source says what a sample holds besides, and how samples are batched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch

from guideloom._core.checks import check_sequence_length
from guideloom._shards.parts import PlannedPart
from guideloom._shards.reader import TokenReader
from guideloom._shards.shard_table import ShardTable
from guideloom._sources.describe import SamplePieces, window_keys, window_pieces
from guideloom._sources.source import PinnedShards, spans_in_shards
from guideloom._storage.storages import TokenStorage

SamplesT = TypeVar("SamplesT")  # what ``fetch`` returns: the samples ``default_collate`` batches


class CutSettings(Protocol):
    """What a token source keeps of the window mode that made it (``_sources.window_modes``): its settings, which
    the source's identity records."""

    def recorded(self) -> dict[str, Any]:
        """What a state records of the mode's settings, besides the source's kind (JSON values)."""
        ...


class TokenSource(PinnedShards[TokenReader], Generic[SamplesT], ABC):
    """Sample ``k`` starts at ``stream[k*S]`` (a packed source overrides where); the mode's settings are recorded."""

    def __init__(
        self,
        storage: TokenStorage,
        snapshot: ShardTable,
        sequence_length: int,
        window_dtype: np.dtype[Any],
        mode: CutSettings,
    ) -> None:
        super().__init__(storage, snapshot)
        self.mode = mode  # the window mode that made this source: its settings are part of the identity
        self.sequence_length = check_sequence_length(sequence_length)
        self.window_dtype = window_dtype
        # Stored ids this dtype cannot hold all wrap to negative values (uint64 -> int64, uint32 -> int32).
        self.ids_need_sign_check = storage.dtype.kind == "u" and storage.dtype.itemsize == window_dtype.itemsize

    @abstractmethod
    def fetch(self, indices: np.ndarray, epoch: int) -> SamplesT: ...

    @abstractmethod
    def default_collate(self, samples: SamplesT) -> Any: ...

    @abstractmethod
    def split_collated(self, batch: Any, sizes: list[int]) -> list[Any]: ...

    @property
    def sample_count(self) -> int:
        return self.reader.window_count(self.sequence_length)

    @property
    def sample_bytes(self) -> int:
        return self.sequence_length * self.window_dtype.itemsize

    def shard_sample_counts(self) -> np.ndarray:
        """Windows that start in each shard, in storage order (what a windowed order walks), from the snapshot."""
        token_ends = np.cumsum(self.snapshot.rows["element_count"].astype(np.int64))
        window_ends = np.minimum(-(-token_ends // self.sequence_length), self.sample_count)
        return np.diff(window_ends, prepend=0)

    def sample_parts(self, first: int, stop: int) -> dict[int, PlannedPart]:
        """The tokens that windows ``first .. stop - 1`` read of each shard: a window is ``sequence_length`` tokens of
        the stream, and may run on into the next shard."""
        sizes = self.snapshot.rows["element_count"].astype(np.int64)
        return spans_in_shards(sizes, first * self.sequence_length, stop * self.sequence_length, in_records=False)

    def clean_cuts(self) -> np.ndarray | None:
        """The shards that no window of the shard before runs into (0 among them): a windowed order walks shards
        in storage order from one of these, so that a window and the shard it runs into are read together."""
        sizes = self.snapshot.rows["element_count"].astype(np.int64)
        token_starts = np.cumsum(sizes) - sizes
        return np.flatnonzero(token_starts % self.sequence_length == 0).astype(np.int64)

    def read_windows(self, indices: np.ndarray) -> np.ndarray:
        """Windows ``stream[k*S:(k+1)*S]`` for ``k`` in ``indices``, as an ``(n, S)`` array of the window dtype."""
        windows = np.empty((len(indices), self.sequence_length), self.window_dtype)
        self.reader.read_windows(indices, self.sequence_length, out=windows)
        self.check_ids(windows)
        return windows

    def check_ids(self, windows: np.ndarray) -> None:
        """Refuse windows holding ids the window dtype cannot hold (they were cast to negative values)."""
        if self.ids_need_sign_check and bool((windows < 0).any()):
            raise ValueError(
                f"the storage at {self.reader.location} holds {self.reader.dtype} token ids of "
                f"2**{8 * self.window_dtype.itemsize - 1} or more, which do not fit the loader's "
                f"{self.window_dtype} batches"
            )

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        return window_pieces(self.reader, np.asarray(indices, np.int64) * self.sequence_length, self.sequence_length)

    def sample_keys(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        return window_keys(self.reader, np.asarray(indices, np.int64) * self.sequence_length)

    def identity(self, *, digest: bool = True) -> dict[str, Any]:
        return {**super().identity(digest=digest), "sequence_length": self.sequence_length, **self.mode.recorded()}

    def prefetch(self, indices: np.ndarray, epoch: int) -> None:
        """Shards of a remote storage that these windows start in are downloaded in the background."""
        self.reader.prefetch_tokens(np.asarray(indices, np.int64) * self.sequence_length)


class TokenWindowSource(TokenSource[np.ndarray]):
    """Sample ``k`` is ``stream[k*S:(k+1)*S]``; samples arrive stacked as an ``(n, S)`` array (int64 or int32)."""

    kind = "token windows"

    def fetch(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        return self.read_windows(indices)

    def default_collate(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(samples)

    def split_collated(self, batch: torch.Tensor, sizes: list[int]) -> list[Any]:
        return list(torch.split(batch, sizes))
