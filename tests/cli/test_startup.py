"""The command starts light: only ``explain`` (which builds a loader) imports torch, when it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.processes import child_environment

IMPORTED_TORCH = """
import runpy, sys
sys.argv = ["guideloom", *sys.argv[1:]]
try:
    runpy.run_module("guideloom", run_name="__main__")
finally:
    print("torch" in sys.modules, file=sys.stderr)
"""


def _imports_torch(*arguments: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED_TORCH, *arguments], capture_output=True, text=True, env=child_environment()
    )
    return done.stderr.strip().splitlines()[-1] == "True"


def test_import_runs_without_torch(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps({"text": f"row {n}"}) + "\n" for n in range(10)))
    assert not _imports_torch("import", str(source), str(tmp_path / "dest"), "--quiet")
    assert (tmp_path / "dest" / "guideloom.json").exists()


def test_explain_imports_torch_when_it_runs(tmp_path: Path) -> None:
    assert not _imports_torch("--version")
    assert _imports_torch("explain", str(tmp_path / "missing.json"))
