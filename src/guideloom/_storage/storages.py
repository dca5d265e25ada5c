"""The two storages users create: DocumentStorage (whole records) and TokenStorage (token streams)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar, Unpack, overload

import numpy as np

from guideloom._core.checks import check_bool, check_int, check_number
from guideloom._core.errors import FormatMismatchError, StorageNotFoundError
from guideloom._remote.compression import DEFAULT_LEVEL, check_compression, recorded_compression
from guideloom._remote.shard_cache import check_cache_arguments
from guideloom._shards.async_reader import AsyncReader
from guideloom._shards.checkpoints import CHECKPOINT_BYTES
from guideloom._shards.formats import (
    DocumentPickleFormat,
    DocumentStorageFormat,
    column_splitter,
    format_columns,
    format_identity,
)
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardInfo
from guideloom._shards.reader import DocumentReader, StorageReader, TokenReader
from guideloom._shards.record_lengths import defines_length
from guideloom._shards.rolling_writer import RollingWriter
from guideloom._shards.shard_access import CommitTarget, ShardSet
from guideloom._shards.shard_table import ShardTable
from guideloom._shards.token_ids import TokenEncoder, TokenInput
from guideloom._shards.writer import AsyncWriter, SyncWriter
from guideloom._storage.locations import DEFAULT_MAX_OPEN_SHARDS, Location, LocationOptions, local_path, locate
from guideloom._storage.trust import warn_untrusted
from guideloom._storage.writers import open_writer, record_measure

__all__ = ["AnyFormatStorage", "DocumentStorage", "StorageBase", "TokenStorage", "local_path"]

In = TypeVar("In")
Out = TypeVar("Out")


class StorageBase:
    """What both storages share: where its files live (``home``, a :class:`Location`), its header, verification
    and clean-up. ``location`` names the place (a path or a URL) in messages and states."""

    home: Location
    location: str
    compression: str | None = None  # of the shard objects on a store: requested, else as recorded
    # The piece size of the shards' checkpoints: CHECKPOINT_BYTES for a new storage, an existing one's as recorded
    # (None in storages created without checkpoints, whose shards go on without them).
    checkpoint_bytes: int | None = CHECKPOINT_BYTES
    _requested_compression: str | None = None

    def _locate(self, path: object, options: LocationOptions) -> None:
        """Set where the storage lives (a local directory, or an object store URL and its cache) and the
        compression it asks for, from the constructor's ``LocationOptions``."""
        unexpected = sorted(set(options) - LocationOptions.__optional_keys__)
        if unexpected:  # as Python says it of a named argument
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {unexpected[0]!r}")
        cache_path, limit = check_cache_arguments(options.get("cache_dir"), options.get("cache_limit_bytes"))
        self.max_open_shards = check_int(
            "max_open_shards", options.get("max_open_shards", DEFAULT_MAX_OPEN_SHARDS), minimum=1
        )
        self.home = locate(path, options.get("storage_options"), cache_path, limit)
        self.location = self.home.name
        compression, level = options.get("compression"), options.get("compression_level", DEFAULT_LEVEL)
        self._requested_compression, level = check_compression(compression, level, self.home)
        self._use_compression(self._requested_compression, level)

    def _use_compression(self, compression: str | None, level: int | None = None) -> None:
        self.compression = compression
        self.home.use_compression(compression, level)

    @property
    def path(self) -> Path:
        """A local storage's directory (a storage on an object store has none: AttributeError)."""
        return self.home.path

    @property
    def retry_count(self) -> int:
        """Requests to the object store that this process retried for this storage (each also logged)."""
        return self.home.retry_count

    def _read_header(self) -> StorageHeader:
        return self.home.read_header()

    def committed_shards(self) -> list[int]:
        """Ids of the shards committed now, ascending (for a remote storage: its index object and one listing)."""
        return self.home.committed_shards(self.snapshot)

    @property
    def index_problem(self) -> str | None:
        """Why the last snapshot could not use the storage's index and listed its shards instead (None: it used it,
        or there is none): a damaged local ``shards.index`` (rebuilt), an object store's unusable index object."""
        return self.home.index_problem

    @property
    def is_remote(self) -> bool:
        """Whether the storage lives on an object store (read through a local cache)."""
        return self.home.is_remote

    @property
    def cache_limit(self) -> int | None:
        """A remote storage's ``cache_limit_bytes`` (None: no limit, or a local storage)."""
        return self.home.cache_limit

    def listed_shard(self, shard: int) -> ShardInfo | None:
        """The facts of committed ``shard`` now (a remote storage's from a listing); None if it is not committed."""
        found, _ = self.snapshot().select([shard])
        return found[0] if len(found) else None

    def snapshot(self) -> ShardTable:
        """The shards committed now and their facts: locally from the shard index, remotely from the index
        object and a listing of what it cannot know (see docs/object-storage.md)."""
        return self.home.snapshot(self.header_for_reading())

    def write_index(self) -> int:
        """Write the storage's index from a listing of its committed shards; the number of shards it names.

        On an object store this is the index object that lets readers list only the shards committed
        after it (run it after a large write: ``guideloom tokenize`` and the Ray datasink do); on a local
        storage it rewrites the shard index. Either is derived data: it never decides what is committed.
        """
        return self.home.write_index(self.header_for_reading())

    def _shard_set(self, header: StorageHeader, shards: list[int] | ShardTable | None) -> ShardSet:
        """What a reader of these shards (a snapshot, ids, or all committed now) reads through."""
        return self.home.shard_set(header, shards, self.max_open_shards)

    def incomplete_files_dir(self) -> Path:
        """Where this machine's writers build shards before committing them (an object store's: in its cache)."""
        return self.home.incomplete_dir()

    def committed_shard_sizes(self) -> list[int]:
        """The file size of every committed shard, from the listing or the index (nothing is opened)."""
        return self.home.committed_shard_sizes(self.header_for_reading)

    def commit_target(self) -> CommitTarget:
        """Where a writer commits its shards: the local directory, or the object store."""
        return self.home.commit_target()

    def _expected_header(self) -> StorageHeader:
        raise NotImplementedError

    def _adopt_recorded(self, found: StorageHeader) -> None:
        """Take from an existing storage's header what opening it does not choose (documents: record lengths)."""

    def _opened_as(self, expected: StorageHeader) -> str:
        """What the arguments given asked for, as a refusal names it (``expected`` holds what was adopted)."""
        return expected.describe()

    def trust_key(self) -> str:
        """Names this storage in the process's record of the shards it committed (see ``_storage.trust``)."""
        return self.home.trust_key()

    def highest_committed(self) -> int:
        """The highest committed shard id, -1 if none: where writers that pick ids start looking."""
        return max(self.committed_shards(), default=-1)

    def _existing_header(self) -> StorageHeader | None:
        """The header on disk (checked against ours), or None for a storage not yet written."""
        try:
            found = self._read_header()
        except StorageNotFoundError:
            return None
        if self._requested_compression is None:  # compression=None opens a storage as recorded
            self._use_compression(recorded_compression(found, self.home))
        self.checkpoint_bytes = found.checkpoint_bytes
        self._adopt_recorded(found)
        expected = self._expected_header()
        if found != expected:
            opened = self._opened_as(expected)
            raise FormatMismatchError(
                f"the storage at {self.location} holds {found.describe()}, but was opened as {opened}"
            )
        return found

    def create(self) -> StorageHeader:
        """Create the directory and header if needed; safe when writers race to do it. The header returned is the
        one on disk, whoever created it (an existing storage's record lengths and checkpoints as recorded)."""
        self.home.create(self._expected_header(), self._existing_header)
        return self._expected_header()

    def open_reader(self, shard_ids: list[int] | ShardTable | None = None) -> StorageReader[Any]:
        """A reader of the given shards (a loader's pinned snapshot, or their ids), or of all committed now."""
        raise NotImplementedError

    def header_for_reading(self) -> StorageHeader:
        """The header on disk, checked against this storage's; a missing storage is StorageNotFoundError."""
        header = self._existing_header()
        if header is None:
            self._read_header()  # raises the precise StorageNotFoundError
            raise AssertionError("unreachable")
        return header

    def verify(self, progress: Callable[[int], None] | None = None) -> list[str]:
        """Recompute every committed shard's checksums; an empty list means all is well.

        Each problem names its shard. ``progress`` is called with the bytes checked per shard.
        """
        return self.home.verify(self.header_for_reading(), progress)

    def clean_leftovers(self, older_than: float = 3600.0) -> list[Path | str]:
        """Delete files that dead writers left in ``incomplete/``, untouched for ``older_than`` seconds; never a
        committed shard (a shard file under its name in ``shards/`` is committed).

        Files of live writers are younger than that as long as they keep appending. For a remote
        storage also its unfinished uploads, stray markers and the cache's abandoned downloads.
        """
        return self.home.clean(check_number("older_than", older_than, minimum=0))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"


class AnyFormatStorage(StorageBase):
    """A storage opened without its format class: enough to inspect, verify and clean it (the command line)."""

    def __init__(self, path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> None:
        self._locate(path, {"storage_options": storage_options})
        self.header = self._read_header()

    def _expected_header(self) -> StorageHeader:
        return self.header

    def open_reader(self, shard_ids: list[int] | ShardTable | None = None) -> StorageReader[object]:
        return StorageReader(self._shard_set(self.header, shard_ids), self.header)


class DocumentStorage(StorageBase, Generic[In, Out]):
    """Whole records, each encoded by ``format`` and decoded as one sample."""

    __module__ = "guideloom"  # its public home: reprs and pickles name it there

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: DocumentStorageFormat[In, Out],
        *,
        trusted: bool = False,
        **options: Unpack[LocationOptions],
    ) -> None:
        """A storage at a local ``path`` or an fsspec URL; ``options`` are ``LocationOptions``: ``storage_options``,
        ``cache_dir``, ``cache_limit_bytes``, ``max_open_shards``, ``compression``, ``compression_level`` (see
        docs/object-storage.md).

        ``trusted=True`` says the data is yours: reading a pickle storage then gives no ``UntrustedFormatWarning``.
        """
        if isinstance(format, type):
            raise TypeError(
                f"format must be a format instance, got the class {format.__name__}: pass {format.__name__}()"
            )
        if not isinstance(format, DocumentStorageFormat):
            raise TypeError(f"format must be a DocumentStorageFormat, got {type(format).__name__}")
        format_identity(format)  # a name that cannot be recorded is refused before anything is written
        self.format = format
        self.trusted = check_bool("trusted", trusted)
        self.record_lengths = defines_length(format)  # for a new storage; an existing one's as recorded
        self.field_columns = format_columns(format)  # likewise (none in a compressed storage: see _expected_header)
        self._locate(path, options)
        self._existing_header()

    def _expected_header(self) -> StorageHeader:
        identity = format_identity(self.format)
        return StorageHeader(
            "documents",
            identity,
            compression=self.compression,
            record_lengths=self.record_lengths,
            checkpoint_bytes=self.checkpoint_bytes,
            # Field columns serve ranged reads of a shard's object, which a compressed object cannot give.
            field_columns=() if self.compression is not None else self.field_columns,
        )

    def _adopt_recorded(self, found: StorageHeader) -> None:
        self.record_lengths = found.record_lengths
        self.field_columns = found.field_columns

    def _opened_as(self, expected: StorageHeader) -> str:
        # The record lengths were adopted from the storage: the format given has them if it defines a length.
        return dataclasses.replace(expected, record_lengths=defines_length(self.format)).describe()

    def encode(self, data: In) -> tuple[memoryview, int]:
        """One record as the bytes a shard stores, and their count."""
        encoded = self.format.pack(data)
        if not isinstance(encoded, bytes | bytearray | memoryview):
            raise TypeError(f"{type(self.format).__name__}.pack must return bytes, got {type(encoded).__name__}")
        view = memoryview(encoded).cast("B")
        return view, view.nbytes

    @overload
    def sync_writer(self, shard_size: None = None) -> SyncWriter[In]: ...

    @overload
    def sync_writer(self, shard_size: int | str) -> RollingWriter[In]: ...

    def sync_writer(self, shard_size: int | str | None = None) -> SyncWriter[In] | RollingWriter[In]:
        """A writer; use it as ``with storage.sync_writer() as writer`` and ``writer.append(shard, data)``.

        With ``shard_size`` (bytes, or a size such as ``"256MiB"``) the writer picks the shard ids itself:
        ``writer.append(data)``, a new shard each time one holds that many bytes, committed as it fills.
        """
        return document_writer(self, shard_size)

    def sync_reader(self) -> DocumentReader[Out]:
        """A reader of the shards committed now; use it as ``with storage.sync_reader() as reader``."""
        return self.open_reader()

    def async_writer(self) -> AsyncWriter[In]:
        return AsyncWriter(self.sync_writer())

    def async_reader(self) -> AsyncReader[Out]:
        return AsyncReader(self.sync_reader)

    def open_reader(self, shard_ids: list[int] | ShardTable | None = None) -> DocumentReader[Out]:
        header = self.header_for_reading()
        shard_set = self._shard_set(header, shard_ids)
        if isinstance(self.format, DocumentPickleFormat) and not self.trusted:
            warn_untrusted(self.trust_key(), self.location, shard_set.infos.ids.tolist())
        return DocumentReader(shard_set, header, self.format)


class TokenStorage(StorageBase):
    """Documents of token ids, concatenated into one stream served as fixed windows."""

    __module__ = "guideloom"  # its public home: reprs and pickles name it there

    def __init__(
        self,
        path: str | os.PathLike[str],
        dtype: str | np.dtype[Any] | type | None = None,
        *,
        loss_mask: bool | None = None,
        **options: Unpack[LocationOptions],
    ) -> None:
        """A storage at a local ``path`` or an fsspec URL; ``options`` are ``LocationOptions``: ``storage_options``,
        ``cache_dir``, ``cache_limit_bytes``, ``max_open_shards``, ``compression``, ``compression_level`` (see
        docs/object-storage.md).

        ``loss_mask=True`` creates a masked storage (a loss mask bit per token, docs/tokens.md); None opens an
        existing storage as recorded and makes a new one unmasked.
        """
        if loss_mask is not None:
            check_bool("loss_mask", loss_mask)
        self._locate(path, options)
        recorded = None
        with contextlib.suppress(StorageNotFoundError):
            recorded = self._read_header()
        if recorded is not None and recorded.kind != "tokens":
            raise FormatMismatchError(f"the storage at {self.location} holds {recorded.describe()}, not tokens")
        self.encoder = TokenEncoder(recorded.dtype if dtype is None and recorded is not None else dtype)
        self.dtype = self.encoder.dtype
        self.loss_mask = bool(recorded.loss_mask if loss_mask is None and recorded is not None else loss_mask)
        self._existing_header()

    def _expected_header(self) -> StorageHeader:
        return StorageHeader(
            "tokens",
            dtype=self.dtype.name,
            loss_mask=self.loss_mask,
            compression=self.compression,
            checkpoint_bytes=self.checkpoint_bytes,
        )

    def encode(self, tokens: TokenInput) -> tuple[memoryview, int]:
        """One document's ids as the bytes a shard stores, and their count; an id the dtype cannot hold is an error."""
        return self.encoder(tokens)

    @overload
    def sync_writer(self, shard_size: None = None) -> SyncWriter[TokenInput]: ...

    @overload
    def sync_writer(self, shard_size: int | str) -> RollingWriter[TokenInput]: ...

    def sync_writer(self, shard_size: int | str | None = None) -> SyncWriter[TokenInput] | RollingWriter[TokenInput]:
        """A writer; ``writer.append(shard, tokens)`` appends one document's token ids (``loss_mask=`` its mask).

        With ``shard_size`` (bytes of token ids, or a size such as ``"256MiB"``) the writer picks the shard ids:
        ``writer.append(tokens)``, a new shard each time one holds that many bytes, committed as it fills.
        """
        return open_writer(self, self.encoder, shard_size)  # the encoder itself

    def sync_reader(self) -> TokenReader:
        """A reader of the shards committed now: documents by index and the token stream."""
        return self.open_reader()

    def async_writer(self) -> AsyncWriter[TokenInput]:
        return AsyncWriter(self.sync_writer())

    def async_reader(self) -> AsyncReader[np.ndarray]:
        return AsyncReader(self.sync_reader)

    def open_reader(self, shard_ids: list[int] | ShardTable | None = None) -> TokenReader:
        header = self.header_for_reading()
        return TokenReader(self._shard_set(header, shard_ids), header)


def document_writer(
    storage: DocumentStorage[In, Any], shard_size: int | str | None, direct: bool = False
) -> SyncWriter[In] | RollingWriter[In]:
    """A writer of a document storage (see ``DocumentStorage.sync_writer``); with ``direct``, one whose shards' data
    goes past the page cache (``_shards.direct_writes``)."""
    header = storage.create()  # the header says whether the storage records lengths and holds field columns
    measure = record_measure(storage.format, storage.record_lengths, storage.location)
    columns = column_splitter(storage.format, header)
    return open_writer(storage, storage.encode, shard_size, measure, columns, direct)


def bulk_writer(storage: DocumentStorage[Any, Any]) -> SyncWriter[Any]:
    """A writer of ``storage``'s shards, named by the caller, whose data goes past the page cache: for an import,
    which writes gigabytes that nobody reads soon."""
    writer = document_writer(storage, None, direct=True)
    assert isinstance(writer, SyncWriter)
    return writer
