"""A writer process for the snapshot tests: commits shards ``worker, worker + workers, ...`` one by one.

    python -m tests.hardening.concurrency.snapshot_writer PATH WORKER WORKERS COUNT LOG [PAUSE]

After each commit returns, the shard id is appended to LOG (flushed), so a reader knows which
shards were certainly committed before it looked. Shard ``s`` holds :func:`shard_records` ``(s)``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from guideloom import DocumentStorage
from tests.helpers.storages import RawFormat


def shard_records(shard: int) -> list[bytes]:
    return [f"{shard}:{index};".encode() * (1 + (shard * 7 + index) % 50) for index in range(3 + shard % 11)]


def main() -> None:
    path, worker, workers, count, log = Path(sys.argv[1]), *map(int, sys.argv[2:5]), Path(sys.argv[5])
    pause = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0  # seconds between commits
    storage = DocumentStorage(path, RawFormat())
    with open(log, "a") as committed:
        for number in range(count):
            shard = worker + number * workers
            with storage.sync_writer() as writer:
                for record in shard_records(shard):
                    writer.append(shard, record)
            committed.write(f"{shard}\n")
            committed.flush()
            time.sleep(pause)


if __name__ == "__main__":
    main()
