"""The campaigns' tally: what each hardening campaign tried and found, printed at the end of a run.

The CI tests under ``tests/hardening/`` and the long runs in ``tests/stress/`` use the same code with
different case counts. Each campaign adds its figures with :func:`tally`; the conftest prints them at
the end of the session (also without ``-s``), and stress scripts print them themselves.
"""

from __future__ import annotations

from collections import Counter

# campaign name -> counter of what was tried / found
CAMPAIGNS: dict[str, Counter[str]] = {}


def tally(campaign: str, **counts: int) -> None:
    """Add figures to a campaign's tally (e.g. ``cases=30, failures=0``)."""
    CAMPAIGNS.setdefault(campaign, Counter()).update(counts)


def tally_max(campaign: str, **values: int) -> None:
    """Keep the largest value seen for each figure (e.g. the slowest error, in milliseconds)."""
    counter = CAMPAIGNS.setdefault(campaign, Counter())
    for key, value in values.items():
        counter[key] = max(counter[key], value)


def summary_lines() -> list[str]:
    """One line per campaign: its figures, sorted by name."""
    lines = []
    for campaign in sorted(CAMPAIGNS):
        figures = ", ".join(f"{key} {value}" for key, value in sorted(CAMPAIGNS[campaign].items()))
        lines.append(f"{campaign}: {figures}")
    return lines
