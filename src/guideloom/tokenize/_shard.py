"""One group of input files into its shards: the unit of work of every executor (this process, workers, Ray).

:func:`tokenize_group` is a plain function of picklable arguments (plus the loaded tokenizer), so any
executor can run it. It reads the group's documents in order (:func:`group_batches`), encodes each
batch (:class:`TextDocuments`) and hands the token arrays to :class:`GroupShards`, which commits each
shard once it is full and the last one at the end. Raising commits nothing of the shard in progress;
shards committed before stay.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._jobs.work import Cancelled, never, picklable
from guideloom._storage.storages import TokenStorage
from guideloom.tokenize._chat import ChatDocuments
from guideloom.tokenize._groups import GroupJob, GroupProgress, group_progress, shard_contents
from guideloom.tokenize._inputs import InputFile, iter_documents
from guideloom.tokenize._plan import TokenizeSettings
from guideloom.tokenize._tokenizer import encode

BATCH_DOCUMENTS = 512
BATCH_CHARACTERS = 4 << 20


def _ignore(count: int) -> None:
    del count


@dataclass
class GroupResult:
    """What one run of a group wrote (after what earlier runs had committed of it)."""

    documents: int = 0
    tokens: int = 0
    shards: list[int] = field(default_factory=list)  #: shard ids committed by this run
    empty_files: list[Path] = field(default_factory=list)  #: the group's inputs without documents


class GroupShards:
    """Appends a group's documents to its shards in order, committing each once it holds ``shard_size`` bytes.

    The writer is created at the first document (a group without documents creates nothing). Leaving
    the ``with`` block normally commits the last shard; leaving it by an exception commits nothing more.
    """

    def __init__(self, storage: TokenStorage, job: GroupJob, result: GroupResult, start: int = 0) -> None:
        self._storage = storage
        self._job = job
        self._result = result
        self._stack = contextlib.ExitStack()
        self._writer: Any = None
        self.shard = job.first_shard + start  #: the shard being written
        self._bytes = 0

    def append(self, tokens: np.ndarray, **extras: Any) -> None:
        """Append one document (``extras`` go to ``writer.append``, e.g. a loss mask)."""
        if self._writer is None:
            self._writer = self._stack.enter_context(self._storage.sync_writer())
        self._writer.append(self.shard, tokens, **extras)
        self._result.documents += 1
        self._result.tokens += tokens.size
        self._bytes += tokens.nbytes
        if self._bytes >= self._job.shard_size:
            self._writer.commit(self.shard)
            self._result.shards.append(self.shard)
            self.shard += 1
            self._bytes = 0

    def __enter__(self) -> GroupShards:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        self._stack.__exit__(kind, error, trace)  # the writer commits the shard in progress, or nothing
        if error is None and self._bytes:
            self._result.shards.append(self.shard)


class TextDocuments:
    """What :func:`tokenize_group` reads and writes for text: documents, their ids and the end-of-text id."""

    def __init__(self, tokenizer: Any, settings: TokenizeSettings) -> None:
        self.tokenizer = tokenizer
        self.text_field = settings.text_field
        self.eos = [] if settings.eos_id is None else [settings.eos_id]
        self.dtype = np.dtype(settings.dtype)

    def documents(self, file: InputFile) -> Iterator[tuple[str, int, int]]:
        """``(document, its size in characters, input bytes read so far)`` for each document of ``file``."""
        for text, position in iter_documents(file, self.text_field):
            yield text, len(text), position

    def encode(self, file: InputFile, texts: list[str]) -> Iterator[tuple[np.ndarray, None]]:
        """Each text's ids, then the end-of-text id (if any), as an array of the storage's dtype; no mask."""
        del file
        for ids in encode(self.tokenizer, texts):
            array = np.empty(len(ids) + len(self.eos), self.dtype)
            array[: len(ids)] = ids
            array[len(ids) :] = self.eos
            yield array, None


def document_kind(settings: TokenizeSettings, tokenizer: Any) -> TextDocuments | ChatDocuments:
    """How the run's inputs become documents: text, or conversations (``settings.train_on``)."""
    if settings.train_on is None:
        return TextDocuments(tokenizer, settings)
    return ChatDocuments(tokenizer, settings.train_on, np.dtype(settings.dtype))


def group_batches(
    job: GroupJob,
    kind: TextDocuments | ChatDocuments,
    result: GroupResult,
    report: Callable[[int], object] = _ignore,
    skip: int = 0,
) -> Iterator[tuple[InputFile, list[Any]]]:
    """The group's documents in order, in batches of one file's; the first ``skip`` are read and left out.

    ``report(n)`` is called with the input bytes read since its last call; the group's files without
    documents go to ``result.empty_files``.
    """
    for file in job.files:
        batch: list[Any] = []
        characters = reported = documents = 0
        for document, size, position in kind.documents(file):
            documents += 1
            if skip:
                skip -= 1
                continue
            batch.append(document)
            characters += size
            if len(batch) >= BATCH_DOCUMENTS or characters >= BATCH_CHARACTERS:
                yield file, batch
                batch, characters = [], 0
                report(position - reported)
                reported = position
        if batch:
            yield file, batch
        report(file.size - reported)
        if not documents:
            result.empty_files.append(file.path)


def tokenize_group(
    job: GroupJob,
    settings: TokenizeSettings,
    tokenizer: Any,
    report: Callable[[int], object] = _ignore,
    cancelled: Callable[[], bool] = never,
    resume: GroupProgress | None = None,
) -> GroupResult:
    """Write ``job``'s group after what ``resume`` (default: ``job.resume``) says is committed of it.

    ``cancelled()`` is polled between batches of documents, and True raises :class:`Cancelled`.
    """
    resume = job.resume if resume is None else resume
    if cancelled():
        raise Cancelled
    result = GroupResult()
    kind = document_kind(settings, tokenizer)
    with GroupShards(settings.storage(), job, result, start=resume.shards) as shards:
        for file, batch in group_batches(job, kind, result, report, skip=resume.documents):
            if cancelled():
                raise Cancelled
            for tokens, mask in kind.encode(file, batch):
                if mask is None:
                    shards.append(tokens)
                else:
                    shards.append(tokens, loss_mask=mask)
    return result


_loaded_tokenizers: dict[tuple[Path, bool], Any] = {}  # per process: an executor's reused worker loads a tokenizer once


def tokenize_job(job: GroupJob, settings: TokenizeSettings) -> tuple[str, Any, str | None]:
    """``job`` for executors that may run it again (Ray): ``("done", result, None)`` or ``("failed", error, trace)``.

    An attempt resumes after what is committed of the group now: an earlier attempt may have died
    after committing some of its shards (or all: then it writes nothing). The shards committed since
    the run was planned count as this run's.
    """
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one CPU per job
    try:
        storage = settings.storage()
        header = storage.create()
        committed = set(storage.committed_shards())
        now = group_progress(job, header, shard_contents(storage, header), committed)
        earlier = GroupResult(
            documents=now.documents - job.resume.documents,
            tokens=now.tokens - job.resume.tokens,
            shards=list(range(job.first_shard + job.resume.shards, job.first_shard + now.shards)),
        )
        if now.finished:
            return "done", earlier, None
        key = (settings.tokenizer_path, settings.train_on is not None)  # a tokenizer.json, or a chat directory
        tokenizer = _loaded_tokenizers.get(key)
        if tokenizer is None:
            tokenizer = _loaded_tokenizers[key] = settings.load_tokenizer()
        result = tokenize_group(job, settings, tokenizer, resume=now)
        result.documents += earlier.documents
        result.tokens += earlier.tokens
        result.shards[:0] = earlier.shards
        return "done", result, None
    except Exception as error:
        return "failed", picklable(error), traceback.format_exc()
