"""One writer process of the NFS campaign (``test_nfs_writers``): it commits its shards one at a time and
prints each outcome as a JSON line (``committed``, ``exists`` or ``failed`` with the error's text).

Usage: ``python -m tests.storage.nfs_writer PATH READY WRITERS WRITER SHARD...``: it starts committing once
``WRITERS`` writers are ready (a file each in the directory ``READY``), so that contested ids really race.
The tokens of a shard name its writer, so the test can tell whose commit of a contested id won.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from guideloom import ShardExistsError, TokenStorage


def documents(writer: int, shard: int) -> list[np.ndarray]:
    """What ``writer`` commits as ``shard``: two documents whose tokens name both."""
    first = np.arange(2 + shard % 5, dtype=np.uint32) + writer * 1_000_000 + shard * 100
    return [first, first[:1] + 7]


def main(path: str, ready: Path, writers: int, writer: int, shards: list[int]) -> None:
    storage = TokenStorage(path, "uint32")
    (ready / str(writer)).touch()
    while len(list(ready.iterdir())) < writers:
        time.sleep(0.001)
    with storage.sync_writer() as writes:
        for shard in shards:
            outcome, error = "committed", ""
            try:
                for document in documents(writer, shard):
                    writes.append(shard, document)
                writes.commit(shard)
            except ShardExistsError as exists:
                outcome, error = "exists", str(exists)
            except OSError as failure:  # an injected EIO, or `clean` removed the unfinished file
                outcome, error = ("committed" if " is committed " in str(failure) else "failed"), str(failure)
            print(json.dumps({"writer": writer, "shard": shard, "outcome": outcome, "error": error}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), [int(shard) for shard in sys.argv[5:]])
