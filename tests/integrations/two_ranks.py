"""Running a training script as two CPU ranks in a fresh process tree, and reading what each rank wrote."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any


def run_two_ranks(
    launch: list[str], script: str, folder: Path, out: Path, arguments: list[str], timeout: float
) -> list[dict[str, Any]]:
    """Write ``script`` into ``folder``, run it with ``launch`` (which starts both ranks) and return each rank's
    ``rank<N>.json`` from ``out``. The launcher, not this process's environment, decides the ranks."""
    path = folder / "train_ddp.py"
    path.write_text(textwrap.dedent(script))
    out.mkdir(parents=True, exist_ok=True)
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    completed = subprocess.run(
        [*launch, str(path), *arguments],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
