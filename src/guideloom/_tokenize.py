"""Tokenize text files into a TokenStorage, in parallel, one shard per input file.

This is the engine behind ``guideloom tokenize`` and ``examples/quickstart/preprocess.py``.

Inputs
    * ``.jsonl``: one JSON object per line; the document is the string in field
      ``text_field`` (default ``"text"``). Blank lines are skipped. A line that is
      not JSON, is not an object, lacks the field or holds a non-string there is a
      ``ValueError`` naming the file and the line.
    * ``.parquet``: the string column ``text_field``, one document per row (needs
      ``pyarrow``). A missing column or a null value is a ``ValueError`` naming the
      file (and the row).
    * anything else (``.txt``, ``.md``, ``.py``, ...): UTF-8 text, **one document per
      file** (an empty file holds none). Paragraph splitting is deliberately not done: it would cut source code
      and Markdown apart; put one document per record in a JSONL file instead.
      Compressed or JSON-array files (``.gz``, ``.zst``, ``.json``, ...) are refused.
    * A directory stands for its ``.txt``, ``.jsonl`` and ``.parquet`` files, recursively.

Shards
    The inputs are sorted (by path) and input ``i`` becomes shard ``i``, so the
    storage's document order is the sorted input order, records in file order, no
    matter how many workers ran. An input with no documents writes no shard.

Tokens
    Each document is encoded without the tokenizer's own special tokens
    (``add_special_tokens=False``), then the end-of-text id is appended, so
    document boundaries stay visible inside the concatenated token stream. With
    ``eos_token="auto"`` the first of ``<|endoftext|>``, ``<|end_of_text|>``,
    ``</s>``, ``<eos>``, ``[EOS]`` that the tokenizer knows is used (none found: no
    id is appended); pass a token string to choose it or ``None`` to append nothing.
    The dtype is ``uint16`` when every id of the vocabulary fits, else ``uint32``.

Failures
    Everything that can be checked up front is checked before anything is written:
    missing or unreadable inputs, unsupported suffixes, a Parquet file without the
    column, the tokenizer file, the output (an existing storage must hold tokens and
    must not already hold the shards to be written, unless ``skip_existing``).
    Each file is written by its own writer, so a file that fails mid-way commits
    nothing (its writer leaves ``with`` by the exception); the first failure stops
    the other workers (their files in progress are not committed either), files
    already finished stay committed, and the original exception is raised with a
    note listing them. After fixing the input, ``skip_existing=True``
    (``--skip-existing``) writes only the shards still missing. An input without a
    single document anywhere is a ``ValueError`` and nothing is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._errors import GuideloomError
from guideloom._layout import HEADER_NAME, INCOMPLETE_DIR, SHARDS_DIR, committed_shard_ids
from guideloom._storage import TokenStorage

EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]")
DIRECTORY_SUFFIXES = (".txt", ".jsonl", ".parquet")
REFUSED_SUFFIXES = {
    ".gz": "compressed",
    ".bz2": "compressed",
    ".xz": "compressed",
    ".zst": "compressed",
    ".zip": "compressed",
    ".json": "a JSON document (use JSON Lines, .jsonl)",
    ".arrow": "Arrow IPC (use Parquet)",
}
# With ``workers=None`` inputs smaller than this are tokenized in the calling process: starting worker
# processes (each imports numpy, torch and tokenizers) takes longer than tokenizing a few MB.
AUTO_PARALLEL_MIN_BYTES = 8 << 20
BATCH_DOCUMENTS = 512
BATCH_CHARACTERS = 4 << 20
INSTALL_HINT = "pip install 'guideloom[tokenize]'"


@dataclass(frozen=True)
class TokenizeSummary:
    """What one tokenize run wrote."""

    files: int  #: input files of this run (skipped ones included)
    documents: int  #: documents written by this run
    tokens: int  #: tokens written by this run (end-of-text ids included)
    bytes: int  #: input bytes read by this run
    seconds: float  #: wall time, process start-up included
    dtype: str
    eos_id: int | None
    shards: tuple[int, ...] = ()  #: shard ids committed by this run
    empty_files: tuple[Path, ...] = ()  #: inputs without documents (no shard)
    skipped_files: tuple[Path, ...] = ()  #: inputs whose shard already existed (``skip_existing``)
    processes: int = 0  #: worker processes started (0: the calling process did the work)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        lines = [
            f"tokenized {self.files - len(self.skipped_files)} files ({self.bytes / 2**20:.1f} MiB) into "
            f"{len(self.shards)} shards: {self.documents:,} documents, {self.tokens:,} tokens ({self.dtype}) "
            f"in {self.seconds:.1f} s = {self.tokens_per_second:,.0f} tokens/s "
            + (f"({self.processes} worker processes)" if self.processes else "(in this process)"),
        ]
        if self.eos_id is None:
            lines.append("no end-of-text id appended")
        if self.empty_files:
            lines.append(f"{len(self.empty_files)} input files held no documents (no shard)")
        if self.skipped_files:
            lines.append(f"{len(self.skipped_files)} input files skipped: their shards already existed")
        return "\n".join(lines)


@dataclass(frozen=True)
class _FileJob:
    shard: int
    path: Path
    size: int
    kind: str  # "jsonl" | "parquet" | "text"


@dataclass
class _Settings:
    output: Path
    tokenizer_path: Path
    text_field: str
    dtype: str
    eos_id: int | None
    jobs: list[_FileJob] = field(default_factory=list)


class _Cancelled(Exception):
    """Raised inside a worker's writer when another file failed: its shard is not committed."""


class TokenizeWorkerDied(RuntimeError):
    """A worker process ended abruptly (killed, out of memory): its file was not committed."""


# ----------------------------------------------------------------------------- reading inputs


def input_kind(path: Path) -> str:
    """``"jsonl"``, ``"parquet"`` or ``"text"``; ``ValueError`` for a suffix that is refused."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".parquet":
        return "parquet"
    if suffix in REFUSED_SUFFIXES:
        raise ValueError(f"{path}: {REFUSED_SUFFIXES[suffix]} input is not supported (use .txt, .jsonl or .parquet)")
    return "text"


def _import_pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet
    except ImportError as error:
        raise ImportError(f"reading Parquet needs the pyarrow package: {INSTALL_HINT}") from error
    return pyarrow.parquet


def _parquet_text_column(path: Path, text_field: str) -> Any:
    """The opened ParquetFile; ValueError when it cannot be read or has no such column."""
    parquet = _import_pyarrow_parquet()
    try:
        file = parquet.ParquetFile(path)
    except OSError:
        raise
    except Exception as error:
        raise ValueError(f"{path}: not a readable Parquet file: {error}") from None
    names = file.schema_arrow.names
    if text_field not in names:
        raise ValueError(f"{path}: no column {text_field!r} (columns: {', '.join(names) or 'none'})")
    return file


def iter_documents(path: Path, text_field: str = "text", kind: str | None = None) -> Iterator[tuple[str, int]]:
    """Yield ``(text, bytes_read_so_far)`` for every document of one input file."""
    kind = kind or input_kind(path)
    if kind == "text":
        raw = path.read_bytes()
        if not raw:
            return  # an empty text file holds no document
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not UTF-8 text (invalid byte at offset {error.start})") from None
        yield text, len(raw)
    elif kind == "jsonl":
        position = 0
        with open(path, "rb") as file:
            for number, line in enumerate(file, 1):
                position += len(line)
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as error:
                    raise ValueError(f"{path}:{number}: not valid JSON: {error}") from None
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{number}: a JSON object was expected, got {type(record).__name__}")
                if text_field not in record:
                    fields = ", ".join(map(str, record)) or "none"
                    raise ValueError(f"{path}:{number}: no field {text_field!r} (fields: {fields})")
                text = record[text_field]
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{number}: field {text_field!r} holds {type(text).__name__}, not a string")
                yield text, position
    elif kind == "parquet":
        file = _parquet_text_column(path, text_field)
        size = path.stat().st_size
        total_rows = max(1, int(file.metadata.num_rows))
        row = 0
        for batch in file.iter_batches(columns=[text_field], batch_size=4096):
            for text in batch.column(0).to_pylist():
                if not isinstance(text, str):
                    what = "null" if text is None else type(text).__name__
                    raise ValueError(f"{path}: row {row} of column {text_field!r} is {what}, not a string")
                row += 1
                yield text, size * row // total_rows
    else:
        raise ValueError(f"unknown input kind {kind!r}")


# ----------------------------------------------------------------------------- tokenizer


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as error:
        raise ImportError(f"tokenizing needs the tokenizers package: {INSTALL_HINT}") from error
    return tokenizers


def load_tokenizer(path: Path) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json``; errors name the file."""
    tokenizers = _tokenizers()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:
        raise ValueError(f"{path}: not a tokenizers tokenizer.json: {error}") from None


def find_eos_id(tokenizer: Any, eos_token: str | None = "auto") -> int | None:
    """The end-of-text id appended after each document (see the module docstring)."""
    if eos_token is None or eos_token == "":
        return None
    if eos_token == "auto":
        for candidate in EOS_CANDIDATES:
            found = tokenizer.token_to_id(candidate)
            if found is not None:
                return int(found)
        return None
    found = tokenizer.token_to_id(eos_token)
    if found is None:
        raise ValueError(f"eos_token {eos_token!r} is not in the tokenizer's vocabulary")
    return int(found)


def train_tokenizer(
    texts_or_files: Iterable[str | Path],
    vocab_size: int,
    out_path: str | os.PathLike[str],
    *,
    text_field: str = "text",
    special_tokens: Sequence[str] = ("<|endoftext|>",),
    min_frequency: int = 2,
) -> Path:
    """Train a byte-level BPE tokenizer (lossless on any text) and save it as ``out_path``.

    Items that are ``Path`` objects are read as inputs (see the module docstring for
    the kinds); ``str`` items are the texts themselves. ``<|endoftext|>`` is added
    as a special token, so ``eos_token="auto"`` finds it. The file is written
    atomically. Takes seconds for a few MB of text.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    minimum = 256 + len(special_tokens) + 1
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum} for a byte-level BPE, got {vocab_size}")
    tokenizers = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts() -> Iterator[str]:
        for item in texts_or_files:
            if isinstance(item, Path):
                for text, _ in iter_documents(item, text_field):
                    yield text
            elif isinstance(item, str):
                yield item
            else:
                raise TypeError(f"texts_or_files must hold str texts or Path files, got {type(item).__name__}")

    tokenizer.train_from_iterator(texts(), trainer=trainer)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tokenizer.save(str(temporary))
    os.replace(temporary, out)
    return out


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]


# ----------------------------------------------------------------------------- one file


def _tokenize_file(
    job: _FileJob,
    settings: _Settings,
    tokenizer: Any,
    report: Callable[[int], object],
    cancelled: Callable[[], bool],
) -> tuple[int, int]:
    """Write ``job``'s shard: (documents, tokens). Raising commits nothing of it."""
    if cancelled():
        raise _Cancelled
    storage = TokenStorage(settings.output, settings.dtype)
    documents = tokens = 0
    reported = 0
    texts: list[str] = []
    characters = 0
    eos = [] if settings.eos_id is None else [settings.eos_id]
    dtype = np.dtype(settings.dtype)
    with contextlib.ExitStack() as stack:
        writer = None

        def flush(position: int) -> None:
            nonlocal writer, documents, tokens, reported, characters
            if cancelled():
                raise _Cancelled
            if texts:
                if writer is None:  # created lazily: an input without documents creates nothing
                    writer = stack.enter_context(storage.sync_writer())
                for ids in _encode(tokenizer, texts):
                    array = np.empty(len(ids) + len(eos), dtype)
                    array[: len(ids)] = ids
                    array[len(ids) :] = eos
                    writer.append(job.shard, array)
                    tokens += array.size
                documents += len(texts)
                texts.clear()
                characters = 0
            report(position - reported)
            reported = position

        position = 0
        for text, position in iter_documents(job.path, settings.text_field, job.kind):
            texts.append(text)
            characters += len(text)
            if len(texts) >= BATCH_DOCUMENTS or characters >= BATCH_CHARACTERS:
                flush(position)
        flush(max(position, job.size))
    return documents, tokens


# ----------------------------------------------------------------------------- worker processes

_worker_tokenizer: Any = None
_worker_settings: _Settings | None = None
_worker_progress: Any = None
_worker_cancel: Any = None


def _init_worker(settings: _Settings, progress: Any, cancel: Any, threads: int) -> None:
    global _worker_tokenizer, _worker_settings, _worker_progress, _worker_cancel
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizer's threads: cores / workers
    _worker_settings = settings
    _worker_progress = progress
    _worker_cancel = cancel
    _worker_tokenizer = load_tokenizer(settings.tokenizer_path)


def _run_in_worker(job: _FileJob) -> tuple[int, int]:
    assert _worker_settings is not None
    return _tokenize_file(job, _worker_settings, _worker_tokenizer, _worker_progress.put, _worker_cancel.is_set)


# ----------------------------------------------------------------------------- planning


def _expand_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    paths: list[Path] = []
    for item in inputs:
        if not isinstance(item, str | os.PathLike):
            raise TypeError(f"inputs must be paths, got {type(item).__name__}")
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix.lower() in DIRECTORY_SUFFIXES and p.is_file())
            if not found:
                raise ValueError(f"input directory {path} holds no {', '.join(DIRECTORY_SUFFIXES)} files")
            paths.extend(found)
        else:
            paths.append(path)
    if not paths:
        raise ValueError("inputs is empty: give at least one input file")
    return sorted(paths, key=str)


def _check_input(path: Path, text_field: str) -> _FileJob:
    kind = input_kind(path)
    if not path.exists():
        raise FileNotFoundError(f"input file not found: {path}")
    if not path.is_file():
        raise ValueError(f"input {path} is not a regular file")
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as error:
        raise type(error)(f"cannot read input file {path}: {error.strerror or error}") from None
    if kind == "parquet":
        _parquet_text_column(path, text_field)
    return _FileJob(shard=-1, path=path, size=path.stat().st_size, kind=kind)


def _choose_dtype(vocab_size: int, requested: object, existing: str | None) -> str:
    if requested is None:
        if existing is not None:
            chosen = existing
        else:
            chosen = "uint16" if vocab_size <= 2**16 else "uint32"
    else:
        try:
            chosen = np.dtype(requested).name  # type: ignore[call-overload]
        except TypeError:
            raise TypeError(f"dtype must be a NumPy integer dtype, got {requested!r}") from None
    if np.dtype(chosen).kind not in "iu" or vocab_size - 1 > np.iinfo(chosen).max:
        raise ValueError(f"dtype {chosen} cannot hold the tokenizer's ids (vocabulary of {vocab_size})")
    return chosen


def _unfinished_storage(output: Path) -> bool:
    """What a writer killed before it published the header leaves: an empty ``shards/`` and ``incomplete/``."""
    names = set(os.listdir(output))
    if not names or not names <= {SHARDS_DIR, INCOMPLETE_DIR}:
        return False
    if any((output / name).is_symlink() or not (output / name).is_dir() for name in names):
        return False
    return SHARDS_DIR not in names or not any((output / SHARDS_DIR).iterdir())


def _plan(
    inputs: Sequence[str | os.PathLike[str]],
    output: Path,
    tokenizer_path: Path,
    text_field: str,
    dtype: object,
    eos_token: str | None,
    skip_existing: bool,
) -> tuple[_Settings, Any, list[Path]]:
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"text_field must be a non-empty string, got {text_field!r}")
    paths = _expand_inputs(inputs)
    duplicates = sorted({str(p) for p in paths if paths.count(p) > 1})
    if duplicates:
        raise ValueError(f"inputs name the same file more than once: {', '.join(duplicates)}")
    jobs = [_check_input(path, text_field) for path in paths]
    jobs = [_FileJob(shard, job.path, job.size, job.kind) for shard, job in enumerate(jobs)]
    if all(job.size == 0 for job in jobs):
        raise ValueError(f"the inputs hold no documents: all {len(jobs)} files are empty")
    tokenizer = load_tokenizer(tokenizer_path)
    is_storage = (output / HEADER_NAME).exists()
    if output.exists() and not output.is_dir():
        raise ValueError(f"output {output} exists and is not a directory")
    if output.is_dir() and not is_storage and not _unfinished_storage(output) and any(output.iterdir()):
        raise ValueError(f"output {output} is a non-empty directory that holds no guideloom storage")
    existing = TokenStorage(output).dtype.name if is_storage else None
    chosen = _choose_dtype(int(tokenizer.get_vocab_size(with_added_tokens=True)), dtype, existing)
    TokenStorage(output, chosen)  # an existing storage of another kind or dtype fails here, before writing
    committed = set(committed_shard_ids(output))
    skipped = [job.path for job in jobs if job.shard in committed]
    if skipped and not skip_existing:
        raise FileExistsError(
            f"{output} already holds {len(skipped)} of the shards to write (first: shard "
            f"{jobs[[job.path for job in jobs].index(skipped[0])].shard} for {skipped[0]}); write to a new "
            "directory, or pass skip_existing / --skip-existing to finish an interrupted run with the same inputs"
        )
    settings = _Settings(
        output=output,
        tokenizer_path=tokenizer_path,
        text_field=text_field,
        dtype=chosen,
        eos_id=find_eos_id(tokenizer, eos_token),
        jobs=[job for job in jobs if job.shard not in committed],
    )
    return settings, tokenizer, skipped


# ----------------------------------------------------------------------------- the run


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="tokenize", file=sys.stderr)


def tokenize_files(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    tokenizer_path: str | os.PathLike[str],
    *,
    workers: int | None = None,
    text_field: str = "text",
    dtype: object = None,
    eos_token: str | None = "auto",
    skip_existing: bool = False,
    progress: bool = True,
) -> TokenizeSummary:
    """Tokenize ``inputs`` into the TokenStorage at ``output``; see the module docstring.

    ``workers`` processes each tokenize whole files; input ``i`` of the sorted list is
    shard ``i``. ``workers=1`` works in the calling process. The default, ``None``,
    means ``min(4, cpu count)`` processes, or the calling process when the inputs
    total less than ``AUTO_PARALLEL_MIN_BYTES`` (8 MiB), where starting processes
    costs more than it saves. The result is the same storage either way.
    """
    started = time.perf_counter()
    automatic = workers is None
    if workers is None:
        workers = min(4, os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    output, tokenizer_path = Path(output), Path(tokenizer_path)
    settings, tokenizer, skipped = _plan(inputs, output, tokenizer_path, text_field, dtype, eos_token, skip_existing)
    jobs = settings.jobs
    results: dict[int, tuple[int, int]] = {}
    total = sum(job.size for job in jobs)
    if automatic and total < AUTO_PARALLEL_MIN_BYTES:
        workers = 1
    processes = 0 if workers == 1 or len(jobs) <= 1 else min(workers, len(jobs))
    bar = _progress_bar(total, progress)
    update: Callable[[int], object] = bar.update if bar is not None else (lambda n: None)
    try:
        if not processes:
            for job in jobs:
                try:
                    results[job.shard] = _tokenize_file(job, settings, tokenizer, update, lambda: False)
                except BaseException as error:
                    _note_committed(error, settings, results)
                    raise
        else:
            _run_pool(jobs, settings, processes, update, results)
    finally:
        if bar is not None:
            bar.close()
    documents = sum(count for count, _ in results.values())
    if documents == 0 and not skipped:
        raise ValueError(f"the inputs hold no documents ({len(jobs)} files read, nothing written)")
    return TokenizeSummary(
        files=len(jobs) + len(skipped),
        documents=documents,
        tokens=sum(count for _, count in results.values()),
        bytes=total,
        seconds=time.perf_counter() - started,
        dtype=settings.dtype,
        eos_id=settings.eos_id,
        shards=tuple(sorted(shard for shard, (count, _) in results.items() if count)),
        empty_files=tuple(job.path for job in jobs if results.get(job.shard, (1, 0))[0] == 0),
        skipped_files=tuple(skipped),
        processes=processes,
    )


def _run_pool(
    jobs: list[_FileJob],
    settings: _Settings,
    workers: int,
    update: Callable[[int], object],
    results: dict[int, tuple[int, int]],
) -> None:
    context = multiprocessing.get_context("spawn")  # no fork: the parent may hold threads (torch, tokenizers)
    progress = context.Queue()
    cancel = context.Event()
    threads = max(1, (os.cpu_count() or 1) // workers)

    def drain() -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                update(progress.get_nowait())

    failure: tuple[_FileJob, BaseException] | None = None
    executor = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_init_worker,
        initargs=(settings, progress, cancel, threads),
    )
    try:
        # the largest files first: the pool stays busy to the end
        futures: dict[Future[tuple[int, int]], _FileJob] = {
            executor.submit(_run_in_worker, job): job for job in sorted(jobs, key=lambda job: -job.size)
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            drain()
            for future in done:
                job = futures[future]
                if future.cancelled():
                    continue
                error = future.exception()
                if error is None:
                    results[job.shard] = future.result()
                elif not isinstance(error, _Cancelled) and failure is None:
                    failure = (job, error)
                    cancel.set()
                    for other in pending:
                        other.cancel()
    except BaseException:
        cancel.set()
        raise
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        drain()
        progress.close()
    if failure is not None:
        job, error = failure
        if isinstance(error, BrokenProcessPool):
            error = TokenizeWorkerDied(
                f"a tokenize worker process died or failed to start ({error}) while shard {job.shard} "
                f"({job.path}) was pending: the shards it was writing were not committed; leftovers in "
                f"{settings.output / 'incomplete'} can be removed with 'guideloom clean'"
            )
        _note_committed(error, settings, results)
        raise error


def _note_committed(error: BaseException, settings: _Settings, results: dict[int, tuple[int, int]]) -> None:
    done = sorted(shard for shard, (count, _) in results.items() if count)
    if isinstance(error, _Cancelled | KeyboardInterrupt):
        return
    if done:
        error.add_note(
            f"{len(done)} of {len(settings.jobs)} shards were committed before the failure (the failed file's "
            "shard was not); fix the input and rerun with --skip-existing (skip_existing=True) to write the rest"
        )
    else:
        error.add_note("no shard of this run was committed")


# ----------------------------------------------------------------------------- command line


CLI_DESCRIPTION = """\
Tokenize text into a guideloom token storage, one shard per input file: the
inputs are sorted and input i becomes shard i, whatever the number of workers.

  .jsonl     one document per line: the string in --text-field (default "text")
  .parquet   one document per row of the --text-field column (needs pyarrow)
  others     UTF-8 text, one document per file (.txt, .md, .py, ...)
  directory  its .txt, .jsonl and .parquet files, recursively

After each document the tokenizer's end-of-text id is appended (<|endoftext|>,
</s>, ... if it has one; --eos-token / --no-eos to choose). Missing or unreadable
files, bad Parquet columns and an existing output are reported before anything
is written. A file that fails (e.g. a JSONL line without the field, reported
with its line number) commits nothing and stops the run with exit status 1;
files finished before stay committed, and --skip-existing after fixing the input
writes only the missing shards.
"""


def add_tokenize_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``guideloom tokenize`` on the CLI's subcommands."""
    command = commands.add_parser(
        "tokenize",
        help="tokenize .txt/.jsonl/.parquet files into a token storage, one shard per file",
        description=CLI_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("inputs", nargs="+", metavar="INPUT", help="input files or directories")
    command.add_argument("output", metavar="OUTPUT", help="the token storage directory to write")
    command.add_argument("--tokenizer", required=True, metavar="TOKENIZER_JSON", help="a tokenizers tokenizer.json")
    command.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: min(4, cpu count), none for inputs under 8 MiB; 1: no processes)",
    )
    command.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text")
    command.add_argument("--dtype", default=None, help="token dtype (default: uint16 if the vocabulary fits)")
    eos = command.add_mutually_exclusive_group()
    eos.add_argument("--eos-token", default="auto", help="token appended after each document (default: auto)")
    eos.add_argument("--no-eos", dest="eos_token", action="store_const", const=None, help="append nothing")
    command.add_argument("--skip-existing", action="store_true", help="skip inputs whose shard is already committed")
    command.add_argument("--quiet", action="store_true", help="no progress bar")
    command.set_defaults(run=_run_command)


def _run_command(arguments: argparse.Namespace) -> int:
    try:
        _tokenizers()
    except ImportError as error:
        print(f"guideloom tokenize: error: {error}", file=sys.stderr)
        return 2
    try:
        summary = tokenize_files(
            arguments.inputs,
            arguments.output,
            arguments.tokenizer,
            workers=arguments.workers,
            text_field=arguments.text_field,
            dtype=arguments.dtype,
            eos_token=arguments.eos_token,
            skip_existing=arguments.skip_existing,
            progress=not arguments.quiet,
        )
    except (ValueError, TypeError, OSError, ImportError, RuntimeError, GuideloomError) as error:
        message = str(error) or type(error).__name__
        for note in getattr(error, "__notes__", []):
            message += f"\n{note}"
        print(f"guideloom tokenize: error: {message}", file=sys.stderr)
        return 1
    print(summary.describe())
    return 0
