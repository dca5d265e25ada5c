"""Sample sources: what the loader reads, one sample index at a time, whatever the storage behind it.

The loader consumes any :class:`SampleSource`; the sources over one storage (:class:`DocumentSource`,
:class:`TokenWindowSource` and the document-aware windows) share :class:`PinnedShards`: a picklable
snapshot of shards opened lazily in each process that uses it, so worker processes read exactly the
shards the loader saw when it was created, whatever is committed meanwhile.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Generic, Protocol, Self, TypeVar

import numpy as np

from guideloom._core.errors import StateMismatchError
from guideloom._shards.parts import NO_PARTS, PlannedPart, ReadPlan
from guideloom._shards.reader import StorageReader
from guideloom._shards.shard_table import ShardTable
from guideloom._sources.describe import SamplePieces
from guideloom._sources.recorded_shards import ShardSetDigest, cut_settings, describe_shards, over_recorded_shards
from guideloom._storage.provenance import ShardSources

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

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        """What the samples at these indices (or positions) are made of: records, shards and token offsets.

        Read from indexes only (record counts, document offsets), never from the samples' data.
        """
        ...

    def sample_keys(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """int64 numbers that identify these samples (where in which shard they start, how they are cut),
        from what the source knows without opening a shard: a state's next-batch digest hashes them."""
        ...

    def default_collate(self, samples: Any) -> Any:
        """The batch when the user gives no ``collate``."""
        ...

    def split_collated(self, batch: Any, sizes: list[int]) -> list[Any]:
        """A batch built from several batches' samples, cut back into those batches."""
        ...

    def identity(self, *, digest: bool = True) -> dict[str, Any]:
        """Small and JSON-serialisable: what a loader state records about this source.

        ``digest=False`` leaves out the digest of the shards' contents: resuming needs it only when the
        shards differ from the state's, and it is the one part that costs time per shard.
        """
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


def spans_in_shards(sizes: np.ndarray, first: int, stop: int, in_records: bool) -> dict[int, PlannedPart]:
    """Elements (or records) ``first .. stop - 1`` of shards of these ``sizes`` laid end to end, shard by shard
    (by position), each counted within its shard."""
    ends = np.cumsum(sizes)
    starts = ends - sizes
    touched = np.flatnonzero((starts < stop) & (ends > first) & (sizes > 0))
    return {
        position: PlannedPart(max(first - start, 0), min(stop, end) - start, in_records)
        for position, start, end in zip(touched.tolist(), starts[touched].tolist(), ends[touched].tolist(), strict=True)
    }


class _OpensReaders(Protocol[ReaderT_co]):
    """What pinned shards ask of their storage (``_storage.storages``' storages are such)."""

    @property
    def location(self) -> str: ...

    @property
    def cache_limit(self) -> int | None:
        """A remote storage's cache limit in bytes (None: no limit, or a local storage)."""
        ...

    @property
    def compression(self) -> str | None:
        """The compression of a remote storage's shard objects (None: uncompressed, or a local storage)."""
        ...

    def open_reader(self, shard_ids: list[int] | ShardTable | None = None) -> ReaderT_co: ...


class PinnedShards(Generic[ReaderT]):
    """The shards of a storage committed when a loader was made (its snapshot), opened lazily in each process.

    Everything a state records comes from the snapshot's facts: taking a state opens no shard.
    """

    kind = ""

    def __init__(self, storage: _OpensReaders[ReaderT], snapshot: ShardTable) -> None:
        self.storage = storage
        self.snapshot = snapshot
        self._reader: ReaderT | None = None
        self._reader_pid = -1
        self._identity: dict[str, Any] | None = None  # the snapshot never changes: computed once
        self._open_at_most: int | None = None  # see hold_at_most
        self._plan = NO_PARTS  # see use_plan
        self._sources: ShardSources | None = None  # see sourced

    @property
    def shard_ids(self) -> list[int]:
        return self.snapshot.ids.tolist()  # type: ignore[no-any-return]

    @property
    def reader(self) -> ReaderT:
        # A forked worker keeps using the mappings it inherited: they stay valid even if a shard file
        # is deleted meanwhile. A spawned one gets no reader (see __getstate__) and opens the shards.
        if self._reader is None:
            self._reader = self.storage.open_reader(self.snapshot)
            self._reader_pid = os.getpid()
            if self._open_at_most is not None:
                shard_set = self._reader.shard_set
                shard_set.max_open = min(shard_set.max_open, self._open_at_most)
            if len(self._plan):
                self._reader.shard_set.use_plan(self._plan)
        return self._reader

    def hold_at_most(self, shards: int) -> None:
        """Keep at most ``shards`` shards open in each process (a windowed order's window and the shard after it),
        so that a finished shard is closed, and a remote one left to the cache to evict, as soon as the window
        moves on instead of when ``max_open_shards`` others have been opened."""
        self._open_at_most = shards
        if self._reader is not None:
            shard_set = self._reader.shard_set
            shard_set.max_open = min(shard_set.max_open, shards)

    def use_plan(self, plan: ReadPlan) -> None:
        """Read the shards ``plan`` names in those parts from now on, the others whole (in this process: the loader
        sends the epoch's plan with the work to every process that reads)."""
        if plan != self._plan:
            self._plan = plan
            if self._reader is not None:
                self._reader.shard_set.use_plan(plan)

    @property
    def reads_in_parts(self) -> bool:
        """Whether it can read shards in parts: it can say what its samples read of each shard, and its storage's
        shards can be read in parts (uncompressed, with checkpoints; see docs/format.md)."""
        return bool(self.sample_parts(0, 1)) and self.reader.header.readable_in_parts

    def sample_parts(self, first: int, stop: int) -> dict[int, PlannedPart]:
        """What samples ``first .. stop - 1`` read of each shard they read (by position); empty where the source
        cannot say (its shards are then read whole)."""
        return {}

    @property
    def orders_itself(self) -> bool:
        return False

    def identity(self, *, digest: bool = True) -> dict[str, Any]:
        if self._identity is None:
            self._identity = {
                "kind": self.kind,
                "path": self.storage.location,
                "shards": describe_shards(self.snapshot.ids),
                "fingerprint": self.reader.fingerprint,  # shard ids, record counts and checksums
            }
        if digest and "digest" not in self._identity:  # names a shard rewritten since
            self._identity["digest"] = ShardSetDigest.of_arrays(*self.shard_entries()).to_text()
        return {key: value for key, value in self._identity.items() if digest or key != "digest"}

    def has_fingerprint(self, recorded: object) -> bool:
        """Whether a state's recorded fingerprint is that of these shards: as guideloom writes it now, or as
        states of guideloom 0.2 and the first 0.3 builds recorded it (computed only for such a state)."""
        return recorded == self.identity(digest=False)["fingerprint"] or recorded == self.reader.earlier_fingerprint

    def shard_entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids, record counts and checksums of the shards (from the snapshot): what a state's digest is made of."""
        rows = self.snapshot.rows
        return rows["id"], rows["record_count"], rows["data_crc"]

    def with_shards(self, shard_ids: list[int]) -> Self:
        """This source over other shards of its snapshot (those a state recorded); opens nothing yet.

        A subclass that caches what it derives from its shards names those caches in `_unset_caches`.
        """
        clone = copy.copy(self)
        clone.__dict__.update(
            {**self.__getstate__(), **self._unset_caches(), "snapshot": self.snapshot.select(shard_ids)[0]}
        )
        return clone

    def _unset_caches(self) -> dict[str, Any]:
        """The attributes this source derives from its shards, as they are before first use (`with_shards`)."""
        return {"_identity": None}

    def resumed(self, recorded: dict[str, Any], *, epoch: int | None = None, position: int | None = None) -> Self:
        """The source for the rest of the state's epoch: ``self``, or this storage over the shards the state read
        if shards were added since; StateMismatchError saying what differs otherwise (a missing or changed shard
        is named)."""
        mine = self.identity(digest=False)
        if not isinstance(recorded, dict):
            raise StateMismatchError(f"the state's source must be a dict, got {type(recorded).__name__}")
        if "kind" not in recorded:
            raise StateMismatchError("the state's source records no 'kind': it is not from state_dict()")
        if recorded.get("kind") != mine["kind"]:
            raise StateMismatchError(f"the state was taken from {recorded.get('kind')!r}, this loader reads {self}")
        for key, value in cut_settings(mine).items():
            if recorded.get(key) != value:
                raise StateMismatchError(
                    f"the state was taken with {key}={recorded.get(key)!r}, but this loader has {key}={value!r}"
                )
        if self.has_fingerprint(recorded.get("fingerprint")):
            return self
        then: Self = over_recorded_shards(self, recorded)
        return then

    def difference(self, recorded: dict[str, Any]) -> str:
        """In words, how the shards a state recorded differ from these (the same ids, with other contents)."""
        return (
            f"it read shards {recorded.get('shards')} of the storage at {recorded.get('path')}, and shards "
            f"{describe_shards(self.snapshot.ids)} of the storage at {self.storage.location} hold other contents "
            "(rewritten, or another storage)"
        )

    def prefetch(self, indices: np.ndarray, epoch: int) -> None:
        """Shards of a remote storage that these records need are downloaded in the background (local: nothing)."""
        self.reader.prefetch_records(indices)

    def close(self) -> None:
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.close()
        self._reader = None

    def sourced(self, pieces: SamplePieces) -> SamplePieces:
        """``pieces`` with each record's input and row when the storage was written by an import (its provenance
        files, see ``_storage.provenance``); as they are otherwise."""
        if self._sources is None:
            self._sources = ShardSources.at(self.storage.location)
        return pieces.with_sources(self._sources.source) if self._sources.present() else pieces

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None, "_reader_pid": -1, "_sources": None}

    def __repr__(self) -> str:
        return f"{self.kind} of shards {describe_shards(self.snapshot.ids)} of the storage at {self.storage.location}"
