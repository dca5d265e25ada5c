"""A loader worker process that died reading a shard truncated under it, reported with the shards it had mapped.

A worker that reads a mapped page past the end of a shard file that shrank is killed by SIGBUS, and
torch reports only "DataLoader worker (pid N) is killed by signal: Bus error ... out of shared
memory". So each worker keeps a small report of the shards it has mapped (rewritten when that set
changes, see ``_shards.mapped_shards``) in a directory of the loader's, and the loader turns torch's
report of a worker's death into a ``CorruptStorageError`` naming those shards: the truncated ones
where their files show it, else all the worker had mapped.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path

from guideloom._core.errors import CorruptStorageError
from guideloom._core.text import plural
from guideloom._shards.mapped_shards import MappedShard, listen

_DEATH = re.compile(
    r"DataLoader worker \(pids?(?:\(s\))? ([0-9, ]+)\) (is killed by signal: ([^.]*)|exited unexpectedly)"
)


class WorkerReports:
    """The directory where a loader's workers report the shards they have mapped; removed with the loader."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="guideloom-workers-"))
        self._remove: Callable[[], object] = weakref.finalize(self, shutil.rmtree, self.directory, True)

    def __getstate__(self) -> dict[str, Path]:
        return {"directory": self.directory}  # a worker started by spawn gets the directory, never its removal

    def __setstate__(self, state: dict[str, Path]) -> None:
        self.directory = state["directory"]
        self._remove = _nothing

    def start_reporting(self) -> None:
        """In a worker process: keep this process's report current from now on."""
        listen(lambda shards: _write_report(self.directory / str(os.getpid()), shards))

    def close(self) -> None:
        self._remove()

    def explain(self, error: RuntimeError, exit_codes: dict[int, int | None]) -> CorruptStorageError | None:
        """The error to raise for torch's report of a worker's death, if the shards its worker had mapped explain it.

        ``exit_codes``: the workers' exit codes by pid (torch's report may not say which signal killed one).
        """
        match = _DEATH.search(str(error))
        if match is None:
            return None
        for pid in [int(pid) for pid in match.group(1).replace(" ", "").split(",") if pid]:
            bus_error = "bus error" in (match.group(3) or "").lower() or exit_codes.get(pid) == -signal.SIGBUS
            mapped = _read_report(self.directory / str(pid))
            truncated = [shard for shard in mapped if 0 <= _size_now(shard.path) < shard.size]
            if not mapped or not (bus_error or truncated):
                continue
            how = "killed by a bus error (SIGBUS)" if bus_error else "lost"
            named = ", ".join(_describe(shard) for shard in truncated or mapped)
            what = "its truncated" if truncated else "the"
            return CorruptStorageError(
                f"DataLoader worker process {pid} was {how} while it had {plural(len(mapped), 'shard')} mapped; "
                f"{what} shards: {named}. A shard file was truncated under the loader (committed shards never "
                "change): run guideloom verify"
            )
        return None


def _nothing() -> None:
    pass


def _write_report(path: Path, shards: list[MappedShard]) -> None:
    temporary = path.with_name(f"{path.name}.part")
    with contextlib.suppress(OSError):  # a report is a courtesy: never fail a read for it
        temporary.write_text("".join(f"{shard.shard}\t{shard.size}\t{shard.path}\n" for shard in shards))
        os.replace(temporary, path)


def _read_report(path: Path) -> list[MappedShard]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    shards = []
    for line in lines:
        shard, size, name = line.split("\t", 2)
        shards.append(MappedShard(int(shard), Path(name), int(size)))
    return shards


def _size_now(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _describe(shard: MappedShard) -> str:
    size = _size_now(shard.path)
    if size < 0:
        return f"shard {shard.shard} ({shard.path}, gone)"
    if size < shard.size:
        return f"shard {shard.shard} ({shard.path}, truncated to {size} of its {shard.size} bytes)"
    return f"shard {shard.shard} ({shard.path})"
