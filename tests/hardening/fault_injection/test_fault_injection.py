"""Fault injection: writers and ``guideloom tokenize`` killed by SIGKILL at injected instants.

The CI sizes are small; ``tests/stress/run_fault_injection.py`` runs the same campaigns with
hundreds of instants (and every call instant). ``GUIDELOOM_HARDENING_SEED`` picks other instants.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.hardening.campaigns import tally
from tests.hardening.fault_injection import tokenize_kills
from tests.helpers.processes import run_harness

SEED = int(os.environ.get("GUIDELOOM_HARDENING_SEED", "20261129"))


@pytest.mark.timeout(240)
def test_writer_killed_at_random_instants(tmp_path: Path) -> None:
    """60 instants: k-th line of guideloom code, before/after the k-th syscall, random delays, with a partner
    writer, with `clean --older-than 0` and readers in a loop beside it."""
    completed, lines = run_harness(
        "tests.hardening.fault_injection.harness", "--cases", 60, "--seed", SEED, "--root", tmp_path, timeout=200
    )
    failures = [line for line in lines if line.get("ok") is False]
    assert lines and "summary" in lines[-1], completed.stderr
    summary = lines[-1]["summary"]
    tally("fault injection: killed writers", **summary)
    assert not failures, "\n\n".join(json.dumps(failure, indent=1) for failure in failures[:3])
    assert completed.returncode == 0, completed.stderr
    # a writer whose unfinished file `clean --older-than 0` took fails its shard instead of being killed
    assert summary["cases"] == 60 and summary["killed"] + summary["unfinished files cleaned away"] >= 40, summary
    assert summary["mode line"] and summary["mode call"] and summary["mode pair"] and summary["mode clean"], summary


@pytest.fixture(scope="module")
def tokenize_setup(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("tokenizers")
    return tokenize_kills.prepare(tmp_path_factory.mktemp("tokenize"))


@pytest.mark.timeout(240)
def test_tokenize_killed_at_random_instants(tokenize_setup: Any) -> None:
    """Killed ``guideloom tokenize`` runs leave committed shards intact; ``--skip-existing`` finishes them."""

    killed = 0
    for case in tokenize_kills.plan(tokenize_setup, 6, SEED):
        killed += tokenize_kills.run_case(tokenize_setup, case)["killed"]
    tally("fault injection: killed tokenize runs", cases=6, killed=killed, failures=0)
    assert killed >= 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", [["os.link", 1, "before"], ["os.fsync", 1, "after"], ["os.link", 2, "after"]])
def test_tokenize_killed_while_creating_the_header_or_committing(tokenize_setup: Any, target: list[Any]) -> None:
    """Killed before the header is published, the output holds only empty shards/ and incomplete/: a rerun
    must take it for the unfinished storage it is (it once refused it as a foreign non-empty directory)."""

    outcome = tokenize_kills.run_case(tokenize_setup, {"mode": "call", "workers": 1, "target": target})
    assert outcome["killed"]
    tally("fault injection: killed tokenize runs", cases=1, killed=1, failures=0)
