"""Running a planned tokenize run: in this process or in worker processes, and what it wrote."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guideloom._core.checks import check_bool, check_path
from guideloom._core.text import plural
from guideloom._jobs.run import check_workers, run_jobs
from guideloom._remote.object_store import is_url
from guideloom._storage.resumable_write import remove_leftovers
from guideloom._storage.storages import local_path
from guideloom.tokenize._groups import DEFAULT_SHARD_SIZE, SHARDS_PER_GROUP, shard_range
from guideloom.tokenize._plan import PYTHON_NAMES, TokenizePlan, plan_run
from guideloom.tokenize._shard import GroupResult
from guideloom.tokenize._work import TokenizeWork


@dataclass(frozen=True)
class TokenizeSummary:
    """What one tokenize run wrote."""

    files: int  #: input files of this run (skipped ones included)
    documents: int  #: documents written by this run
    tokens: int  #: tokens written by this run (end-of-text ids included)
    bytes: int  #: input bytes read by this run (as stored: compressed bytes for compressed files)
    seconds: float  #: wall time, process start-up included
    dtype: str
    eos_id: int | None
    shards: tuple[int, ...] = ()  #: shard ids committed by this run
    empty_files: tuple[Path, ...] = ()  #: inputs without documents (no shard)
    skipped_files: tuple[Path, ...] = ()  #: inputs whose shards an earlier run finished (``skip_existing``)
    processes: int = 0  #: worker processes started (0: the calling process did the work)
    ray_tasks: int = 0  #: Ray tasks run (``ray=``): one per group of input files
    groups: int = 0  #: groups of input files this run wrote (or finished)
    train_on: str | None = None  #: conversations (``chat=True``): what the loss mask marks; None: text

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        """The run in a few lines, as ``guideloom tokenize`` prints it."""
        workers = plural(self.processes, "worker process", "worker processes")
        where = f"({workers})" if self.processes else "(in this process)"
        if self.ray_tasks:
            where = f"({plural(self.ray_tasks, 'Ray task')})"
        lines = [
            f"tokenized {plural(self.files - len(self.skipped_files), 'file')} ({self.bytes / 2**20:.1f} MiB) into "
            f"{plural(len(self.shards), 'shard')}: {plural(self.documents, 'document')}, "
            f"{plural(self.tokens, 'token')} ({self.dtype}) in {self.seconds:.1f} s = "
            f"{self.tokens_per_second:,.0f} tokens/s {where}",
        ]
        if self.train_on is not None:
            marked = "the assistant's turns" if self.train_on == "assistant" else "every token"
            lines.append(f"one conversation per document, as its chat template renders it; loss mask: {marked}")
        elif self.eos_id is None:
            lines.append("no end-of-text id appended")
        if self.empty_files:
            lines.append(f"{plural(len(self.empty_files), 'input file')} held no documents (no shard)")
        if self.skipped_files:
            whose = "its shards" if len(self.skipped_files) == 1 else "their shards"
            lines.append(f"{plural(len(self.skipped_files), 'input file')} skipped: {whose} already existed")
        return "\n".join(lines)


def _committed_by_run(plan: TokenizePlan, results: dict[int, GroupResult]) -> int:
    """How many shards this run committed: counted in the storage, since a failed group reports none."""
    groups = {job.group for job in plan.jobs}
    try:
        listed = plan.settings.storage().committed_shards()
    except Exception:  # the storage cannot be listed now: what the finished groups reported
        return sum(len(result.shards) for result in results.values())
    ours = sum(1 for shard in listed if shard // SHARDS_PER_GROUP in groups)
    return ours - sum(job.resume.shards for job in plan.jobs)


def _note_committed(error: BaseException, plan: TokenizePlan, results: dict[int, GroupResult]) -> None:
    """Say on the error what the run committed before it failed, and how to finish it."""
    done = _committed_by_run(plan, results)
    if done:
        verb = "was" if done == 1 else "were"
        error.add_note(
            f"{plural(done, 'shard')} {verb} committed before the failure (the shard in progress was not); "
            f"fix the input and rerun with {plan.names.skip_existing} to write the rest"
        )
    else:
        error.add_note("no shard of this run was committed")


def execute(
    plan: TokenizePlan, workers: int | None, progress: bool, started: float | None = None, ray: bool | str = False
) -> TokenizeSummary:
    """Write the planned shards with ``workers`` processes or as Ray tasks (see :func:`tokenize_files`)."""
    started = time.perf_counter() if started is None else started
    jobs = plan.jobs
    work = TokenizeWork(plan.settings, plan.tokenizer)
    executed = run_jobs(
        work, jobs, workers, ray, progress, plan.names, lambda error, results: _note_committed(error, plan, results)
    )
    results = executed.results.values()
    if ray is not False and jobs and isinstance(plan.settings.output, Path):  # a URL's uploads leave nothing behind
        remove_leftovers(plan.settings.storage().incomplete_files_dir(), *shard_range(jobs))  # of killed attempts
    documents = sum(result.documents for result in results)
    files = sum(len(job.files) for job in jobs)
    resumed = any(job.resume.shards for job in jobs)
    if documents == 0 and not plan.skipped and not resumed:
        raise ValueError(f"the inputs hold no documents ({plural(files, 'file')} read, nothing written)")
    storage = plan.settings.storage()
    if storage.is_remote:  # readers of a large remote storage then list only what is committed after this run
        storage.write_index()
    return TokenizeSummary(
        files=files + len(plan.skipped),
        documents=documents,
        tokens=sum(result.tokens for result in results),
        bytes=sum(job.size for job in jobs),
        seconds=time.perf_counter() - started,
        dtype=plan.settings.dtype,
        eos_id=plan.settings.eos_id,
        train_on=plan.settings.train_on,
        shards=tuple(sorted(shard for result in results for shard in result.shards)),
        empty_files=tuple(sorted(path for result in results for path in result.empty_files)),
        skipped_files=tuple(plan.skipped),
        processes=executed.processes,
        ray_tasks=len(jobs) if ray is not False else 0,
        groups=len(jobs),
    )


def tokenize_files(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    tokenizer_path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    workers: int | None = None,
    text_field: str = "text",
    dtype: object = None,
    eos_token: str | None = "auto",
    skip_existing: bool = False,
    progress: bool = True,
    ray: bool | str = False,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    chat: bool = False,
    train_on: str = "assistant",
) -> TokenizeSummary:
    """Tokenize ``inputs`` into the TokenStorage at ``output`` in shards of ``shard_size`` (see ``guideloom.tokenize``).

    ``output`` may be a storage URL, with fsspec's ``storage_options`` (see docs/object-storage.md).

    ``shard_size`` is the bytes of token ids after which a shard is committed (an int, or a string such
    as ``"64MiB"``; default 256 MiB): the sorted inputs are cut into groups of consecutive files of at
    least that many input bytes, and group ``g`` writes shards ``g * 10**6``, ``+ 1``, ...
    ``workers`` processes each tokenize whole groups; ``workers=1`` works in the calling process. The
    default, ``None``, means ``min(4, cpu count)`` processes, or the calling process when the inputs
    total less than 8 MiB, where starting processes costs more than it saves. ``ray=True`` (or a cluster
    address) runs one Ray task per group instead (needs the ``ray`` extra; excludes ``workers``). The
    result is the same storage either way.

    ``chat=True`` reads conversations instead of text: rows of JSONL or Parquet files with a ``messages``
    field, rendered with the chat template of the Hugging Face tokenizer directory ``tokenizer_path``, into
    a masked token storage whose mask marks the assistant's turns (``train_on="assistant"``) or every
    token (``train_on="all"``); needs the ``chat`` extra (see docs/conversations.md). Conversation files
    are grouped into shards as text files are.
    """
    started = time.perf_counter()
    check_workers(workers, PYTHON_NAMES.workers)
    skip_existing = check_bool("skip_existing", skip_existing)
    progress = check_bool("progress", progress)
    chat = check_bool("chat", chat)
    plan = plan_run(
        inputs,
        output if isinstance(output, str) and is_url(output) else local_path(output, "output"),
        check_path(PYTHON_NAMES.tokenizer, tokenizer_path),
        storage_options=storage_options,
        text_field=text_field,
        dtype=dtype,
        eos_token=eos_token,
        skip_existing=skip_existing,
        shard_size=shard_size,
        train_on=train_on if chat else None,
        names=PYTHON_NAMES,
    )
    return execute(plan, workers, progress, started, ray)
