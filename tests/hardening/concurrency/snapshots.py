"""Readers and loaders opened while writer processes commit: the snapshot campaign.

A reader opened at time t must see exactly the shards committed before t: every shard whose
commit had returned before it opened (the writers log each one after ``commit`` returns), at
most the one shard per writer whose commit was in progress at that instant, and nothing else;
each of them whole (every record reads back exactly) and, per writer, a prefix of its commit
order. A loader with workers pins its snapshot, even while commits go on, and serves exactly it.
Used by ``test_concurrency.py`` and ``tests/stress/run_concurrency.py``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from guideloom import DocumentStorage, StatefulDataLoader
from tests.hardening.concurrency.snapshot_writer import shard_records
from tests.helpers.processes import child_environment, module_command
from tests.helpers.storages import RawFormat

WRITER = "tests.hardening.concurrency.snapshot_writer"


def committed(logs: list[Path]) -> list[set[int]]:
    """Per writer, the shards whose commit has returned (as logged so far)."""
    found = []
    for log in logs:
        text = log.read_text() if log.exists() else ""
        found.append({int(line) for line in text.splitlines()[: text.count("\n")]})  # whole lines only
    return found


def check_snapshot(seen: list[int], before: list[set[int]], after: list[set[int]]) -> None:
    writers = len(before)
    for worker in range(writers):
        mine = sorted(shard for shard in seen if shard % writers == worker)
        assert mine == [worker + writers * number for number in range(len(mine))], f"writer {worker}: {mine}"
        assert before[worker] <= set(mine), f"writer {worker}: committed {sorted(before[worker] - set(mine))} unseen"
        in_flight = worker + writers * len(after[worker])  # committing while the reader opened
        assert set(mine) <= after[worker] | {in_flight}, f"writer {worker}: saw {sorted(set(mine) - after[worker])}"


def by_shard(reader: Any) -> dict[int, list[bytes]]:
    found: dict[int, list[bytes]] = {}
    for index in range(len(reader)):
        encoded, shard = reader.read_encoded(index)
        found.setdefault(shard, []).append(bytes(encoded))
    return found


def run(
    root: Path, writers: int = 3, shards_per_writer: int = 40, pause: float = 0.02, loaders: int = 4
) -> dict[str, int]:
    """Run the campaign in ``root``; raises AssertionError on the first inconsistent snapshot."""
    path = root / "storage"
    storage = DocumentStorage(path, RawFormat())
    with storage.sync_writer():
        pass  # the header exists before the readers start
    logs = [root / f"writer-{worker}.log" for worker in range(writers)]
    processes = [
        subprocess.Popen(
            module_command(WRITER, path, worker, writers, shards_per_writer, logs[worker], pause),
            env=child_environment(),
        )
        for worker in range(writers)
    ]
    figures = {"readers": 0, "loaders": 0, "verified": 0, "shards": 0}
    try:
        while True:
            running = any(process.poll() is None for process in processes)
            before = committed(logs)
            if figures["readers"] % 10 == 5 and figures["loaders"] < loaders and any(before):
                with StatefulDataLoader.from_storage(
                    storage, device="cpu", local_batch_size=3, num_workers=2, shuffle=True
                ) as loader:
                    pinned = list(loader._source.shard_ids)
                    check_snapshot(pinned, before, committed(logs))
                    time.sleep(0.05)  # more commits land before the workers start
                    served = sorted(record for batch in loader for record in batch)
                assert served == sorted(record for shard in pinned for record in shard_records(shard))
                figures["loaders"] += 1
            with storage.sync_reader() as reader:
                after = committed(logs)
                seen = [shard.id for shard in reader.shards]
                check_snapshot(seen, before, after)
                assert by_shard(reader) == {shard: shard_records(shard) for shard in seen}
                if figures["readers"] % 25 == 0:
                    assert reader.verify() == []
                    figures["verified"] += 1
            figures["readers"] += 1
            if not running:
                break
    finally:
        for process in processes:
            process.wait(timeout=600)
    assert [process.returncode for process in processes] == [0] * writers
    figures["shards"] = writers * shards_per_writer
    return figures
