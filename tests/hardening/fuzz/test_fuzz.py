"""Fuzzing of everything read from disk: thousands of damaged storages, each opened, read, verified.

The cases run in subprocesses (``harness.py``, which documents the properties), three at once,
so a crash in a mapping or in ``np.frombuffer`` fails the test instead of taking pytest down:
every subprocess must exit normally (no signal) and report no failure.
``tests/stress/run_fuzz.py`` runs many more cases (and atheris, where it installs).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.hardening.campaigns import tally
from tests.helpers.processes import child_environment, module_command

SEED = int(os.environ.get("GUIDELOOM_HARDENING_SEED", "20261129"))
GROUPS = ("header,layout", "footer,index", "size,bytes")
EXAMPLES = 250  # per target: 1,500 cases in all


@pytest.mark.timeout(300)
def test_damaged_files_give_clear_errors_only(tmp_path: Path) -> None:
    processes = {
        targets: subprocess.Popen(
            module_command(
                "tests.hardening.fuzz.harness",
                *("--targets", targets, "--examples", EXAMPLES, "--seed", SEED),
                *("--root", tmp_path / targets.replace(",", "-")),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_environment(),
        )
        for targets in GROUPS
    }
    problems = []
    for targets, process in processes.items():
        output, _ = process.communicate(timeout=280)
        cases = {line.split()[1]: int(line.split()[2]) for line in output.splitlines() if line.startswith("CASES ")}
        failures = sum(line.startswith("FAILURE") for line in output.splitlines())
        tally("fuzzing", cases=sum(cases.values()), failures=failures)
        if process.returncode < 0:
            problems.append(f"{targets}: the fuzzing process died of signal {-process.returncode}:\n{output[-5000:]}")
        elif process.returncode != 0 or failures:
            problems.append(f"{targets}:\n{output[-20000:]}")
        elif set(cases) != set(targets.split(",")) or min(cases.values()) < EXAMPLES:
            problems.append(f"{targets}: too few cases ran: {cases}")
    assert not problems, "\n\n".join(problems)
