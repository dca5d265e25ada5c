"""Fixtures of the storage tests: the NFS emulation library, built once per session with the system's C compiler."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("nfs_emulation.c")


@pytest.fixture(scope="session")
def nfs_emulation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The path of the ``LD_PRELOAD`` library that makes a process see NFS (see ``nfs_emulation.c``)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler (cc): the NFS emulation of tests/storage needs one")
    library = tmp_path_factory.mktemp("nfs") / "nfs_emulation.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SOURCE), "-ldl"], check=True)
    return library
