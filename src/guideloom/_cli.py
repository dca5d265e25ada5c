"""The ``guideloom`` command: inspect, verify and clean storages; tokenize text into one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from guideloom._errors import GuideloomError
from guideloom._layout import StorageHeader, read_header
from guideloom._reader import _Reader
from guideloom._storage import _Storage


class _AnyFormatStorage(_Storage):
    """A storage opened without its format class: enough to inspect, verify and clean it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header = read_header(path)

    def _expected_header(self) -> StorageHeader:
        return self.header

    def _open_reader(self, shard_ids: list[int] | None = None) -> _Reader[object]:
        return _Reader(self.path, self.header, shard_ids)


def _open(path: str) -> _AnyFormatStorage:
    return _AnyFormatStorage(Path(path))


def _inspect(arguments: argparse.Namespace) -> int:
    storage = _open(arguments.path)
    header = storage.header
    with storage._open_reader() as reader:
        total_bytes = sum(shard.path.stat().st_size for shard in reader.shards)
        print(f"path:      {storage.path}")
        print(f"kind:      {header.kind}")
        if header.format is not None:
            print(f"format:    {header.format}")
        if header.dtype is not None:
            print(f"dtype:     {header.dtype}")
        print(f"layout:    version {header.layout_version}")
        print(f"shards:    {len(reader.shards)}")
        print(f"{'documents' if header.kind == 'tokens' else 'records'}: {len(reader):>10,}")
        if header.kind == "tokens":
            print(f"tokens:    {sum(shard.element_count for shard in reader.shards):,}")
        print(f"bytes:     {total_bytes:,}")
        if arguments.shards:
            for shard in reader.shards:
                print(f"  shard {shard.id}: {shard.record_count:,} records, {shard.data_size:,} data bytes")
    return 0


def _verify(arguments: argparse.Namespace) -> int:
    storage = _open(arguments.path)
    with storage._open_reader() as reader:
        total = sum(shard.data_size for shard in reader.shards)
        shard_count = len(reader.shards)
    bar = None
    if not arguments.quiet and total >= 64 * 2**20:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, desc="verify", file=sys.stderr)
        except ImportError:
            bar = None
    problems = storage.verify(bar.update if bar is not None else None)
    if bar is not None:
        bar.close()
    for problem in problems:
        print(f"CORRUPT {problem}")
    if problems:
        print(f"{len(problems)} of {shard_count} shards failed verification", file=sys.stderr)
        return 1
    print(f"ok: {shard_count} shards, {total:,} data bytes verified")
    return 0


def _clean(arguments: argparse.Namespace) -> int:
    removed = _open(arguments.path).clean_leftovers(older_than=arguments.older_than)
    print(f"removed {len(removed)} leftover files")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guideloom", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="print kind, format, dtype, shards, records/tokens, bytes")
    inspect.add_argument("path")
    inspect.add_argument("--shards", action="store_true", help="also list every shard")
    inspect.set_defaults(run=_inspect)
    verify = commands.add_parser("verify", help="recompute every shard's checksums; exit 1 on damage")
    verify.add_argument("path")
    verify.add_argument("--quiet", action="store_true", help="no progress bar")
    verify.set_defaults(run=_verify)
    clean = commands.add_parser("clean", help="delete files left by dead writers")
    clean.add_argument("path")
    clean.add_argument("--older-than", type=float, default=3600.0, metavar="SECONDS")
    clean.set_defaults(run=_clean)
    from guideloom._tokenize import add_tokenize_command  # lazy: tokenizers itself is imported only when run

    add_tokenize_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``guideloom`` command."""
    arguments = _parser().parse_args(argv)
    try:
        status: int = arguments.run(arguments)
    except GuideloomError as error:
        print(f"guideloom: error: {error}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    raise SystemExit(main())
