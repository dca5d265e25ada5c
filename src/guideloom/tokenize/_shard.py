"""One input file into one shard: the unit of work of every executor (this process, worker processes, ...).

:func:`tokenize_file` is a plain function of picklable arguments (plus the loaded tokenizer), so any
executor can run it: it writes the job's shard with its own writer and commits it at the end, or commits
nothing when it raises.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._storage.resumable_write import committed_digest
from guideloom.tokenize._chat import ChatDocuments
from guideloom.tokenize._inputs import InputFile, iter_documents
from guideloom.tokenize._plan import FileJob, TokenizeSettings
from guideloom.tokenize._tokenizer import encode

BATCH_DOCUMENTS = 512
BATCH_CHARACTERS = 4 << 20


class Cancelled(Exception):
    """Raised inside a writer when another file failed: its shard is not committed."""


def _never() -> bool:
    return False


def _ignore(count: int) -> None:
    del count


class TextDocuments:
    """What :func:`tokenize_file` reads and writes for text: documents, their ids and the end-of-text id."""

    def __init__(self, tokenizer: Any, settings: TokenizeSettings) -> None:
        self.tokenizer = tokenizer
        self.text_field = settings.text_field
        self.eos = [] if settings.eos_id is None else [settings.eos_id]
        self.dtype = np.dtype(settings.dtype)

    def documents(self, file: InputFile) -> Iterator[tuple[str, int, int]]:
        for text, position in iter_documents(file, self.text_field):
            yield text, len(text), position

    def encode(self, file: InputFile, texts: list[str]) -> Iterator[tuple[np.ndarray, None]]:
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


def tokenize_file(
    job: FileJob,
    settings: TokenizeSettings,
    tokenizer: Any,
    report: Callable[[int], object] = _ignore,
    cancelled: Callable[[], bool] = _never,
) -> tuple[int, int]:
    """Write ``job``'s shard: ``(documents, tokens)``. Raising commits nothing of it.

    ``report(n)`` is called with the input bytes read since its last call; ``cancelled()`` is polled
    between batches of documents, and True raises :class:`Cancelled`. An input without documents
    writes no shard: ``(0, 0)``.
    """
    if cancelled():
        raise Cancelled
    storage = settings.storage()
    kind = document_kind(settings, tokenizer)
    documents = tokens = 0
    reported = 0
    batch: list[Any] = []
    characters = 0
    with contextlib.ExitStack() as stack:
        writer = None

        def flush(position: int) -> None:
            nonlocal writer, documents, tokens, reported, characters
            if cancelled():
                raise Cancelled
            if batch:
                if writer is None:  # created lazily: an input without documents creates nothing
                    writer = stack.enter_context(storage.sync_writer())
                for array, mask in kind.encode(job.file, batch):
                    if mask is None:
                        writer.append(job.shard, array)
                    else:
                        writer.append(job.shard, array, loss_mask=mask)
                    tokens += array.size
                documents += len(batch)
                batch.clear()
                characters = 0
            report(position - reported)
            reported = position

        position = 0
        for document, size, position in kind.documents(job.file):
            batch.append(document)
            characters += size
            if len(batch) >= BATCH_DOCUMENTS or characters >= BATCH_CHARACTERS:
                flush(position)
        flush(max(position, job.size))
    return documents, tokens


def picklable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling (to cross to the parent process), else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


_loaded_tokenizers: dict[Path, Any] = {}  # per process: an executor's reused worker loads a tokenizer once


def tokenize_job(job: FileJob, settings: TokenizeSettings) -> tuple[str, Any, str | None]:
    """``job`` for executors that may run it again (Ray): ``("done", counts, None)`` or ``("failed", error, trace)``.

    An attempt that finds the shard committed (an earlier attempt died after committing it) reports
    the shard's counts: a plan schedules only shards not committed when the run started.
    """
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one CPU per job
    try:
        storage = settings.storage()
        header = storage.create()
        found = committed_digest(storage, header, job.shard)
        if found is not None:
            return "done", (found.records, found.data_size // header.element_size), None
        tokenizer = _loaded_tokenizers.get(settings.tokenizer_path)
        if tokenizer is None:
            tokenizer = _loaded_tokenizers[settings.tokenizer_path] = settings.load_tokenizer()
        return "done", tokenize_file(job, settings, tokenizer), None
    except Exception as error:
        return "failed", picklable(error), traceback.format_exc()
