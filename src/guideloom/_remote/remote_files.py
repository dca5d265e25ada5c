"""A storage on an object store: its layout there, one-listing snapshots, cached reads and uploaded commits.

Objects under the storage's URL::

    guideloom.json                                  the header, created once (conditional create)
    shards.index                                    the index object: derived, optional (see _remote.index_object)
    shards/<12-digit id>.shard                      a committed shard, byte for byte the local file;
                                                    created with If-None-Match: its existence is the commit
    shards/<id>.r<records>.e<elements>.c<crc>.meta  empty marker written after the commit: what readers
                                                    need to index the shard, so opening costs one listing

A shard whose marker is missing (its writer died between the two creates) is indexed from its footer,
one ranged read. Markers without a shard are ignored (``clean`` removes them). With an index object,
readers list only the ids it cannot know (``_remote.indexed_listing``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any

from guideloom._core.errors import CorruptStorageError, FormatMismatchError, StorageNotFoundError
from guideloom._remote.compression import DEFAULT_LEVEL, DamagedDownload, ShardDecoder, upload_source
from guideloom._remote.index_object import INDEX_OBJECT, index_object_bytes
from guideloom._remote.indexed_listing import problem_of_index, read_index_object, snapshot_after_index
from guideloom._remote.object_store import ObjectStore
from guideloom._remote.remote_lengths import clean_lengths
from guideloom._remote.shard_cache import CacheLease, Prefetched, ShardCache
from guideloom._remote.shard_parts import download_part, part_entry, part_problem
from guideloom._shards.footer import FOOTER, decode_footer
from guideloom._shards.header import HEADER_NAME, StorageHeader, parse_header
from guideloom._shards.layout import SHARDS_DIR, ShardFile, ShardInfo, shard_file_name, shard_size
from guideloom._shards.parts import PlannedPart
from guideloom._shards.sections import ShardSections
from guideloom._shards.shard_names import shard_id_of
from guideloom._shards.shard_table import ShardTable
from guideloom._shards.upkeep import clean_incomplete

_MARKER = re.compile(r"([0-9]{12})\.r([0-9]+)\.e([0-9]+)\.c([0-9a-f]{8})\.meta")


def default_cache_dir() -> Path:
    """``$GUIDELOOM_CACHE_DIR``, else ``$XDG_CACHE_HOME/guideloom``, else ``~/.cache/guideloom``."""
    if os.environ.get("GUIDELOOM_CACHE_DIR"):
        return Path(os.environ["GUIDELOOM_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "guideloom"


def marker_name(info: ShardInfo) -> str:
    return f"{info.id:012d}.r{info.record_count}.e{info.element_count}.c{info.data_crc:08x}.meta"


class RemoteFiles:
    """The objects of one remote storage and its local cache directory (per URL, under ``cache_dir``)."""

    def __init__(
        self, url: str, options: dict[str, Any] | None, cache_dir: Path | None, cache_limit_bytes: int | None
    ) -> None:
        self.store = ObjectStore(url, options)
        self.url = self.store.url
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.directory = (cache_dir or default_cache_dir()) / digest
        self.cache = ShardCache(self.directory / "shards", cache_limit_bytes, self.url)
        self.incomplete = self.directory / "incomplete"
        self.compression: str | None = None  # what writers upload (the header's, set by the storage)
        self.compression_level = DEFAULT_LEVEL
        self.element_size = 1  # the header's, once read or created
        self.index_problem: str | None = None  # why the last listing could not use the index object
        self._header: StorageHeader | None = None

    def read_header(self) -> StorageHeader:
        """The header object, read once: it is created once (conditionally) and never replaced."""
        if self._header is not None:
            return self._header
        raw = self.store.read(HEADER_NAME)
        if raw is None:
            if self.store.bucket_missing():  # GCS and Azure answer a read in a missing bucket as a missing object
                raise StorageNotFoundError(f"no storage at {self.url}: the bucket does not exist")
            raise StorageNotFoundError(f"no storage at {self.url}: {HEADER_NAME} is missing")
        header = parse_header(raw, f"{self.url}/{HEADER_NAME}")
        self.element_size = header.element_size
        self._header = header
        return header

    def create_header(self, header: StorageHeader) -> None:
        """Create the header once; a header already there is left as it is (the caller checks it)."""
        self.element_size = header.element_size
        self.store.create(HEADER_NAME, header.to_json())

    def list_shards(self, header: StorageHeader) -> ShardTable:
        """The committed shards, ascending: the index object's and a listing of only what it cannot know
        (``indexed_listing``), or one listing of everything where there is no usable index."""
        self.index_problem = None
        index = read_index_object(self, header)
        if not self.store.listable:  # a static server: the index object is all there is to know
            if isinstance(index, ShardTable):
                return index
            raise StorageNotFoundError(
                f"{self.url} is read through its index object ({INDEX_OBJECT}), which cannot be used: "
                f"{index or 'it is missing'} (run `guideloom index` on the storage before serving its files)"
            )
        if isinstance(index, ShardTable):
            table = snapshot_after_index(self, header, index)
            if isinstance(table, ShardTable):
                return table
            self.index_problem = table  # None: an index with too many gaps, cheaper to list past
        else:
            self.index_problem = index
        return self.full_listing(header)

    def full_listing(self, header: StorageHeader) -> ShardTable:
        """The committed shards from one listing of everything (plus a footer read per shard lacking a marker)."""
        infos = self.infos_from_names(self.store.listing(SHARDS_DIR), header)
        return ShardTable.of(infos[shard] for shard in sorted(infos))

    def write_index(self, header: StorageHeader) -> int:
        """Write the index object from one listing of everything; the number of shards it names."""
        table = self.full_listing(header)
        self.store.put(INDEX_OBJECT, index_object_bytes(table, header, self.url))
        return len(table)

    def infos_from_names(
        self, names: dict[str, int], header: StorageHeader, read_footers: bool = True
    ) -> dict[int, ShardInfo]:
        """The shards among listed ``names`` (with sizes): from their markers, else (``read_footers``) their footers."""
        sizes = {shard: size for name, size in names.items() if (shard := shard_id_of(name)) is not None}
        infos: dict[int, ShardInfo] = {}
        for name in names:
            match = _MARKER.fullmatch(name)
            if match is None or int(match.group(1)) not in sizes:
                continue
            shard, records, elements = int(match.group(1)), int(match.group(2)), int(match.group(3))
            plain_size = plain_shard_size(records, elements * header.element_size, header, sizes[shard])
            if plain_size is not None:
                infos[shard] = ShardInfo(shard, records, elements, int(match.group(4), 16), plain_size)
        if read_footers:
            for shard, size in sizes.items():
                if shard not in infos:
                    infos[shard] = self._info_from_footer(shard, size, header)
        return infos

    def _info_from_footer(self, shard: int, size: int, header: StorageHeader) -> ShardInfo:
        name = f"{self.url}/{SHARDS_DIR}/{shard_file_name(shard)}"
        if size < FOOTER.size:
            raise CorruptStorageError(f"shard {shard} is truncated: {name} has only {size} bytes")
        raw = self.store.read(f"{SHARDS_DIR}/{shard_file_name(shard)}", size - FOOTER.size, size)
        if raw is None:
            raise CorruptStorageError(f"shard {shard} vanished while the storage was listed: {name}")
        footer = decode_footer(raw)
        if footer is None or footer.shard != shard:
            raise CorruptStorageError(f"shard {shard} has a damaged footer ({name})")
        records, data_size, data_crc = footer.record_count, footer.data_size, footer.data_crc
        plain_size = plain_shard_size(records, data_size, header, size)
        if plain_size is None or data_size % header.element_size:
            raise CorruptStorageError(f"shard {shard} has inconsistent sizes ({name}): object truncated?")
        return ShardInfo(shard, records, data_size // header.element_size, data_crc, plain_size)

    def clean(self, older_than: float) -> list[str]:
        """Remove what dead writers left: local files being built or downloaded, unfinished uploads and stray
        markers, not touched for ``older_than`` seconds (a download in progress is left alone however old)."""
        removed = [str(path) for path in clean_incomplete(self.incomplete, older_than)]
        removed += [str(path) for path in self.cache.clean(older_than)]
        removed += [str(path) for path in clean_lengths(self.directory / "lengths", older_than)]
        removed += self.store.abort_uploads(SHARDS_DIR, older_than)
        names = self.store.listing(SHARDS_DIR)
        shards = {shard for name in names if (shard := shard_id_of(name)) is not None}
        for name in names:
            match = _MARKER.fullmatch(name)
            if match is not None and int(match.group(1)) not in shards:
                self.store.delete(f"{SHARDS_DIR}/{name}")
                removed.append(f"{self.url}/{SHARDS_DIR}/{name}")
        return removed

    def verify(self, header: StorageHeader, progress: Callable[[int], None] | None = None) -> list[str]:
        """Download every committed shard afresh (not from the cache) and check it; the problems found."""
        listed = self.full_listing(header)
        index_problem = problem_of_index(read_index_object(self, header), listed, self.url)
        problems = [] if index_problem is None else [index_problem]
        self.incomplete.mkdir(parents=True, exist_ok=True)
        part = self.incomplete / f"verify.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
        for info in listed:
            name = f"{SHARDS_DIR}/{shard_file_name(info.id)}"
            try:
                self.store.download(name, part, decoder_for(header, info), object_size(header, info))
                problem = check_download(part, info, header, f"{self.url}/{name}")
            except DamagedDownload as error:
                problem = f"shard {info.id}: {self.url}/{name} is damaged: {error}"
            except FileNotFoundError:
                problem = f"shard {info.id}: {self.url}/{name} vanished while it was verified"
            except FormatMismatchError as error:
                problem = str(error)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
            if problem is not None:
                problems.append(problem)
            if progress is not None:
                progress(info.element_count * header.element_size)
        return problems

    def download_checked(self, info: ShardInfo, header: StorageHeader, wanted: PlannedPart | None = None) -> CacheLease:
        """The shard (or the part of it ``wanted`` names) from the cache, downloaded and verified first if needed."""
        if wanted is not None:
            return self.cache.acquire(part_entry(info, wanted), *self._part_download_and_check(info, header, wanted))
        return self.cache.acquire(self.cache.entry_for(info), *self._download_and_check(info, header))

    def prefetch_checked(
        self, info: ShardInfo, header: StorageHeader, keep: set[str], wanted: PlannedPart | None = None
    ) -> Prefetched | None:
        """The shard (or the part of it ``wanted`` names) held ahead of its reader (downloaded and verified first if
        it fits the cache next to the cached entries named in ``keep``), else None."""
        if wanted is not None:
            entry, steps = part_entry(info, wanted), self._part_download_and_check(info, header, wanted)
            return self.cache.prefetch(entry, *steps, keep)
        return self.cache.prefetch(self.cache.entry_for(info), *self._download_and_check(info, header), keep)

    def _part_download_and_check(
        self, info: ShardInfo, header: StorageHeader, wanted: PlannedPart
    ) -> tuple[Callable[[Path], None], Callable[[Path], str | None]]:
        object_name = f"{SHARDS_DIR}/{shard_file_name(info.id)}"

        def download(part: Path) -> None:
            download_part(self.store, object_name, info, header, wanted, part)

        def check(part: Path) -> str | None:
            try:
                shard = ShardFile(part.parent, info.id, header, file=part)
            except CorruptStorageError as error:
                return f"{error} (a part downloaded from {self.url}/{object_name})"
            try:
                if shard.info != info:
                    return f"shard {info.id}: {self.url}/{object_name} does not match the listing ({shard.info})"
                return part_problem(shard, wanted, header)
            finally:
                shard.close()

        return download, check

    def _download_and_check(
        self, info: ShardInfo, header: StorageHeader
    ) -> tuple[Callable[[Path], None], Callable[[Path], str | None]]:
        object_name = f"{SHARDS_DIR}/{shard_file_name(info.id)}"

        def download(part: Path) -> None:
            try:
                self.store.download(object_name, part, decoder_for(header, info), object_size(header, info))
            except FileNotFoundError:
                raise CorruptStorageError(
                    f"shard {info.id} vanished: {self.url}/{object_name} was deleted from the store after this "
                    "reader listed it"
                ) from None

        def check(part: Path) -> str | None:
            return check_download(part, info, header, f"{self.url}/{object_name}")

        return download, check


class RemoteTarget:
    """Commit by uploading: a conditional create of the shard's object, then its marker."""

    def __init__(self, files: RemoteFiles) -> None:
        self.files = files
        self.incomplete = files.incomplete
        self.incomplete.mkdir(parents=True, exist_ok=True)

    def committed(self, shard: int) -> bool:
        return self.files.store.exists(f"{SHARDS_DIR}/{shard_file_name(shard)}")

    def publish(self, temporary: Path, info: ShardInfo) -> bool:
        files = self.files
        source = upload_source(temporary, files.compression, files.compression_level, files.element_size)
        try:
            if not self.files.store.create(f"{SHARDS_DIR}/{shard_file_name(info.id)}", source):
                return False
        finally:
            if source != temporary:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(source)
        self.files.store.create(f"{SHARDS_DIR}/{marker_name(info)}", b"")
        return True

    def describe(self, shard: int) -> str:
        return f"{self.files.url}/{SHARDS_DIR}/{shard_file_name(shard)}"


def plain_shard_size(records: int, data_size: int, header: StorageHeader, listed: int) -> int | None:
    """The size of the plain shard (the cache file's) whose object is listed with ``listed`` bytes and holds these
    counts; None if no such shard has that size. A compressed object is smaller (and holds no field columns); a
    shard's field columns take what its other sections leave."""
    if header.compression is not None:
        return shard_size(records, data_size, header) if listed >= FOOTER.size else None
    return None if ShardSections.of_file(records, data_size, header, listed) is None else listed


def decoder_for(header: StorageHeader, info: ShardInfo) -> Callable[[IO[bytes]], ShardDecoder] | None:
    """How a downloaded object becomes the plain shard: decompressed, or written as it is."""
    return None if header.compression is None else partial(ShardDecoder, info=info, element_size=header.element_size)


def object_size(header: StorageHeader, info: ShardInfo) -> int | None:
    """The size of a shard's object as listed: the plain shard's, unknown here for a compressed one."""
    return info.size if header.compression is None else None


def check_download(part: Path, info: ShardInfo, header: StorageHeader, name: str) -> str | None:
    """The problem with a downloaded shard, or None: its structure, its checksums, and the listing's counts."""
    try:
        shard = ShardFile(part.parent, info.id, header, file=part)
    except CorruptStorageError as error:
        return f"{error} (downloaded from {name})"
    try:
        problem = shard.verify()
        if problem is None and shard.info != info:
            problem = f"shard {info.id}: the downloaded {name} does not match the listing ({shard.info} != {info})"
        return problem
    finally:
        shard.close()
