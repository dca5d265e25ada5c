"""Other processes a test starts: fresh interpreters that import ``tests.*``, process groups, free local ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository: ``tests`` imports as a package from here


def module_command(module: str, *arguments: object) -> list[str]:
    """Run a module of the test tree as a script in a fresh interpreter (give it :func:`child_environment`)."""
    return [sys.executable, "-m", module, *map(str, arguments)]


def run_harness(
    module: str, *arguments: object, timeout: float | None = None
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """Run a campaign's harness module; the finished process and its JSON lines (one a case, the summary last)."""
    completed = subprocess.run(
        module_command(module, *arguments), capture_output=True, text=True, timeout=timeout, env=child_environment()
    )
    return completed, [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]


def child_environment() -> dict[str, str]:
    """This process's environment with the repository first on ``PYTHONPATH``: a child imports ``tests.*``."""
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *([inherited] if inherited else [])])}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process group's store or a local server)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def gather_to_file(result: Any, out: str | Path) -> None:
    """Every rank's ``result``, gathered over the initialised process group and written as JSON by rank 0."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(gathered))
