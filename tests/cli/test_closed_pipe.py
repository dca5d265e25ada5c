"""The ``guideloom`` command writing into a pipe that its reader closes early, as ``| head`` does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.scale.many_shards import token_shards

SHARDS = 4_000  # a listing of about 100 KB: more than a pipe holds, so the command writes after `head` has gone


def test_inspect_into_a_closed_pipe_stops_quietly(tmp_path: Path) -> None:
    token_shards(tmp_path / "tokens", SHARDS)
    command = [sys.executable, "-m", "guideloom", "inspect", str(tmp_path / "tokens"), "--shards"]
    inspect = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert inspect.stdout is not None and inspect.stderr is not None
    head = [inspect.stdout.readline() for _ in range(3)]
    inspect.stdout.close()  # as `head -3` exits after its three lines
    errors = inspect.stderr.read()
    assert inspect.wait(timeout=120) == 141
    assert errors == b""
    assert head[0].startswith(b"path:")


def test_inspect_through_head_in_a_shell_prints_no_error(tmp_path: Path) -> None:
    token_shards(tmp_path / "tokens", SHARDS)
    pipeline = f"'{sys.executable}' -m guideloom inspect '{tmp_path / 'tokens'}' --shards | head -3"
    done = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0
    assert done.stderr == ""
    assert len(done.stdout.splitlines()) == 3
