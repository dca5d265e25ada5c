"""The two storages users create: DocumentStorage (whole records) and TokenStorage (token streams)."""

from __future__ import annotations

import contextlib
import os
import stat
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from guideloom._errors import CorruptStorageError, FormatMismatchError, StorageNotFoundError, UntrustedFormatWarning
from guideloom._formats import DocumentPickleFormat, DocumentStorageFormat, format_identity
from guideloom._layout import (
    HEADER_NAME,
    INCOMPLETE_DIR,
    SHARDS_DIR,
    TOKEN_DTYPES,
    ShardFile,
    StorageHeader,
    committed_shard_ids,
    fsync_directory,
    publish,
    read_header,
    verify_shards,
)
from guideloom._reader import AsyncReader, DocumentReader, StorageReader, TokenReader
from guideloom._writer import AsyncWriter, SyncWriter

In = TypeVar("In")
Out = TypeVar("Out")


def _as_path(path: object) -> Path:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


class StorageBase:
    """What both storages share: the directory, its header, verification and clean-up."""

    path: Path

    def _expected_header(self) -> StorageHeader:
        raise NotImplementedError

    def _existing_header(self) -> StorageHeader | None:
        """The header on disk (checked against ours), or None for a storage not yet written."""
        try:
            found = read_header(self.path)
        except StorageNotFoundError:
            return None
        expected = self._expected_header()
        if found != expected:
            raise FormatMismatchError(
                f"the storage at {self.path} holds {found.describe()}, but was opened as {expected.describe()}"
            )
        return found

    def _create(self) -> StorageHeader:
        """Create the directory and header if needed; safe when writers race to do it."""
        header = self._expected_header()
        for directory in (self.path, self.path / SHARDS_DIR, self.path / INCOMPLETE_DIR):
            directory.mkdir(parents=True, exist_ok=True)
        if self._existing_header() is None:
            temporary = self.path / INCOMPLETE_DIR / f"{HEADER_NAME}.{uuid.uuid4().hex}"
            with open(temporary, "xb") as file:
                file.write(header.to_json())
                file.flush()
                os.fsync(file.fileno())
            if not publish(temporary, self.path / HEADER_NAME):
                self._existing_header()  # another writer created it first: it must match
            fsync_directory(self.path.parent)
        return header

    def open_reader(self, shard_ids: list[int] | None = None) -> StorageReader[Any]:
        """A reader of the given shards (a loader's pinned snapshot), or of all committed now."""
        raise NotImplementedError

    def committed_shards(self) -> list[int]:
        """Ids of the shards committed now, ascending."""
        return committed_shard_ids(self.path)

    def header_for_reading(self) -> StorageHeader:
        """The header on disk, checked against this storage's; a missing storage is StorageNotFoundError."""
        header = self._existing_header()
        if header is None:
            read_header(self.path)  # raises the precise StorageNotFoundError
            raise AssertionError("unreachable")
        return header

    def verify(self, progress: Callable[[int], None] | None = None) -> list[str]:
        """Recompute every committed shard's checksums; an empty list means all is well.

        Each problem names its shard. ``progress`` is called with the bytes checked per shard.
        """
        problems: list[str] = []
        return verify_shards(self._each_shard(problems), progress, problems)

    def _each_shard(self, problems: list[str]) -> Iterator[ShardFile]:
        """Each committed shard, opened in turn and closed after; one that cannot be opened is a problem."""
        header = self.header_for_reading()
        for shard_id in committed_shard_ids(self.path):
            try:
                shard = ShardFile(self.path, shard_id, header)
            except (CorruptStorageError, FormatMismatchError) as error:
                problems.append(str(error))  # a shard that cannot even be opened is one more problem
                continue
            try:
                yield shard
            finally:
                shard.close()

    def clean_leftovers(self, older_than: float = 3600.0) -> list[Path]:
        """Delete files that dead writers left in ``incomplete/``, untouched for ``older_than`` seconds.

        Files of live writers are younger than that as long as they keep appending.
        """
        removed: list[Path] = []
        now = time.time()
        incomplete = self.path / INCOMPLETE_DIR
        try:  # never through a symlink: a crafted storage must not make clean delete files elsewhere
            directory = os.open(incomplete, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return removed
        except OSError as error:
            reason = error.strerror or error
            raise CorruptStorageError(f"{incomplete} is not a directory ({reason}): nothing cleaned") from None
        try:
            for entry in os.scandir(directory):
                with contextlib.suppress(FileNotFoundError):
                    status = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(status.st_mode):  # writers make files only: not theirs, left alone
                        continue
                    if now - status.st_mtime >= older_than:
                        os.unlink(entry.name, dir_fd=directory)  # a symlink goes, not its target
                        removed.append(incomplete / entry.name)
        finally:
            os.close(directory)
        return removed

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"


class AnyFormatStorage(StorageBase):
    """A storage opened without its format class: enough to inspect, verify and clean it (the command line)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = _as_path(path)
        self.header = read_header(self.path)

    def _expected_header(self) -> StorageHeader:
        return self.header

    def open_reader(self, shard_ids: list[int] | None = None) -> StorageReader[object]:
        return StorageReader(self.path, self.header, shard_ids)


_Storage = StorageBase  # the former name, still imported by the command line until it uses AnyFormatStorage

_warned_paths: set[Path] = set()


def _warn_untrusted_once(path: Path) -> None:
    """Warn once per storage and process that reading pickle runs the data's code."""
    resolved = path.resolve()
    if resolved not in _warned_paths:
        _warned_paths.add(resolved)
        warnings.warn(
            f"{path} is a pickle storage: decoding pickle can run arbitrary code, so read only storages "
            "you trust (JSON, MessagePack or your own format decode without running code)",
            UntrustedFormatWarning,
            stacklevel=4,
        )


class DocumentStorage(StorageBase, Generic[In, Out]):
    """Whole records, each encoded by ``format`` and decoded as one sample."""

    def __init__(self, path: str | os.PathLike[str], format: DocumentStorageFormat[In, Out]) -> None:
        self.path = _as_path(path)
        if isinstance(format, type):
            raise TypeError(
                f"format must be a format instance, got the class {format.__name__}: pass {format.__name__}()"
            )
        if not isinstance(format, DocumentStorageFormat):
            raise TypeError(f"format must be a DocumentStorageFormat, got {type(format).__name__}")
        self.format = format
        self._existing_header()

    def _expected_header(self) -> StorageHeader:
        return StorageHeader("documents", format=format_identity(self.format))

    def _encode(self, data: In) -> tuple[memoryview, int]:
        encoded = self.format.pack(data)
        if not isinstance(encoded, bytes | bytearray | memoryview):
            raise TypeError(f"{type(self.format).__name__}.pack must return bytes, got {type(encoded).__name__}")
        view = memoryview(encoded).cast("B")
        return view, view.nbytes

    def sync_writer(self) -> SyncWriter[In]:
        """A writer; use it as ``with storage.sync_writer() as writer``."""
        return SyncWriter(self.path, self._create(), self._encode)

    def sync_reader(self) -> DocumentReader[Out]:
        """A reader of the shards committed now; use it as ``with storage.sync_reader() as reader``."""
        return self.open_reader()

    def async_writer(self) -> AsyncWriter[In]:
        return AsyncWriter(self.sync_writer())

    def async_reader(self) -> AsyncReader[Out]:
        return AsyncReader(self.sync_reader)

    def open_reader(self, shard_ids: list[int] | None = None) -> DocumentReader[Out]:
        header = self.header_for_reading()
        if isinstance(self.format, DocumentPickleFormat):
            _warn_untrusted_once(self.path)
        return DocumentReader(self.path, header, self.format, shard_ids)


TokenInput = Any  # list of ints, a 1-D integer NumPy array or a 1-D integer tensor


class TokenStorage(StorageBase):
    """Documents of token ids, concatenated into one stream served as fixed windows."""

    def __init__(self, path: str | os.PathLike[str], dtype: str | np.dtype[Any] | type | None = None) -> None:
        self.path = _as_path(path)
        recorded = None
        with contextlib.suppress(StorageNotFoundError):
            recorded = read_header(self.path)
        if recorded is not None and recorded.kind != "tokens":
            raise FormatMismatchError(f"the storage at {self.path} holds {recorded.describe()}, not tokens")
        if dtype is None:
            self.dtype = np.dtype(recorded.dtype if recorded is not None else "uint32")
        else:
            try:
                self.dtype = np.dtype(dtype)
            except TypeError:
                raise TypeError(f"dtype must be a NumPy integer dtype, got {dtype!r}") from None
            if self.dtype.name not in TOKEN_DTYPES:
                raise ValueError(f"dtype must be one of {', '.join(TOKEN_DTYPES)}, got {self.dtype}")
        self.dtype = self.dtype.newbyteorder("=")
        self._stored_dtype = self.dtype.newbyteorder("<")
        self._limits = np.iinfo(self.dtype)
        self._existing_header()

    def _expected_header(self) -> StorageHeader:
        return StorageHeader("tokens", dtype=self.dtype.name)

    def _encode(self, tokens: TokenInput) -> tuple[memoryview, int]:
        if type(tokens) is np.ndarray and tokens.dtype == self._stored_dtype and tokens.ndim == 1:
            if tokens.flags.c_contiguous:  # the common case, already as stored: no conversion, no copy
                return memoryview(tokens.data).cast("B"), tokens.size
        array = _token_array(tokens)
        if array.size and not np.can_cast(array.dtype, self.dtype, "safe"):  # else every id fits
            low, high = int(array.min()), int(array.max())
            if low < self._limits.min or high > self._limits.max:
                bad = low if low < self._limits.min else high
                raise ValueError(f"token id {bad} does not fit the storage dtype {self.dtype}")
        stored = np.ascontiguousarray(array, dtype=self._stored_dtype)
        return memoryview(stored.data).cast("B"), stored.size

    def sync_writer(self) -> SyncWriter[TokenInput]:
        """A writer; ``writer.append(shard, tokens)`` appends one document's token ids."""
        return SyncWriter(self.path, self._create(), self._encode)

    def sync_reader(self) -> TokenReader:
        """A reader of the shards committed now: documents by index and the token stream."""
        return self.open_reader()

    def async_writer(self) -> AsyncWriter[TokenInput]:
        return AsyncWriter(self.sync_writer())

    def async_reader(self) -> AsyncReader[np.ndarray]:
        return AsyncReader(self.sync_reader)

    def open_reader(self, shard_ids: list[int] | None = None) -> TokenReader:
        return TokenReader(self.path, self.header_for_reading(), shard_ids)


def _token_array(tokens: TokenInput) -> np.ndarray:
    """One document's token ids as a 1-D integer array, without wrapping or truncating."""
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, np.ndarray):
        array = tokens
    elif isinstance(tokens, list | tuple | range):
        array = _list_array(tokens)
    else:
        raise TypeError(f"tokens must be a list, NumPy array or tensor of ints, got {type(tokens).__name__}")
    if array.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise TypeError(f"tokens must be integers, got dtype {array.dtype}")
    return array


def _list_array(tokens: list[Any] | tuple[Any, ...] | range) -> np.ndarray:
    """A list of Python ints as int64, or uint64 when ids need it; never float or wrapped."""
    if not len(tokens):
        return np.empty(0, np.int64)
    try:
        array = np.asarray(tokens)
    except (TypeError, ValueError, OverflowError):
        array = np.empty(0, object)
    if array.dtype.kind in "iu" and array.ndim == 1:
        return array
    if not all(isinstance(token, int | np.integer) and not isinstance(token, bool) for token in tokens):
        raise TypeError("tokens must be integers")
    low, high = min(tokens), max(tokens)
    if low < 0 or high >= 2**64:
        raise ValueError(f"token id {low if low < 0 else high} does not fit any token dtype")
    return np.asarray(tokens, dtype=np.uint64)
