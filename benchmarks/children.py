"""Measurements in fresh interpreters: a child prints its result as JSON on its last stdout line."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def run_json_child(command: list[str], timeout: float, **options: Any) -> dict[str, Any]:
    """Run ``command`` and return the JSON of its last stdout line; a failure or time-out is returned, not raised."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
