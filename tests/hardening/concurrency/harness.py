"""Writers racing: forked processes commit the same shard, or create one storage with different formats.

    python -m tests.hardening.concurrency.harness --rounds 150 --seed 1 --root DIR

Each round forks 2 or 3 writer processes that wait on a common barrier (a pipe the harness opens
once they are all ready), placed either before their first append (the race is then on the
writer's "already committed?" check as well as on the commit) or between their appends and their
commit. Their records name the writer, so the winner's content is recognisable. Kinds of round:

``shard``   one storage, a new shard id per round: exactly one writer exits 0, every other gets
            ``ShardExistsError``; the shard holds exactly the winner's records, ``verify()`` is
            empty and ``incomplete/`` holds nothing (losers clean up after themselves);
``fresh``   the same on a directory that does not exist yet, so the header is created in the race;
``format``  a fresh directory, each writer with another format: exactly one header wins, the
            others get ``FormatMismatchError`` and commit nothing.

Prints one JSON line per round that failed and ``{"summary": ...}``; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from guideloom import DocumentStorage, FormatMismatchError, ShardExistsError
from tests.helpers.storages import RawFormat

WON, LOST, MISMATCH = 0, 3, 4


def format_for(kind: str, writer: int) -> RawFormat:
    """The raw-bytes format, or in ``format`` rounds one of another identity per writer."""
    if kind != "format":
        return RawFormat()
    return type(f"RawFormat{writer}", (RawFormat,), {"name": f"raw-bytes-{writer}"})()


def records_of(writer: int, shard: int, count: int) -> list[bytes]:
    return [f"writer {writer} shard {shard} record {index} ".encode() * (1 + index % 9) for index in range(count)]


def racer(path: Path, writer: int, shard: int, count: int, barrier: str, go: int, ready: int, kind: str) -> int:
    records = records_of(writer, shard, count)
    os.write(ready, b"r")
    try:
        if barrier == "before-append":
            os.read(go, 1)
        storage = DocumentStorage(path, format_for(kind, writer))
        with storage.sync_writer() as sink:
            for record in records:
                sink.append(shard, record)
            if barrier == "before-commit":
                os.read(go, 1)
    except ShardExistsError:
        return LOST
    except FormatMismatchError:
        return MISMATCH
    return WON


def run_round(root: Path, number: int, kind: str, rng: random.Random) -> dict[str, Any]:
    path = root / ("shared" if kind == "shard" else f"fresh-{number}")
    shard = number if kind == "shard" else 0
    writers = rng.choice([2, 2, 3])
    # in format rounds the race is on the header, which the first append creates
    barrier = "before-append" if kind == "format" else rng.choice(["before-append", "before-commit"])
    counts = [rng.randint(1, 40) for _ in range(writers)]
    go_read, go_write = os.pipe()
    ready_read, ready_write = os.pipe()
    pids = []
    for writer in range(writers):
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.close(go_write)
                status = racer(path, writer, shard, counts[writer], barrier, go_read, ready_write, kind)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        pids.append(pid)
    os.close(go_read)
    os.close(ready_write)
    signal.alarm(60)  # a writer that dies before the barrier must not hang the harness
    try:
        for _ in range(writers):
            assert os.read(ready_read, 1) == b"r", "a writer died before the barrier"
    finally:
        signal.alarm(0)
    os.write(go_write, b"g" * writers)
    os.close(go_write)
    os.close(ready_read)
    statuses = []
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        statuses.append(os.waitstatus_to_exitcode(status))
    winners = [writer for writer, status in enumerate(statuses) if status == WON]
    assert len(winners) == 1, f"statuses {statuses}: not exactly one winner"
    loser_status = MISMATCH if kind == "format" else LOST
    assert all(status in (WON, loser_status) for status in statuses), f"statuses {statuses}"
    (winner,) = winners
    storage = DocumentStorage(path, format_for(kind, winner))
    with storage.sync_reader() as reader:
        shard_ids = [file.id for file in reader.shards]
        mine = [record for record, file in zip_records(reader) if file == shard]
    assert shard in shard_ids, "the winner's shard is missing"
    assert mine == records_of(winner, shard, counts[winner]), "the shard does not hold exactly the winner's records"
    assert storage.verify() == []
    assert os.listdir(path / "incomplete") == [], "a loser left its file behind"
    if kind != "shard":
        assert shard_ids == [0]
        shutil.rmtree(path)
    return {"writers": writers, "barrier": barrier, "winner": winner}


def zip_records(reader: Any) -> list[tuple[bytes, int]]:
    found = []
    for index in range(len(reader)):
        encoded, shard = reader.read_encoded(index)
        found.append((bytes(encoded), shard))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", type=Path, default=None)
    arguments = parser.parse_args(argv)
    root = arguments.root or Path(tempfile.mkdtemp(prefix="guideloom-race-"))
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(arguments.seed)
    totals: Counter[str] = Counter()
    for number in range(arguments.rounds):
        kind = ["shard", "shard", "fresh", "format"][number % 4]
        try:
            outcome = run_round(root, number, kind, rng)
            totals[f"rounds {kind}"] += 1
            totals[f"winner {outcome['winner']}"] += 1
            totals[f"{outcome['writers']} writers"] += 1
        except Exception:
            totals["failures"] += 1
            print(json.dumps({"round": number, "kind": kind, "error": traceback.format_exc()}), flush=True)
        totals["rounds"] += 1
    print(json.dumps({"summary": dict(totals)}), flush=True)
    if arguments.root is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if totals["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
