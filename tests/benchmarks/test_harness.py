"""The benchmarks' shared harness: benchmarks import as modules of one package, children and timings report alike."""

from __future__ import annotations

import importlib
import sys

import pytest

from benchmarks.harness import (
    BENCHMARKS,
    Timing,
    interleaved,
    module_command,
    run_child,
    run_json_child,
    spread,
)

SCRIPTS = sorted(f"benchmarks.{path.stem}" for path in BENCHMARKS.glob("*.py") if path.stem != "__init__")
MODULES = [
    *SCRIPTS,
    "benchmarks.remote.worker",
    "benchmarks.remote.streaming_peers",
    "benchmarks.remote.streaming_report",
    "benchmarks.peers.smoke",
    "benchmarks.peers.check_install",
]


@pytest.mark.parametrize("module", MODULES)
def test_every_benchmark_imports_as_a_module_of_the_package(module: str) -> None:
    importlib.import_module(module)


def test_a_benchmark_runs_as_a_module_in_a_child_from_the_repository_root() -> None:
    _, printed = run_child(module_command("benchmarks.bench_window_modes", "--help"), timeout=120)
    assert "--repeats" in printed


def test_a_child_gives_its_last_line_as_json_and_a_failure_as_an_error() -> None:
    assert run_json_child([sys.executable, "-c", "print('starting'); print('{\"rate\": 2.5}')"], 60) == {"rate": 2.5}
    failed = run_json_child([sys.executable, "-c", "raise ValueError('no such peer')"], 60)
    assert failed == {"error": "ValueError: no such peer"}


def test_a_timing_gives_the_best_run_the_median_and_the_spread() -> None:
    timing = Timing((0.3, 0.1, 0.2, 0.5))
    assert (timing.best, timing.median, timing.spread) == (0.1, 0.25, (0.1, 0.5))
    assert timing.summary() == {"best_s": 0.1, "median_s": 0.25, "spread_s": [0.1, 0.5], "runs": 4}
    assert spread([0.5, 0.4, 0.6]) == {"median": 0.5, "low": 0.4, "high": 0.6, "values": [0.5, 0.4, 0.6]}


def test_interleaved_runs_every_measurement_once_a_round() -> None:
    calls: list[str] = []
    measurements = {"plain": lambda: calls.append("plain") or 1, "packed": lambda: calls.append("packed") or 2}
    rounds = interleaved(measurements, 3)
    assert calls == ["plain", "packed"] * 3
    assert rounds == {"plain": [1, 1, 1], "packed": [2, 2, 2]}
