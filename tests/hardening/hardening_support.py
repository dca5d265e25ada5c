"""What the hardening campaigns share: a campaign tally, a raw-bytes format, process probes.

The CI tests in this directory and the long runs in ``tests/stress/`` use the same code with
different case counts. Each campaign adds its figures with :func:`tally`; the conftest prints
them at the end of the session (also without ``-s``), and stress scripts print them themselves.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from guideloom import DocumentStorage, TokenStorage
from guideloom.types import DocumentStorageFormat

HERE = Path(__file__).resolve().parent

# campaign name -> counter of what was tried / found
CAMPAIGNS: dict[str, Counter[str]] = {}


def tally(campaign: str, **counts: int) -> None:
    """Add figures to a campaign's tally (e.g. ``cases=30, failures=0``)."""
    CAMPAIGNS.setdefault(campaign, Counter()).update(counts)


def tally_max(campaign: str, **values: int) -> None:
    """Keep the largest value seen for each figure (e.g. the slowest error, in milliseconds)."""
    counter = CAMPAIGNS.setdefault(campaign, Counter())
    for key, value in values.items():
        counter[key] = max(counter[key], value)


def summary_lines() -> list[str]:
    lines = []
    for campaign in sorted(CAMPAIGNS):
        figures = ", ".join(f"{key} {value}" for key, value in sorted(CAMPAIGNS[campaign].items()))
        lines.append(f"{campaign}: {figures}")
    return lines


class RawFormat(DocumentStorageFormat[bytes, bytes]):
    """Records are the bytes themselves: decoding can never fail, so only the storage is tested."""

    name = "raw-bytes"

    def pack(self, data: bytes) -> bytes:
        return bytes(data)

    def unpack(self, encoded_data: memoryview, shard: int) -> bytes:
        return bytes(encoded_data)


def open_storage(path: Path, kind: str) -> Any:
    """The storage of a hardening fixture: raw-bytes documents or uint16 tokens."""
    return TokenStorage(path, "uint16") if kind == "tokens" else DocumentStorage(path, RawFormat())


def comparable(record: Any) -> Any:
    """A read record in a form that compares by value (token arrays as lists)."""
    return record.tolist() if hasattr(record, "tolist") else record


# ----------------------------------------------------------------------------- processes and memory


def children(pid: int | None = None) -> set[int]:
    """Direct child processes (every thread's children, from /proc)."""
    pid = os.getpid() if pid is None else pid
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            found.update(int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def descendants(pid: int | None = None) -> set[int]:
    """Every process below ``pid`` (children, grandchildren, ...)."""
    pending, found = list(children(pid)), set()
    while pending:
        child = pending.pop()
        if child not in found:
            found.add(child)
            pending.extend(children(child))
    return found


def rss_anon_kib(pid: int | None = None) -> int:
    """The process's anonymous resident memory (RssAnon of /proc/PID/status), in KiB; 0 if it is gone."""
    pid = os.getpid() if pid is None else pid
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    match = re.search(r"^RssAnon:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def pss_anon_kib(pid: int | None = None) -> int:
    """The process's proportional share of anonymous memory (Pss_Anon of smaps_rollup), in KiB.

    Unlike RssAnon, pages a forked worker still shares copy-on-write with its parent count once
    in the sum over the processes. Falls back to RssAnon where smaps_rollup lacks the field.
    """
    pid = os.getpid() if pid is None else pid
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return rss_anon_kib(pid)
    match = re.search(r"^Pss_Anon:\s+(\d+) kB", rollup, re.MULTILINE)
    return int(match.group(1)) if match else rss_anon_kib(pid)


def open_descriptors(pid: int | None = None) -> int:
    pid = os.getpid() if pid is None else pid
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return 0


def shm_entries() -> set[str]:
    """Names in /dev/shm (shared memory segments and torch's files)."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()
