"""The ``guideloom`` command: inspect, verify and clean storages; tokenize text into one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from guideloom._errors import GuideloomError
from guideloom._layout import SHARDS_DIR, StorageHeader, committed_shard_ids, read_header, shard_file_name
from guideloom._reader import _Reader
from guideloom._storage import _Storage


class _AnyFormatStorage(_Storage):
    """A storage opened without its format class: enough to inspect, verify and clean it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)
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


def _size_for_progress(path: Path) -> int:
    """A shard file's size, only to size the progress bar: verify itself reports what is wrong with it."""
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _verify(arguments: argparse.Namespace) -> int:
    storage = _open(arguments.path)
    shard_files = [storage.path / SHARDS_DIR / shard_file_name(shard) for shard in committed_shard_ids(storage.path)]
    total = sum(_size_for_progress(path) for path in shard_files)
    bar = None
    if not arguments.quiet and total >= 64 * 2**20:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, desc="verify", file=sys.stderr)
        except ImportError:
            bar = None
    checked = 0

    def progress(data_bytes: int) -> None:
        nonlocal checked
        checked += data_bytes
        if bar is not None:
            bar.update(data_bytes)

    problems = storage.verify(progress)
    if bar is not None:
        bar.close()
    for problem in problems:
        print(f"CORRUPT {problem}")
    if problems:
        print(f"{len(problems)} of {len(shard_files)} shards failed verification", file=sys.stderr)
        return 1
    print(f"ok: {len(shard_files)} shards, {checked:,} data bytes verified")
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
