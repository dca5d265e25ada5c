"""Shared fixtures: a fresh storage path and a runner for isolated Python subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import child_environment


@pytest.fixture
def storage_path(tmp_path: Path) -> Path:
    """A path where no storage exists yet (its parent directory exists)."""
    return tmp_path / "storage"


@pytest.fixture(scope="session")
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a Python snippet in a fresh interpreter; ``args`` become ``sys.argv[1:]``; ``tests.*`` imports there.

    Used where a failure could take the test process down (a segfault, a hang, a
    huge allocation) or where a clean process is needed (memory measurements).
    """

    def run(code: str, *args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=child_environment(),
        )

    return run


@pytest.fixture(autouse=True, scope="session")
def _packing_cache_in_a_temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Packings of pack_documents=True are cached here, never in the user's cache directory."""
    os.environ["GUIDELOOM_CACHE_DIR"] = str(tmp_path_factory.mktemp("guideloom-cache"))
