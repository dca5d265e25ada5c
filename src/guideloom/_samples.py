"""Sample sources: what one global sample index means for each kind of storage.

A source is picklable and opens its pinned snapshot of shards lazily in each
process that uses it, so worker processes read exactly the shards the loader
saw when it was created, whatever is committed meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from guideloom._reader import DocumentReader, TokenReader, _Reader
from guideloom._storage import DocumentStorage, TokenStorage


class SampleSource:
    """Fetches and collates the samples of one batch, given their global indices."""

    def __init__(self, storage: DocumentStorage[Any, Any] | TokenStorage, shard_ids: list[int]) -> None:
        self.storage = storage
        self.shard_ids = shard_ids
        self._reader: _Reader[Any] | None = None
        self._reader_pid = -1

    @property
    def reader(self) -> _Reader[Any]:
        # A forked worker keeps using the mappings it inherited: they stay valid even if a shard file
        # is deleted meanwhile. A spawned one gets no reader (see __getstate__) and opens the shards.
        if self._reader is None:
            self._reader = self.storage._open_reader(self.shard_ids)
            self._reader_pid = os.getpid()
        return self._reader

    @property
    def sample_count(self) -> int:
        raise NotImplementedError

    def fetch(self, indices: np.ndarray) -> Any:
        """The samples at ``indices`` in the form ``collate`` receives."""
        raise NotImplementedError

    def default_collate(self, samples: Any) -> Any:
        raise NotImplementedError

    def prefetch(self, indices: np.ndarray, epoch: int = 0) -> None:
        """A hint: these samples are fetched soon, in order (a remote storage downloads their shards)."""

    def close(self) -> None:
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.close()
        self._reader = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None, "_reader_pid": -1}


class DocumentSource(SampleSource):
    """One decoded record per sample; the default collate keeps the list as it is."""

    @property
    def sample_count(self) -> int:
        return len(self.reader)

    def fetch(self, indices: np.ndarray) -> list[Any]:
        reader = self.reader
        assert isinstance(reader, DocumentReader)
        return reader.read_many(indices)

    def default_collate(self, samples: list[Any]) -> list[Any]:
        return samples

    def prefetch(self, indices: np.ndarray, epoch: int = 0) -> None:
        self.reader.prefetch_records(np.asarray(indices, np.int64))


class TokenWindowSource(SampleSource):
    """Sample ``k`` is ``stream[k*S:(k+1)*S]``; samples arrive stacked as an ``(n, S)`` array (int64 or int32)."""

    def __init__(
        self, storage: TokenStorage, shard_ids: list[int], sequence_length: int, window_dtype: np.dtype[Any]
    ) -> None:
        super().__init__(storage, shard_ids)
        self.sequence_length = sequence_length
        self.window_dtype = window_dtype
        # Stored ids this dtype cannot hold all wrap to negative values (uint64 -> int64, uint32 -> int32).
        self._check_sign = storage.dtype.kind == "u" and storage.dtype.itemsize == window_dtype.itemsize

    @property
    def sample_count(self) -> int:
        reader = self.reader
        assert isinstance(reader, TokenReader)
        return reader.window_count(self.sequence_length)

    def fetch(self, indices: np.ndarray) -> np.ndarray:
        reader = self.reader
        assert isinstance(reader, TokenReader)
        length = self.sequence_length
        windows = np.empty((len(indices), length), self.window_dtype)
        starts = np.asarray(indices, np.int64) * length
        positions = np.searchsorted(reader.token_starts, starts, side="right") - 1
        offsets = (starts - reader.token_starts[positions]).tolist()
        token_arrays = reader._tokens
        for row, (position, offset) in enumerate(zip(positions.tolist(), offsets, strict=True)):
            tokens = token_arrays[position]
            if tokens is None:
                tokens = reader.tokens(position)
            if offset + length <= len(tokens):
                windows[row] = tokens[offset : offset + length]
            else:  # the window crosses into the next shard(s)
                start = int(starts[row])
                reader.read_tokens(start, start + length, out=windows[row])
        if self._check_sign and bool((windows < 0).any()):
            raise ValueError(
                f"the storage at {reader.location} holds {reader.dtype} token ids of "
                f"2**{8 * self.window_dtype.itemsize - 1} or more, which do not fit the loader's "
                f"{self.window_dtype} batches"
            )
        return windows

    def default_collate(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(samples)

    def prefetch(self, indices: np.ndarray, epoch: int = 0) -> None:
        reader = self.reader
        assert isinstance(reader, TokenReader)
        reader.prefetch_tokens(np.asarray(indices, np.int64) * self.sequence_length)


def make_source(
    storage: object, sequence_length: int | None, window_dtype: torch.dtype | None = None
) -> DocumentSource | TokenWindowSource:
    """The source for the shards of ``storage`` committed now, checking the arguments fit its kind."""
    if not isinstance(storage, DocumentStorage | TokenStorage):
        raise TypeError(f"storage must be a DocumentStorage or TokenStorage, got {type(storage).__name__}")
    if window_dtype is not None and not isinstance(storage, TokenStorage):
        raise ValueError("window_dtype must be omitted for a DocumentStorage: it applies to token windows")
    if window_dtype not in (None, torch.int64, torch.int32):
        raise ValueError(f"window_dtype must be torch.int64 or torch.int32, got {window_dtype!r}")
    if isinstance(storage, TokenStorage):
        if sequence_length is None:
            raise ValueError("sequence_length is required for a TokenStorage (use T + 1 for next-token targets)")
        if isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 1:
            raise ValueError(f"sequence_length must be a positive int, got {sequence_length!r}")
    elif sequence_length is not None:
        raise ValueError("sequence_length must be omitted for a DocumentStorage: each record is one sample")
    storage._header_for_reading()  # a missing storage is StorageNotFoundError here, not at the first batch
    shard_ids = storage.committed_shard_ids()
    if isinstance(storage, TokenStorage):
        assert sequence_length is not None
        window_numpy_dtype = np.dtype(np.int32 if window_dtype == torch.int32 else np.int64)
        if window_numpy_dtype == np.int32 and storage.dtype.itemsize == 8:
            raise ValueError(f"window_dtype=torch.int32 cannot hold the {storage.dtype} ids of {storage.location}")
        return TokenWindowSource(storage, shard_ids, sequence_length, window_numpy_dtype)
    return DocumentSource(storage, shard_ids)


class Batcher:
    """Turns a batch's global indices into the collated batch; what worker processes run."""

    def __init__(self, source: SampleSource, collate: Callable[[Any], Any] | None) -> None:
        self.source = source
        self.collate = collate

    @property
    def builds_groups(self) -> bool:
        """Whether ``many`` fetches several batches in one go: token windows with the default collate.

        Only then, since no user code runs: building a group again one batch at a time is harmless.
        """
        return self.collate is None and isinstance(self.source, TokenWindowSource)

    def many(self, index_batches: list[np.ndarray]) -> list[Any]:
        """The batches of several index arrays, in order; token windows are fetched in one go.

        Batches of token windows are then views into one array (it is freed when all are).
        """
        if self.builds_groups and len(index_batches) > 1:
            windows = torch.from_numpy(self.source.fetch(np.concatenate(index_batches)))
            return list(torch.split(windows, [len(indices) for indices in index_batches]))
        return [self(indices) for indices in index_batches]

    def __call__(self, indices: Sequence[int] | np.ndarray) -> Any:
        samples = self.source.fetch(np.asarray(indices, np.int64))
        if self.collate is None:
            return self.source.default_collate(samples)
        if isinstance(samples, np.ndarray):
            samples = list(samples)
        return self.collate(samples)
