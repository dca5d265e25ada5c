"""Sample sources: what the loader reads, one sample index at a time, whatever the storage behind it.

The loader consumes any :class:`SampleSource`; today's are :class:`DocumentSource` (one decoded
record per sample) and :class:`TokenWindowSource` (fixed windows cut from a token stream). A source
is picklable and opens its pinned snapshot of shards lazily in each process that uses it, so worker
processes read exactly the shards the loader saw when it was created, whatever is committed meanwhile.
"""

from __future__ import annotations

import copy
import os
from itertools import pairwise
from typing import Any, Generic, Protocol, Self, TypeVar

import numpy as np
import torch

from guideloom._checks import check_sequence_length
from guideloom._errors import StateMismatchError
from guideloom._growth import ShardDigest, describe_shards, over_recorded_shards
from guideloom._mixture import Mixture
from guideloom._reader import DocumentReader, StorageReader, TokenReader
from guideloom._storage import DocumentStorage, TokenStorage

ReaderT = TypeVar("ReaderT", bound=StorageReader[Any])
ReaderT_co = TypeVar("ReaderT_co", bound=StorageReader[Any], covariant=True)


class SampleSource(Protocol):
    """What the loader needs of a source of samples (see ``docs/architecture.md``)."""

    @property
    def sample_count(self) -> int:
        """Samples in one epoch of this source (the length of the epoch order)."""
        ...

    @property
    def orders_itself(self) -> bool:
        """False: the loader passes sample indices permuted by its EpochOrder; True: epoch positions unpermuted."""
        ...

    @property
    def sample_bytes(self) -> int:
        """> 0 when fetching many samples is a plain copy of this many bytes each (the loader then builds groups)."""
        ...

    def fetch(self, indices: np.ndarray, epoch: int) -> Any:
        """The samples at these int64 indices (or positions) of epoch ``epoch``, in the form ``collate`` receives."""
        ...

    def default_collate(self, samples: Any) -> Any:
        """The batch when the user gives no ``collate``."""
        ...

    def split_collated(self, batch: Any, sizes: list[int]) -> list[Any]:
        """A batch built from several batches' samples, cut back into those batches."""
        ...

    def identity(self) -> dict[str, Any]:
        """Small and JSON-serialisable: what a loader state records about this source."""
        ...

    def resumed(
        self, recorded: dict[str, Any], *, epoch: int | None = None, position: int | None = None
    ) -> SampleSource:
        """The source serving the rest of a state's epoch, given the identity it recorded; else StateMismatchError.

        ``epoch`` and ``position`` say where the state continues (a mixture's schedule may change from there).
        """
        ...

    def prefetch(self, indices: np.ndarray, epoch: int) -> None:
        """A hint: samples the loader will fetch soon, in order."""
        ...

    def close(self) -> None: ...


class _OpensReaders(Protocol[ReaderT_co]):
    @property
    def location(self) -> str: ...

    def open_reader(self, shard_ids: list[int] | None = None) -> ReaderT_co: ...


class PinnedShards(Generic[ReaderT]):
    """The shards of a storage committed when a loader was made, opened lazily in each process."""

    kind = ""

    def __init__(self, storage: _OpensReaders[ReaderT], shard_ids: list[int]) -> None:
        self.storage = storage
        self.shard_ids = shard_ids
        self._reader: ReaderT | None = None
        self._reader_pid = -1
        self._identity: dict[str, Any] | None = None  # the snapshot never changes: computed once

    @property
    def reader(self) -> ReaderT:
        # A forked worker keeps using the mappings it inherited: they stay valid even if a shard file
        # is deleted meanwhile. A spawned one gets no reader (see __getstate__) and opens the shards.
        if self._reader is None:
            self._reader = self.storage.open_reader(self.shard_ids)
            self._reader_pid = os.getpid()
        return self._reader

    @property
    def orders_itself(self) -> bool:
        return False

    def identity(self) -> dict[str, Any]:
        if self._identity is None:
            self._identity = {
                "kind": self.kind,
                "path": self.storage.location,
                "shards": describe_shards(self.shard_ids),
                "fingerprint": self.reader.fingerprint,  # shard ids, record counts and checksums
                "digest": ShardDigest.of(self.shard_entries()).to_text(),  # names a shard rewritten since
            }
        return dict(self._identity)

    def shard_entries(self) -> list[tuple[int, int, int]]:
        """``(id, record count, checksum)`` of each shard: what a state's shard digest is made of."""
        return [(shard.id, shard.record_count, shard.data_crc) for shard in self.reader.shards]

    def with_shards(self, shard_ids: list[int]) -> Self:
        """This source over other shards of its storage (those a state recorded); opens nothing yet.

        A subclass that caches what it derives from its shards must drop those caches here.
        """
        clone = copy.copy(self)
        clone.__dict__.update(self.__getstate__())
        clone.shard_ids, clone._identity = list(shard_ids), None
        return clone

    def resumed(self, recorded: dict[str, Any], *, epoch: int | None = None, position: int | None = None) -> Self:
        """The source for the rest of the state's epoch: ``self``, or this storage over the shards the state read
        if shards were added since; StateMismatchError saying what differs otherwise (a missing or changed shard
        is named)."""
        mine = self.identity()
        if not isinstance(recorded, dict):
            raise StateMismatchError(f"the state's source must be a dict, got {type(recorded).__name__}")
        if "kind" not in recorded:
            raise StateMismatchError("the state's source records no 'kind': it is not from state_dict()")
        if recorded.get("kind") != mine["kind"]:
            raise StateMismatchError(f"the state was taken from {recorded.get('kind')!r}, this loader reads {self}")
        for key, value in mine.items():
            if key not in ("path", "shards", "fingerprint", "digest") and recorded.get(key) != value:
                raise StateMismatchError(
                    f"the state was taken with {key}={recorded.get(key)!r}, but this loader has {key}={value!r}"
                )
        if recorded.get("fingerprint") == mine["fingerprint"]:
            return self
        then: Self = over_recorded_shards(self, recorded)
        return then

    def difference(self, recorded: dict[str, Any]) -> str:
        """In words, how the shards a state recorded differ from these (the same ids, with other contents)."""
        return (
            f"it read shards {recorded.get('shards')} of the storage at {recorded.get('path')}, and shards "
            f"{describe_shards(self.shard_ids)} of the storage at {self.storage.location} hold other contents "
            "(rewritten, or another storage)"
        )

    def prefetch(self, indices: np.ndarray, epoch: int) -> None:
        """Shards of a remote storage that these records need are downloaded in the background (local: nothing)."""
        self.reader.prefetch_records(indices)

    def close(self) -> None:
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.close()
        self._reader = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None, "_reader_pid": -1}

    def __repr__(self) -> str:
        return f"{self.kind} of shards {describe_shards(self.shard_ids)} of the storage at {self.storage.location}"


class DocumentSource(PinnedShards[DocumentReader[Any]]):
    """One decoded record per sample; the default collate keeps the list as it is."""

    kind = "documents"

    @property
    def sample_count(self) -> int:
        return len(self.reader)

    @property
    def sample_bytes(self) -> int:
        return 0

    def fetch(self, indices: np.ndarray, epoch: int) -> list[Any]:
        return self.reader.read_many(indices)

    def default_collate(self, samples: list[Any]) -> list[Any]:
        return samples

    def split_collated(self, batch: list[Any], sizes: list[int]) -> list[Any]:
        starts = np.cumsum([0, *sizes]).tolist()
        return [batch[start:stop] for start, stop in pairwise(starts)]


class TokenWindowSource(PinnedShards[TokenReader]):
    """Sample ``k`` is ``stream[k*S:(k+1)*S]``; samples arrive stacked as an ``(n, S)`` array (int64 or int32)."""

    kind = "token windows"

    def __init__(
        self, storage: TokenStorage, shard_ids: list[int], sequence_length: int, window_dtype: np.dtype[Any]
    ) -> None:
        super().__init__(storage, shard_ids)
        self.sequence_length = check_sequence_length(sequence_length)
        self.window_dtype = window_dtype
        # Stored ids this dtype cannot hold all wrap to negative values (uint64 -> int64, uint32 -> int32).
        self._check_sign = storage.dtype.kind == "u" and storage.dtype.itemsize == window_dtype.itemsize

    @property
    def sample_count(self) -> int:
        return self.reader.window_count(self.sequence_length)

    @property
    def sample_bytes(self) -> int:
        return self.sequence_length * self.window_dtype.itemsize

    def fetch(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        reader = self.reader
        windows = np.empty((len(indices), self.sequence_length), self.window_dtype)
        reader.read_windows(indices, self.sequence_length, out=windows)
        self.check_ids(windows)
        return windows

    def check_ids(self, windows: np.ndarray) -> None:
        """Refuse windows holding ids the window dtype cannot hold (they were cast to negative values)."""
        if self._check_sign and bool((windows < 0).any()):
            raise ValueError(
                f"the storage at {self.reader.location} holds {self.reader.dtype} token ids of "
                f"2**{8 * self.window_dtype.itemsize - 1} or more, which do not fit the loader's "
                f"{self.window_dtype} batches"
            )

    def default_collate(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(samples)

    def split_collated(self, batch: torch.Tensor, sizes: list[int]) -> list[Any]:
        return list(torch.split(batch, sizes))

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "sequence_length": self.sequence_length}

    def prefetch(self, indices: np.ndarray, epoch: int) -> None:
        """Shards of a remote storage that these windows start in are downloaded in the background."""
        self.reader.prefetch_tokens(np.asarray(indices, np.int64) * self.sequence_length)


def make_source(
    storage: object,
    *,
    sequence_length: int | None,
    window_dtype: torch.dtype | None = None,
    document_boundaries: bool = False,
    pack_documents: bool = False,
    pad_id: int = 0,
    shuffle: bool = False,
    seed: int = 0,
    component: str | None = None,
) -> SampleSource:
    """The source for the shards of ``storage`` committed now, checking the arguments fit its kind.

    ``document_boundaries`` / ``pack_documents`` (with ``pad_id``) choose a document-aware window mode.
    A `Mixture` gets one source per component, made here as for that storage alone, blended in its order
    (``shuffle`` and ``seed`` key the components' passes and the blocks' slot order); ``component`` names
    such a component in the error of a storage with no sample.
    """
    from guideloom._document_sources import check_window_modes, window_source  # they build on this module
    from guideloom._mixture_source import MixtureSource  # as does this one

    if isinstance(storage, Mixture):
        parts = [
            make_source(
                member,
                sequence_length=sequence_length,
                window_dtype=window_dtype,
                document_boundaries=document_boundaries,
                pack_documents=pack_documents,
                pad_id=pad_id,
                component=name,
            )
            for name, member in storage.components.items()
        ]
        return MixtureSource(storage, parts, shuffle=shuffle, seed=seed)
    if not isinstance(storage, DocumentStorage | TokenStorage):  # before the arguments that depend on its kind
        raise TypeError(f"storage must be a DocumentStorage, TokenStorage or Mixture, got {type(storage).__name__}")
    check_window_modes(storage, document_boundaries, pack_documents, pad_id)
    if window_dtype is not None and not isinstance(storage, TokenStorage):
        raise ValueError("window_dtype must be omitted for a DocumentStorage: it applies to token windows")
    if window_dtype is not None and not isinstance(window_dtype, torch.dtype):
        raise TypeError(f"window_dtype must be torch.int64 or torch.int32, got {type(window_dtype).__name__}")
    if window_dtype not in (None, torch.int64, torch.int32):
        raise ValueError(f"window_dtype must be torch.int64 or torch.int32, got {window_dtype!r}")
    if isinstance(storage, TokenStorage) and sequence_length is None:
        raise ValueError("sequence_length is required for a TokenStorage (use T + 1 for next-token targets)")
    if isinstance(storage, DocumentStorage) and sequence_length is not None:
        raise ValueError("sequence_length must be omitted for a DocumentStorage: each record is one sample")
    storage.header_for_reading()  # a missing storage is StorageNotFoundError here, not at the first batch
    shard_ids = storage.committed_shards()
    if isinstance(storage, DocumentStorage):
        return _not_empty(DocumentSource(storage, shard_ids), " (empty storage)", component)
    sequence_length = check_sequence_length(sequence_length)
    window_numpy_dtype = np.dtype(np.int32 if window_dtype == torch.int32 else np.int64)
    if window_numpy_dtype == np.int32 and storage.dtype.itemsize == 8:
        raise ValueError(f"window_dtype=torch.int32 cannot hold the {storage.dtype} ids of {storage.location}")
    source = window_source(
        storage, shard_ids, sequence_length, window_numpy_dtype, document_boundaries, pack_documents, pad_id
    )
    tokens = source.reader.token_count
    why = f": sequence_length={sequence_length} is longer than its {tokens} tokens" if tokens else " (empty storage)"
    return _not_empty(source, why, component)


def _not_empty(
    source: DocumentSource | TokenWindowSource, why: str, component: str | None
) -> DocumentSource | TokenWindowSource:
    if source.sample_count == 0:
        source.close()
        which = "" if component is None else f"the mixture's component {component!r}: "
        raise ValueError(f"{which}the storage at {source.storage.location} has no samples to load{why}")
    return source
