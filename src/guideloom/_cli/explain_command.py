"""``guideloom explain STATE``: its options. What it runs (``_cli/explaining.py``) builds a loader, so it is imported
when the command runs: the other commands start without importing torch."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from guideloom._cli.plots import check_png


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


def add_explain_command(commands: Any) -> None:
    """Add ``explain`` to the command's subparsers."""
    explain = commands.add_parser(
        "explain", help="what the next batches of a saved loader state read: records, shards, token offsets"
    )
    explain.add_argument("state", help="a loader state saved as JSON, or a torch checkpoint that holds one")
    explain.add_argument("--batches", type=_count(1), default=1, metavar="N", help="how many batches (default: 1)")
    explain.add_argument("--rank", type=_count(0), metavar="R", help="only this rank (default: every rank)")
    explain.add_argument("--key", metavar="KEY", help="where the state lies in a checkpoint: a key, or a path a.b")
    explain.add_argument("--json", action="store_true", help="print JSON (what loader.explain returns)")
    explain.add_argument("--summary", action="store_true", help="samples and tokens per component")
    explain.add_argument("--plot", type=check_png, metavar="FILE.png", help="per-component shares against the schedule")
    explain.add_argument("--storage-options", metavar="JSON", help="for storages on an object store: fsspec options")
    explain.set_defaults(prepare=_prepare_explain)


def _prepare_explain(arguments: argparse.Namespace) -> Callable[[], int]:
    from guideloom._cli.explaining import prepare_explain

    return prepare_explain(arguments)
