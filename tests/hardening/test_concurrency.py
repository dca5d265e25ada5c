"""Concurrency: readers and loaders opened while writers commit see consistent snapshots; racing writers.

A reader opened at time t sees exactly the shards committed before t: every shard whose commit had
returned before it opened, possibly the ones whose commit was in progress at that instant, and
nothing else; each of them whole (every record reads back exactly) and, per writer, a prefix of
its commit order. A loader pins its snapshot for its workers, even while commits go on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hardening_support import HERE, RawFormat, tally
from snapshot_writer import shard_records

from guideloom import DocumentStorage, StatefulDataLoader

SEED = int(os.environ.get("GUIDELOOM_HARDENING_SEED", "20261129"))
WRITERS = 3
SHARDS_PER_WRITER = 40


def committed(logs: list[Path]) -> list[set[int]]:
    """Per writer, the shards whose commit has returned (as logged so far)."""
    found = []
    for log in logs:
        text = log.read_text() if log.exists() else ""
        found.append({int(line) for line in text.splitlines() if line.strip()})  # a partial last line is rare
    return found


def check_snapshot(seen: list[int], before: list[set[int]], after: list[set[int]]) -> None:
    for worker in range(WRITERS):
        mine = sorted(shard for shard in seen if shard % WRITERS == worker)
        assert mine == [worker + WRITERS * number for number in range(len(mine))], f"writer {worker}: {mine}"
        assert before[worker] <= set(mine), f"writer {worker}: committed {sorted(before[worker] - set(mine))} unseen"
        in_flight = worker + WRITERS * len(after[worker])  # committing while the reader opened
        assert set(mine) <= after[worker] | {in_flight}, f"writer {worker}: saw {sorted(set(mine) - after[worker])}"


def by_shard(reader: Any) -> dict[int, list[bytes]]:
    found: dict[int, list[bytes]] = {}
    for index in range(len(reader)):
        encoded, shard = reader.read_encoded(index)
        found.setdefault(shard, []).append(bytes(encoded))
    return found


@pytest.mark.timeout(180)
def test_readers_and_loaders_see_consistent_snapshots_while_writers_commit(tmp_path: Path) -> None:
    path = tmp_path / "storage"
    storage = DocumentStorage(path, RawFormat())
    with storage.sync_writer():
        pass  # the header exists before the readers start
    logs = [tmp_path / f"writer-{worker}.log" for worker in range(WRITERS)]
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "snapshot_writer.py"),
                str(path),
                str(worker),
                str(WRITERS),
                str(SHARDS_PER_WRITER),
                str(logs[worker]),
                "0.02",
            ]
        )
        for worker in range(WRITERS)
    ]
    snapshots = loaders = verified = 0
    try:
        while True:
            running = any(writer.poll() is None for writer in writers)
            before = committed(logs)
            if snapshots % 10 == 5 and loaders < 4 and any(before):  # a loader with workers, pinned meanwhile
                with StatefulDataLoader.from_storage(
                    storage, device="cpu", local_batch_size=3, num_workers=2, shuffle=True
                ) as loader:
                    pinned = list(loader._source.shard_ids)
                    check_snapshot(pinned, before, committed(logs))
                    time.sleep(0.05)  # more commits land before the workers start
                    served = sorted(record for batch in loader for record in batch)
                assert served == sorted(record for shard in pinned for record in shard_records(shard))
                loaders += 1
            with storage.sync_reader() as reader:
                after = committed(logs)
                seen = [shard.id for shard in reader.shards]
                check_snapshot(seen, before, after)
                records = by_shard(reader)
                assert records == {shard: shard_records(shard) for shard in seen if shard_records(shard)}
                if snapshots % 25 == 0:
                    assert reader.verify() == []
                    verified += 1
            snapshots += 1
            if not running:
                break
    finally:
        for writer in writers:
            writer.wait(timeout=120)
    assert [writer.returncode for writer in writers] == [0] * WRITERS
    assert snapshots >= 20 and loaders >= 2, (snapshots, loaders)
    tally("concurrency: snapshots", readers=snapshots, loaders=loaders, verified=verified, failures=0)


@pytest.mark.timeout(240)
def test_writers_racing_for_one_shard_exactly_one_wins(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            str(HERE / "race_harness.py"),
            "--rounds",
            "100",
            "--seed",
            str(SEED),
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=220,
    )
    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert lines and "summary" in lines[-1], completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = lines[-1]["summary"]
    tally("concurrency: racing writers", **summary)
    assert completed.returncode == 0, "\n".join(line.get("error", "") for line in lines[:3])
    assert summary["rounds"] == 100 and not summary.get("failures")
