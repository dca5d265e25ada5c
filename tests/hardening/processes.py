"""Process probes for the hardening campaigns: child processes, memory, descriptors, shared memory (from /proc)."""

from __future__ import annotations

import os
import re
from pathlib import Path


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
