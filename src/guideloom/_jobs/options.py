"""The commands that run jobs on the command line: each registered with its description as laid out, and the
options they all take (``--workers``, ``--shard-size``, ``--ray``, ``--quiet``, ``--storage-options``), each
added where the command lists it, with the command's own help."""

from __future__ import annotations

import argparse

from guideloom._core.sizes import parse_shard_size
from guideloom._core.subcommands import Subcommands


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _shard_size(text: str) -> int:
    try:
        return parse_shard_size(text, "--shard-size")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--shard-size ")) from None


def add_command(commands: Subcommands, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """Register the command ``name``; its ``--help`` prints ``description`` as written (lists and columns kept)."""
    return commands.add_parser(
        name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_workers(command: argparse.ArgumentParser, help: str) -> None:
    """``--workers N``: worker processes (default None: the command decides)."""
    command.add_argument("--workers", type=_positive_int, default=None, help=help)


def add_shard_size(command: argparse.ArgumentParser, default: int, help: str) -> None:
    """``--shard-size SIZE``: bytes per shard, as ``256MiB``, ``1GiB``, ``500MB`` or a number."""
    command.add_argument("--shard-size", type=_shard_size, default=default, metavar="SIZE", help=help)


def add_ray(command: argparse.ArgumentParser, help: str) -> None:
    """``--ray [ADDRESS]``: Ray tasks instead of worker processes; read back with :func:`ray_address`."""
    command.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS", help=help)


def add_quiet(command: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress bar."""
    command.add_argument("--quiet", action="store_true", help="no progress bar")


def add_storage_options(command: argparse.ArgumentParser, help: str) -> None:
    """``--storage-options JSON``: fsspec options for what is on an object store (``parse_storage_options``)."""
    command.add_argument("--storage-options", metavar="JSON", help=help)


def ray_address(arguments: argparse.Namespace) -> bool | str:
    """What ``--ray`` asks for, as the Python functions take it: False (not given), True (no address), an address."""
    return False if arguments.ray is None else arguments.ray or True
