"""Fault injection for writers: a forked child writes a storage and dies by SIGKILL at an injected instant.

Run as a script, from the repository (the tests and ``tests/stress/run_fault_injection.py`` do)::

    python -m tests.hardening.fault_injection.harness --cases 40 --seed 7 --root DIR \
        [--modes line,call,delay,pair] [--exhaustive]

The harness imports guideloom once and forks one child per case, so a case costs milliseconds. A
child runs the same write workload every time (shards 2, 3, 4 by one writer with an early commit,
an aborted writer of shard 6, then shard 5 by another writer, onto a storage that already holds
shards 0 and 1, or onto a fresh directory so the header is created too) and is killed:

``line``  at the k-th line executed inside the guideloom package (``sys.settrace``), k uniform over
          a full run's count: before or after any statement of the writer, header creation included;
``call``  just before or just after the k-th call of ``os.fsync``, ``os.link``, ``os.unlink``,
          ``open``, ``os.open``, ``os.close``, ``os.mkdir`` (``--exhaustive`` adds every such instant);
``delay`` by the harness, after a random delay within a full run's duration;
``pair``  the same, while a second child writes other shards (10, 11) of the storage, which must
          complete;
``clean`` the same, while a second child runs ``clean_leftovers(older_than=0)`` and takes readers'
          snapshots in a loop: it deletes the killed writer's unfinished files, and may delete a live
          one's (which then fails that shard with FileNotFoundError: committed shards need not then
          be a prefix of the commit order), but never a committed shard.

After each case the harness checks, in this process: the storage opens (or, for a fresh one whose
header was never published, is ``StorageNotFoundError`` with no shard anywhere); the visible shards
are the base ones plus a prefix of the commit order, each file byte-identical to an undisturbed
run's, and nothing else is in ``shards/`` (a writer killed after its link committed its shard: the
file under its name is the commit); every record reads back equal and ``verify()`` is empty; the
shards not committed (the interrupted one included) can be written afresh, after which the whole
storage equals the undisturbed one byte for byte; ``clean_leftovers(older_than=0)`` empties ``incomplete/``.

Output: one JSON line per case, then ``{"summary": ...}``. Exit status 1 if a case failed.
"""

from __future__ import annotations

import argparse
import builtins
import functools
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import guideloom
from guideloom import StorageNotFoundError
from guideloom._shards.header import HEADER_NAME
from guideloom._shards.layout import committed_shard_ids, shard_file_name
from guideloom._storage.storages import AnyFormatStorage
from tests.helpers.batches import comparable
from tests.helpers.storages import committed_shards, open_storage

BASE = (0, 1)
SEQUENCE = (2, 3, 4, 5)  # the commit order of the workload
ABORTED = 6
PARTNER = (10, 11)
KINDS = ("documents", "tokens")
CALL_POINTS = {
    "os.fsync": (os, "fsync"),
    "os.link": (os, "link"),
    "os.unlink": (os, "unlink"),
    "open": (builtins, "open"),
    "os.open": (os, "open"),
    "os.close": (os, "close"),
    "os.mkdir": (os, "mkdir"),
}
PACKAGE = str(Path(guideloom.__file__).resolve().parent)
RECORD_COUNTS = {0: 6, 1: 9, 2: 12, 3: 30, 4: 5, 5: 120, 6: 10, 10: 40, 11: 25}


@functools.cache
def records(kind: str, shard: int) -> tuple[Any, ...]:
    """The records a shard holds: random sizes (empty ones included), fixed per (kind, shard)."""
    rng = np.random.default_rng([shard, KINDS.index(kind)])
    sizes = rng.integers(0, 700, RECORD_COUNTS[shard])
    sizes[::7] = 0
    if kind == "tokens":
        return tuple(rng.integers(0, 2**16, int(size), dtype=np.uint16) for size in sizes // 3)
    return tuple(rng.bytes(int(size)) for size in sizes)


def expected_records(kind: str, shards: list[int]) -> list[Any]:
    return [comparable(record) for shard in shards for record in records(kind, shard)]


class _Abort(Exception):
    pass


def workload(path: Path, kind: str) -> None:
    """What a killed child runs: commits SEQUENCE in this order, around an aborted writer of ABORTED."""
    storage = open_storage(path, kind)
    two, three, four = records(kind, 2), records(kind, 3), records(kind, 4)
    with storage.sync_writer() as writer:
        for index in range(len(two)):  # two shards interleaved, one committed early
            writer.append(2, two[index])
            writer.append(3, three[index])
        writer.commit(2)
        for index in range(len(two), len(three)):  # shard 3 interleaved with shard 4
            writer.append(3, three[index])
            if index - len(two) < len(four):
                writer.append(4, four[index - len(two)])
        writer.commit(3)
    # leaving the block committed shard 4
    try:
        with storage.sync_writer() as writer:
            for record in records(kind, ABORTED):
                writer.append(ABORTED, record)
            raise _Abort
    except _Abort:
        pass
    with storage.sync_writer() as writer:
        for record in records(kind, 5):
            writer.append(5, record)


def clean_workload(path: Path, kind: str) -> None:
    """``guideloom clean --older-than 0`` and readers' snapshots beside the writer, until the harness says stop."""
    stop = path.parent / "stop"
    while not stop.exists():
        try:
            storage = AnyFormatStorage(path)
            storage.clean_leftovers(older_than=0)
            storage.committed_shards()
        except StorageNotFoundError:  # a fresh storage whose header is not there yet
            pass
        time.sleep(0.001)


def partner_workload(path: Path, kind: str) -> None:
    """Another writer, in parallel, of other shards."""
    storage = open_storage(path, kind)
    ten, eleven = records(kind, 10), records(kind, 11)
    with storage.sync_writer() as writer:
        for index in range(max(len(ten), len(eleven))):
            if index < len(ten):
                writer.append(10, ten[index])
            if index < len(eleven):
                writer.append(11, eleven[index])


def write_base(path: Path, kind: str) -> None:
    with open_storage(path, kind).sync_writer() as writer:
        for shard in BASE:
            for record in records(kind, shard):
                writer.append(shard, record)


# ----------------------------------------------------------------------------- the child


def _die(report: int, where: str) -> None:
    os.write(report, json.dumps({"killed_at": where}).encode())
    os.kill(os.getpid(), signal.SIGKILL)


def _install_line_trace(report: int, kill_at: int | None, counts: Counter[str]) -> None:
    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            counts["lines"] += 1
            if counts["lines"] == kill_at:
                _die(report, f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}")
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    sys.settrace(calls)


def _install_call_points(report: int, target: tuple[str, int, str] | None, counts: Counter[str]) -> None:
    for name, (owner, attribute) in CALL_POINTS.items():
        original = getattr(owner, attribute)

        def wrapper(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] += 1
            hit = target is not None and target[0] == _name and target[1] == counts[_name]
            caller = sys._getframe(1)
            where = f"{_name}#{counts[_name]} in {Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
            if hit and target is not None and target[2] == "before":
                _die(report, f"before {where}")
            result = _original(*args, **kwargs)
            if hit and target is not None and target[2] == "after":
                _die(report, f"after {where}")
            return result

        setattr(owner, attribute, wrapper)


def fork_child(job: Any, path: Path, kind: str, injection: tuple[Any, ...]) -> tuple[int, int]:
    """Fork a child running ``job``; it reports counts (or where it was killed) through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.close(read_end)
            counts: Counter[str] = Counter()
            if injection[0] == "line":
                _install_line_trace(write_end, injection[1], counts)
            elif injection[0] == "call":
                _install_call_points(write_end, injection[1], counts)
            elif injection[0] == "count":
                _install_call_points(write_end, None, counts)
                _install_line_trace(write_end, None, counts)
            started = time.perf_counter()
            job(path, kind)
            sys.settrace(None)
            counts["microseconds"] = int((time.perf_counter() - started) * 1e6)
            os.write(write_end, json.dumps({"counts": dict(counts)}).encode())
        except BaseException:
            os.write(write_end, json.dumps({"error": traceback.format_exc()}).encode())
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    return pid, read_end


def reap(pid: int, read_end: int) -> tuple[int, dict[str, Any]]:
    """Wait for a child: (wait status, what it reported)."""
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    report = json.loads(b"".join(chunks) or b"{}")
    return status, report


# ----------------------------------------------------------------------------- the checks


def reference_bytes(root: Path, kind: str) -> dict[int, bytes]:
    """Shard files of an undisturbed run (base, workload, partner)."""
    path = root / f"reference-{kind}"
    write_base(path, kind)
    for job in (workload, partner_workload):
        status, report = reap(*fork_child(job, path, kind, ("none",)))
        assert status == 0, report
    return {shard: (path / "shards" / shard_file_name(shard)).read_bytes() for shard in committed_shard_ids(path)}


def check_storage(
    path: Path, kind: str, fresh: bool, reference: dict[int, bytes], partner_done: bool, in_order: bool = True
) -> list[int]:
    """The checks after a kill (see the module docstring); the shards that were visible."""
    shards_dir = path / "shards"
    names = sorted(os.listdir(shards_dir)) if shards_dir.is_dir() else []
    base = [] if fresh else list(BASE)
    if not (path / HEADER_NAME).exists():
        assert fresh, "the header of an existing storage is gone"
        assert names == [], f"shards without a header: {names}"
        try:
            open_storage(path, kind).sync_reader()
        except StorageNotFoundError:
            pass
        else:
            raise AssertionError("a storage without header opened")
        visible: list[int] = []
    else:
        visible = committed_shards(path)
        assert names == sorted(map(shard_file_name, visible)), f"unexpected names in shards/: {names}"
        own = [shard for shard in visible if shard in SEQUENCE]
        if in_order:
            assert own == list(SEQUENCE[: len(own)]), f"shards {own} are not a prefix of the commit order"
        assert set(base) <= set(visible) <= set(BASE) | set(SEQUENCE) | set(PARTNER), f"visible: {visible}"
        if partner_done:
            assert set(PARTNER) <= set(visible), "the surviving writer's shards are missing"
        for shard in visible:
            data = (shards_dir / shard_file_name(shard)).read_bytes()
            assert data == reference[shard], f"shard {shard} differs from an undisturbed run's"
        storage = open_storage(path, kind)
        with storage.sync_reader() as reader:
            got = [comparable(record) for record in reader]
        expected = [comparable(record) for shard in visible for record in records(kind, shard)]
        assert got == expected, "records read back differ"
        assert storage.verify() == [], "verify found damage"
    # write what is missing, the interrupted shard included
    storage = open_storage(path, kind)
    missing = [shard for shard in [*BASE, *SEQUENCE] if shard not in visible]
    with storage.sync_writer() as writer:
        for shard in missing:
            for record in records(kind, shard):
                writer.append(shard, record)
    final = committed_shards(path)
    wanted = sorted({*BASE, *SEQUENCE} | (set(PARTNER) & set(visible)))
    assert final == wanted, f"after rewriting: {final}"
    assert sorted(os.listdir(shards_dir)) == list(map(shard_file_name, final)), "a file in shards/ is not committed"
    for shard in final:
        assert (shards_dir / shard_file_name(shard)).read_bytes() == reference[shard], f"rewritten {shard} differs"
    assert storage.verify() == []
    storage.clean_leftovers(older_than=0)
    assert os.listdir(path / "incomplete") == [], "leftovers survive clean_leftovers"
    return visible


# ----------------------------------------------------------------------------- cases


def plan_cases(
    count: int, seed: int, modes: list[str], exhaustive: bool, profiles: dict[Any, Any]
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = []
    if exhaustive:
        for (kind, fresh), profile in sorted(profiles.items()):
            for name in CALL_POINTS:
                for k in range(1, profile.get(name, 0) + 1):
                    for when in ("before", "after"):
                        cases.append({"mode": "call", "kind": kind, "fresh": fresh, "target": [name, k, when]})
    for index in range(count):
        mode = modes[index % len(modes)]
        kind = KINDS[(index // len(modes)) % len(KINDS)]
        fresh = rng.random() < 0.3
        profile = profiles[(kind, fresh)]
        case: dict[str, Any] = {"mode": mode, "kind": kind, "fresh": fresh}
        if mode == "line":
            case["kill_at"] = rng.randint(1, profile["lines"])
        elif mode == "call":
            instants = [(name, k) for name in CALL_POINTS for k in range(1, profile.get(name, 0) + 1)]
            name, k = rng.choice(instants)
            case["target"] = [name, k, rng.choice(["before", "after"])]
        else:
            case["delay"] = rng.uniform(0, 1.2 * profile["microseconds"] / 1e6)
        cases.append(case)
    return cases


def run_case(
    root: Path, case: dict[str, Any], templates: dict[str, Path], reference: dict[int, bytes]
) -> dict[str, Any]:
    kind, fresh = case["kind"], case["fresh"]
    path = root / "storage"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    if not fresh:
        shutil.copytree(templates[kind], path)
    partner_done = False
    if case["mode"] == "line":
        status, report = reap(*fork_child(workload, path, kind, ("line", case["kill_at"])))
    elif case["mode"] == "call":
        status, report = reap(*fork_child(workload, path, kind, ("call", tuple(case["target"]))))
    else:
        if case["mode"] in ("pair", "clean"):
            partner = fork_child(partner_workload if case["mode"] == "pair" else clean_workload, path, kind, ("none",))
        pid, read_end = fork_child(workload, path, kind, ("none",))
        time.sleep(case["delay"])
        os.kill(pid, signal.SIGKILL)
        status, report = reap(pid, read_end)
        (root / "stop").touch()
        if case["mode"] in ("pair", "clean"):
            partner_status, partner_report = reap(*partner)
            assert partner_status == 0, f"the other child failed: {partner_report}"
            partner_done = case["mode"] == "pair"
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    cleaned_away = case["mode"] == "clean" and "FileNotFoundError" in report.get("error", "")
    if not killed and not cleaned_away:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child failed: {report}"
    visible = check_storage(path, kind, fresh, reference, partner_done, in_order=not cleaned_away)
    return {"killed": killed, "killed_at": report.get("killed_at"), "visible": visible, "cleaned_away": cleaned_away}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="line,call,delay,pair,clean")
    parser.add_argument("--exhaustive", action="store_true", help="also every call instant, before and after")
    parser.add_argument("--root", type=Path, default=None, help="scratch directory (default: a temporary one)")
    arguments = parser.parse_args(argv)
    root = arguments.root or Path(tempfile.mkdtemp(prefix="guideloom-kill-"))
    root.mkdir(parents=True, exist_ok=True)
    templates, references, profiles = {}, {}, {}
    for kind in KINDS:
        templates[kind] = root / f"template-{kind}"
        write_base(templates[kind], kind)
        references[kind] = reference_bytes(root, kind)
        for fresh in (False, True):
            path = root / f"profile-{kind}-{fresh}" / "storage"
            path.parent.mkdir()
            if not fresh:
                shutil.copytree(templates[kind], path)
            status, report = reap(*fork_child(workload, path, kind, ("count",)))
            assert status == 0, report
            profiles[(kind, fresh)] = report["counts"]
            shutil.rmtree(path)  # once more, uninstrumented: how long a real run takes
            if not fresh:
                shutil.copytree(templates[kind], path)
            status, report = reap(*fork_child(workload, path, kind, ("none",)))
            assert status == 0, report
            profiles[(kind, fresh)]["microseconds"] = report["counts"]["microseconds"]
    cases = plan_cases(arguments.cases, arguments.seed, arguments.modes.split(","), arguments.exhaustive, profiles)
    totals: Counter[str] = Counter()
    places: set[str] = set()
    for number, case in enumerate(cases):
        try:
            outcome = run_case(root / "case", case, templates, references[case["kind"]])
            outcome["ok"] = True
        except Exception:
            outcome = {"ok": False, "error": traceback.format_exc()}
        totals["cases"] += 1
        totals[f"mode {case['mode']}"] += 1
        totals["killed"] += bool(outcome.get("killed"))
        totals["unfinished files cleaned away"] += bool(outcome.get("cleaned_away"))
        totals["failures"] += not outcome["ok"]
        if outcome.get("killed_at"):
            places.add(outcome["killed_at"].split("#")[0] if case["mode"] == "call" else outcome["killed_at"])
        print(json.dumps({"case": number, **case, **outcome}), flush=True)
    totals["distinct kill places"] = len(places)
    profile = {f"{kind}{'/fresh' if fresh else ''}": counts for (kind, fresh), counts in profiles.items()}
    print(json.dumps({"summary": dict(totals), "profiles": profile}), flush=True)
    if arguments.root is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if totals["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
