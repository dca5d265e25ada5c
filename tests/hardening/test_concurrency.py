"""Concurrency: readers and loaders opened while writers commit see consistent snapshots; racing writers.

See ``snapshots.py`` for what a consistent snapshot is and ``race_harness.py`` for the races.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import snapshots
from hardening_support import HERE, tally

SEED = int(os.environ.get("GUIDELOOM_HARDENING_SEED", "20261129"))


@pytest.mark.timeout(180)
def test_readers_and_loaders_see_consistent_snapshots_while_writers_commit(tmp_path: Path) -> None:
    figures = snapshots.run(tmp_path, writers=3, shards_per_writer=40, pause=0.02, loaders=4)
    assert figures["readers"] >= 20 and figures["loaders"] >= 2, figures
    tally("concurrency: snapshots", **figures, failures=0)


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
