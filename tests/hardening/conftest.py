"""Hardening campaigns: print each campaign's figures at the end of the session, with or without ``-s``."""

from __future__ import annotations

from typing import Any

from tests.hardening.campaigns import summary_lines


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    lines = summary_lines()
    if lines:
        terminalreporter.section("guideloom hardening campaigns")
        for line in lines:
            terminalreporter.write_line(line)
