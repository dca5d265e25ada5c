"""One version: pyproject.toml's, read back by ``guideloom.__version__``, ``guideloom --version`` and the changelog."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import guideloom
from guideloom._cli import main

REPOSITORY = Path(__file__).resolve().parents[2]


def project_version() -> str:
    with open(REPOSITORY / "pyproject.toml", "rb") as file:
        version: str = tomllib.load(file)["project"]["version"]
    return version


def test_version_is_the_installed_metadata_of_pyproject() -> None:
    # A stale install (pyproject.toml changed, `pip install -e .` not rerun) fails here, not in users' hands.
    assert guideloom.__version__ == importlib.metadata.version("guideloom") == project_version() == "0.5.0"


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr() == (f"guideloom {project_version()}\n", "")


@pytest.mark.parametrize(
    "command", [[sys.executable, "-m", "guideloom"], [str(Path(sys.executable).parent / "guideloom")]]
)
def test_version_flag_of_the_installed_commands(command: list[str]) -> None:
    done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"guideloom {project_version()}\n", "")


def test_changelog_names_every_release_up_to_this_version() -> None:
    headings = [line for line in (REPOSITORY / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert [heading.split()[1] for heading in headings] == [project_version(), "0.4.0", "0.3.0", "0.2.0", "0.1.0"]
