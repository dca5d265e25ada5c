"""What ``argparse.ArgumentParser.add_subparsers()`` returns, as a protocol: the commands that register themselves
on the one ``guideloom`` command line (tokenize, import) type their argument with it, not argparse's private class."""

from __future__ import annotations

import argparse
from typing import Any, Protocol


class Subcommands(Protocol):
    """The subcommands of the ``guideloom`` command line, as far as a command registering itself uses them."""

    def add_parser(self, name: str, **options: Any) -> argparse.ArgumentParser: ...
