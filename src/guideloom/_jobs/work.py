"""What a command's jobs are to the executors: how one job is written, and what crosses back from a worker.

A command (tokenize, import) cuts its inputs into jobs, each writing its own shard ids; a :class:`Work`
says how one job is written and is sent, pickled, to every worker process and Ray task. A job writes the
same shards whoever runs it, and a stopped one commits nothing of its shard in progress.
"""

from __future__ import annotations

import os
import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar


class Job(Protocol):
    """One job: consecutive inputs written, in order, into its own shards."""

    @property
    def size(self) -> int:
        """Its input bytes: what the progress bar counts, and what orders the jobs (the largest first)."""
        ...

    def describe(self) -> str:
        """Its inputs, for messages."""
        ...


class Report(Protocol):
    """How a job tells its progress: ``size`` input bytes read (and ``items`` written) since its last report."""

    def __call__(self, size: int, items: int = 0) -> object: ...


J = TypeVar("J", bound=Job)
R = TypeVar("R")


class Cancelled(Exception):
    """Raised inside a job when another failed: its shard in progress is not committed."""


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker process, attached as the error's ``__cause__``."""

    def __str__(self) -> str:
        return f"\n{self.args[0]}"


def never() -> bool:
    """A job run alone is never cancelled."""
    return False


class Work(ABC, Generic[J, R]):
    """How a command writes one job ``J`` into its shards, with a result ``R`` (what it wrote); picklable."""

    name: ClassVar[str]  #: the command ("tokenize", "import"): the progress bar's label
    unit: ClassVar[str]  #: what one job is called in messages ("group", "job")
    items: ClassVar[str | None] = None  #: what the progress bar counts beside the bytes ("rows"), if anything
    died: ClassVar[type[Exception]]  #: the error of a worker process or Ray task that died

    def default_workers(self) -> int:
        """The worker processes when none are asked for."""
        return self.cores()

    @staticmethod
    def cores() -> int:
        """The machine's cores: the worker processes when none are asked for, unless a command says otherwise."""
        return os.cpu_count() or 1

    def start(self, workers: int) -> None:
        """Called in a worker process before its first job, one of ``workers`` sharing the machine."""
        del workers

    @abstractmethod
    def run(self, job: J, report: Report, cancelled: Callable[[], bool] = never) -> R:
        """Write ``job``; ``cancelled()`` is polled between rows or batches, and True raises :class:`Cancelled`."""

    @abstractmethod
    def run_again(self, job: J) -> tuple[str, Any, str | None]:
        """``job`` where it may have run before (a Ray task retried): going on after what it committed;
        ``("done", result, None)`` or ``("failed", error, traceback)``."""

    @abstractmethod
    def finished(self, job: J, result: R) -> tuple[int, int]:
        """The progress of a job reported whole (by a Ray task): ``(size, items)``."""

    @abstractmethod
    def death(self, how: str, job: J | None) -> str:
        """Why a worker process that died ``how`` ("killed by SIGKILL") writing ``job`` (None: none) failed the run."""


def run_again(work: Work[J, R], job: J) -> tuple[str, Any, str | None]:
    """The Ray task of a job: a module-level function of a Ray-free module, so that Ray's workers import little."""
    return work.run_again(job)


def picklable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling (to cross to the parent process), else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
