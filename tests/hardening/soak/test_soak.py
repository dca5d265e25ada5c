"""Soak (short): thousands of batches over dozens of epochs, with workers and resumes in between.

Memory (anonymous, this process and its workers) and descriptors (this process's, each worker's)
stay flat, no worker process accumulates across loaders, and every batch equals the one a loader
without workers gives.
``tests/stress/run_soak.py`` is the long version and writes the curve.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hardening.campaigns import tally
from tests.hardening.soak import harness as soak

BATCHES = 3000
GROWTH_LIMIT_MIB = 4.0


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("kind", "size", "workers"), [("documents", 600, 2), ("tokens", 600, 2)])
def test_long_run_stays_flat_and_exact(tmp_path: Path, kind: str, size: int, workers: int) -> None:
    storage = soak.make_storage(tmp_path / kind, kind, size)
    result = soak.run(storage, kind, BATCHES, workers=workers, sample_every=100, resume_every=1000)
    summary = result.summary()
    tally(
        f"soak ({kind})",
        batches=result.batches,
        epochs=result.epochs,
        resumes=result.resumes,
        mismatches=result.mismatches,
    )
    print(summary)
    assert result.batches == BATCHES and result.mismatches == 0, summary
    assert result.epochs >= 10, summary
    assert summary["pss_anon_growth_mib"] <= GROWTH_LIMIT_MIB, summary
    assert summary["rss_anon_growth_mib"] <= GROWTH_LIMIT_MIB, summary
    assert summary["descriptors_growth"] <= 1, summary
    assert summary["worker_descriptors_growth"] <= 1, summary
    worker_processes = max(sample["processes"] for sample in result.samples)
    assert worker_processes <= (workers if kind == "documents" else 0), "worker processes accumulate"
