"""Which shards a tokenize run writes: input files grouped, each group's shard ids, and what is committed of it.

The sorted input files are cut into *groups* of consecutive files holding at least the shard size in
input bytes (the last group may hold less): many small files share a group, a large file ends one.
Group ``g`` writes its documents, in order, into shards ``g * SHARDS_PER_GROUP``, ``+ 1``, ``+ 2``, ...:
a shard is committed as soon as it holds at least the shard size in token bytes, and the group's last
shard when its files end. The grouping depends only on the sorted inputs' sizes and the shard size,
so the shards are the same whatever ran them (any number of workers, Ray tasks).

Only a group's last shard can hold less than the shard size, so what is committed of a group says
how far it got: no shard (not started), shards whose last holds less than the shard size
(finished), or only full shards (interrupted, or finished on a full shard: it resumes after the
documents those shards hold and finds nothing more to write).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from guideloom._shards.header import StorageHeader
from guideloom._shards.shard_names import MAX_SHARD_ID
from guideloom._storage.resumable_write import ShardContents
from guideloom._storage.storages import StorageBase
from guideloom.tokenize._inputs import InputFile

SHARDS_PER_GROUP = 10**6  # group g writes shards g * 10**6 + k: at most 10**6 groups of 10**6 shards
MAX_GROUPS = (MAX_SHARD_ID + 1) // SHARDS_PER_GROUP
DEFAULT_SHARD_SIZE = 256 << 20


@dataclass(frozen=True)
class GroupProgress:
    """What is committed of a group: its first ``shards`` shards, holding ``documents`` documents."""

    shards: int = 0
    documents: int = 0
    tokens: int = 0
    finished: bool = False


@dataclass(frozen=True)
class GroupJob:
    """Consecutive input files written, in order, by one worker into the group's shards."""

    group: int
    files: tuple[InputFile, ...]
    shard_size: int  #: bytes of token ids after which a shard is committed
    resume: GroupProgress = GroupProgress()  #: what was committed of the group when the run was planned

    @property
    def first_shard(self) -> int:
        return self.group * SHARDS_PER_GROUP

    @property
    def size(self) -> int:
        return sum(file.size for file in self.files)

    def describe(self) -> str:
        """The group's files, for messages."""
        if len(self.files) == 1:
            return str(self.files[0].path)
        return f"{len(self.files)} files, {self.files[0].path} to {self.files[-1].path}"


def group_files(files: Iterable[InputFile], shard_size: int) -> list[tuple[InputFile, ...]]:
    """Consecutive ``files`` in groups of at least ``shard_size`` input bytes (the last may hold less)."""
    groups: list[tuple[InputFile, ...]] = []
    current: list[InputFile] = []
    size = 0
    for file in files:
        current.append(file)
        size += file.size
        if size >= shard_size:
            groups.append(tuple(current))
            current, size = [], 0
    if current:
        groups.append(tuple(current))
    return groups


def shard_contents(storage: StorageBase, header: StorageHeader) -> Callable[[int], ShardContents | None]:
    """Look up committed shards' contents, from one snapshot of the storage (its listing and shard index)."""
    facts = {info.id: info for info in storage.snapshot()}
    return lambda shard: (
        None
        if (info := facts.get(shard)) is None
        else ShardContents(info.record_count, info.element_count * header.element_size, info.data_crc)
    )


def group_progress(
    job: GroupJob, header: StorageHeader, contents: Callable[[int], ShardContents | None], committed: set[int]
) -> GroupProgress:
    """What is committed of ``job``'s group, given the storage's ``committed`` shard ids."""
    found: list[ShardContents] = []
    while job.first_shard + len(found) in committed:
        shard_facts = contents(job.first_shard + len(found))
        if shard_facts is None:
            break
        found.append(shard_facts)
    if not found:
        return GroupProgress()
    return GroupProgress(
        shards=len(found),
        documents=sum(shard.records for shard in found),
        tokens=sum(shard.data_size for shard in found) // header.element_size,
        finished=found[-1].data_size < job.shard_size,
    )


def shard_range(jobs: Iterable[GroupJob]) -> tuple[int, int]:
    """The shard ids ``[start, stop)`` the groups of ``jobs`` may write."""
    groups = [job.group for job in jobs]
    return min(groups) * SHARDS_PER_GROUP, (max(groups) + 1) * SHARDS_PER_GROUP


def group_paths(jobs: Iterable[GroupJob]) -> list[Path]:
    return [file.path for job in jobs for file in job.files]
