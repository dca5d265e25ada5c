"""Concurrency: readers and loaders opened while writers commit see consistent snapshots; racing writers.

See ``snapshots.py`` for what a consistent snapshot is and ``harness.py`` for the races.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hardening.campaigns import tally
from tests.hardening.concurrency import snapshots
from tests.helpers.processes import run_harness

SEED = int(os.environ.get("GUIDELOOM_HARDENING_SEED", "20261129"))


@pytest.mark.timeout(180)
def test_readers_and_loaders_see_consistent_snapshots_while_writers_commit(tmp_path: Path) -> None:
    figures = snapshots.run(tmp_path, writers=3, shards_per_writer=40, pause=0.02, loaders=4)
    assert figures["readers"] >= 20 and figures["loaders"] >= 2, figures
    tally("concurrency: snapshots", **figures, failures=0)


@pytest.mark.timeout(240)
def test_writers_racing_for_one_shard_exactly_one_wins(tmp_path: Path) -> None:
    completed, lines = run_harness(
        "tests.hardening.concurrency.harness", "--rounds", 100, "--seed", SEED, "--root", tmp_path, timeout=220
    )
    assert lines and "summary" in lines[-1], completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = lines[-1]["summary"]
    tally("concurrency: racing writers", **summary)
    assert completed.returncode == 0, "\n".join(line.get("error", "") for line in lines[:3])
    assert summary["rounds"] == 100 and not summary.get("failures")
