"""The ``guideloom`` command: inspect, verify and clean storages; tokenize text into one; explain a loader state.

Every command is prepared, then run, and its exit status follows one convention:

* 0: done;
* 1: the command ran and found problems or its work failed (``verify``: damaged shards; ``tokenize``: an
  input failed mid-run, the shards finished before it stay committed; ``explain``: a storage the state
  names is missing or no longer what the state read);
* 2: the command could not start: a usage error (an unknown option, a bad value), or a path that is not
  what the command needs (no storage there, a damaged header, a missing input or tokenizer, an output
  that already holds the shards); nothing was changed;
* 130: interrupted (Ctrl-C); what a writer had not committed stays uncommitted;
* 141: its output went into a pipe whose reader had gone (``guideloom inspect PATH --shards | head -3``): it
  stops quietly, with the status of a command that SIGPIPE stopped (128 + 13), as ``cat`` or ``seq`` would.

Errors print as ``guideloom COMMAND: error: MESSAGE`` on stderr, like argparse's own usage errors.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import guideloom
from guideloom._cli.explain_command import add_explain_command
from guideloom._cli.lengths import Lengths
from guideloom._cli.plots import check_png
from guideloom._core.errors import GuideloomError
from guideloom._core.sizes import parse_shard_size
from guideloom._core.text import plural
from guideloom._remote.object_store import is_url, parse_storage_options
from guideloom._remote.remote_files import RemoteFiles
from guideloom._remote.shard_cache import PART_NAME, ShardCache
from guideloom._shards.layout import INDEX_NAME
from guideloom._shards.loss_masks import counted_tokens, describe_counted
from guideloom._shards.reader import StorageReader
from guideloom._shards.shard_table import ShardTable
from guideloom._storage.storages import AnyFormatStorage, local_path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report it
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what shells report for `cat` or `seq` writing into a closed `head`
REPORTED_ERRORS = (GuideloomError, ValueError, TypeError, OSError, ImportError, RuntimeError)
Run = Callable[[], int]


def _open(text: str, options: str | None = None) -> AnyFormatStorage:
    if is_url(text):
        return AnyFormatStorage(text, storage_options=parse_storage_options(options))
    if options is not None:
        raise ValueError(f"--storage-options apply to URLs only, but {text} is a local path")
    return AnyFormatStorage(local_path(text))  # a file:// URL is the local path it names


def _leftovers(storage: AnyFormatStorage) -> tuple[int, int]:
    """Files where the storage's writers build shards, and their bytes: what writers left there."""
    files = size = 0
    try:
        entries = list(os.scandir(storage.incomplete_files_dir()))
    except OSError:
        return 0, 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                files, size = files + 1, size + entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue  # removed meanwhile
    return files, size


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Right-aligned columns under their headings."""
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    return [indent + "  ".join(map(str.rjust, row, widths)) for row in [header, *rows]]


def _cache_summary(url: str, options: str | None, cache_dir: str, limit: int | None, shards: ShardTable) -> str:
    """What a machine's cache directory holds of the storage at ``url``: its shards whole, parts of shards, bytes,
    against the cache limit when one is given."""
    files = RemoteFiles(url, parse_storage_options(options), Path(cache_dir), limit)
    held = files.cache.held_names()
    whole = sum(ShardCache.name_for(info) in held for info in shards)
    parts = sum(PART_NAME.fullmatch(name) is not None for name in held)
    stale = len(held) - whole - parts
    total = sum(held.values())
    text = (
        f"{files.cache.directory}: {whole:,} of {plural(len(shards), 'shard')} whole, {plural(parts, 'part')} of shards"
    )
    text += f", {plural(stale, 'old copy', 'old copies')}" if stale else ""
    text += f", {plural(total, 'byte')}"
    if limit is not None:
        text += f" of a {limit:,}-byte limit ({total / limit:.0%})"
    return text


def _prepare_inspect(arguments: argparse.Namespace) -> Run:
    if arguments.plot is not None and not arguments.lengths:
        raise ValueError("--plot draws the histogram of --lengths: add --lengths")
    if (arguments.cache is not None or arguments.cache_limit is not None) and not is_url(arguments.path):
        raise ValueError(f"--cache and --cache-limit apply to URLs only, but {arguments.path} is a local path")
    if arguments.cache_limit is not None and arguments.cache is None:
        raise ValueError("--cache-limit compares the cache of --cache DIR with the limit: add --cache")
    limit = None if arguments.cache_limit is None else parse_shard_size(arguments.cache_limit, "--cache-limit")
    storage = _open(arguments.path, arguments.storage_options)
    header = storage.header
    unit = "documents" if header.kind == "tokens" else "records"
    with storage.open_reader() as reader:  # a snapshot: an index it cannot use is bypassed, and named below
        shards = reader.infos  # from the shard index, or a remote storage's listing: nothing is downloaded
        fields = [("path", storage.location), ("kind", header.kind)]
        if header.format is not None:
            fields.append(("format", header.format))
        if header.dtype is not None:
            fields.append(("dtype", header.dtype))
        fields += [("layout", f"version {header.layout_version}"), ("shards", f"{len(shards):,}")]
        fields.append((unit, f"{len(reader):,}"))
        if header.kind == "tokens":
            fields.append(("tokens", f"{int(shards.rows['element_count'].sum()):,}"))
        if header.loss_mask:
            fields.append(("loss mask", _loss_mask_summary(reader, remote=storage.is_remote)))
        if header.record_lengths:
            fields.append(("measured", "by the format's length(), stored per record"))
        fields.append(("bytes", f"{int(shards.rows['size'].sum()):,}"))
        if storage.index_problem is not None:
            fields.append(("index", f"not used, the storage was listed whole: {storage.index_problem}"))
        if arguments.cache is not None:
            fields.append(
                ("cache", _cache_summary(arguments.path, arguments.storage_options, arguments.cache, limit, shards))
            )
        files, size = (0, 0) if storage.is_remote else _leftovers(storage)
        if files:
            fields.append(
                (
                    "incomplete",
                    f"{plural(files, 'file')}, {plural(size, 'byte')} left by writers that died or are still writing "
                    f"('guideloom clean {storage.path}' removes the ones untouched for an hour)",
                )
            )
        lines = [f"{name + ':':<12}{value}" for name, value in fields]
        if arguments.shards:
            columns = ["shard", unit, *(["tokens"] if header.kind == "tokens" else []), "data bytes"]
            rows = [
                [str(shard.id), f"{shard.record_count:,}"]
                + ([f"{shard.element_count:,}"] if header.kind == "tokens" else [])
                + [f"{shard.element_count * header.element_size:,}"]
                for shard in shards
            ]
            lines += _table(columns, rows)
        lengths = Lengths.of(reader, header.kind == "tokens") if arguments.lengths else None
        lines += lengths.lines() if lengths is not None else []

    def run() -> int:
        print("\n".join(lines))
        if lengths is not None and arguments.plot is not None:
            lengths.plot(arguments.plot, f"{unit[:-1]} lengths of {storage.location}")
        return EXIT_OK

    return run


def _loss_mask_summary(reader: StorageReader[object], remote: bool) -> str:
    """How many tokens of a masked storage count toward the loss (read from the masks: an eighth of a byte
    per token); on an object store only that it is masked, since counting would download every shard."""
    if remote:
        return "yes (the share of counted tokens is not computed on an object store: it downloads every shard)"
    tokens = sum(info.element_count for info in reader.infos)
    counted = 0
    for position in range(len(reader.infos)):  # one shard at a time: a reader keeps only so many open
        bits = reader.shard(position).mask_bits
        counted += 0 if bits is None else counted_tokens(bits)
    return f"yes, {describe_counted(counted, tokens)}"


def _prepare_verify(arguments: argparse.Namespace) -> Run:
    storage = _open(arguments.path, arguments.storage_options)

    def run() -> int:
        shard_sizes = storage.committed_shard_sizes()  # a snapshot: it notes an index it cannot use, in index_problem
        bypassed = storage.index_problem
        total = sum(shard_sizes)
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
        index = f"{storage.location}/{INDEX_NAME}"  # how verify's problems name the index (a path or a URL)
        if bypassed is not None and not any(index in problem for problem in problems):
            problems.insert(0, f"{bypassed}; rebuilt from the shards")  # the snapshot rebuilt it: verify saw it whole
        for problem in problems:
            print(f"CORRUPT {problem}")
        damaged_shards = [problem for problem in problems if index not in problem]
        if damaged_shards:
            print(f"{len(damaged_shards)} of {plural(len(shard_sizes), 'shard')} failed verification", file=sys.stderr)
        elif problems:
            print("the index was damaged, no shard: readers bypass it", file=sys.stderr)
        if problems:
            return EXIT_FAILED
        print(f"ok: {plural(len(shard_sizes), 'shard')}, {plural(checked, 'data byte')} verified")
        return EXIT_OK

    return run


def _seconds(text: str) -> float:
    """An ``--older-than`` value: a number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got {text}")
    return value


def _prepare_clean(arguments: argparse.Namespace) -> Run:
    storage = _open(arguments.path, arguments.storage_options)

    def run() -> int:
        removed = storage.clean_leftovers(older_than=arguments.older_than)
        print(f"removed {plural(len(removed), 'leftover file')}")
        return EXIT_OK

    return run


def _prepare_index(arguments: argparse.Namespace) -> Run:
    storage = _open(arguments.path, arguments.storage_options)

    def run() -> int:
        count = storage.write_index()
        print(f"indexed {plural(count, 'shard')} in {storage.location}/shards.index")
        return EXIT_OK

    return run


class _PrintVersion(argparse.Action):
    """``--version``: the installed package's version, read from its metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        sys.stdout.write(f"{parser.prog} {guideloom.__version__}\n")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="guideloom",
        description=(
            "Inspect, verify, clean and index guideloom storages; tokenize text into one; explain what a loader "
            "state reads next."
        ),
        epilog="exit status: 0 done, 1 problems found or the work failed, 2 usage error (nothing was changed)",
    )
    parser.add_argument("--version", action=_PrintVersion, help="print guideloom's version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = commands.add_parser("inspect", help="print kind, format, dtype, shards, records/tokens, bytes")
    inspect.add_argument("path", help="a storage directory or URL (s3://bucket/prefix, ...)")
    inspect.add_argument("--shards", action="store_true", help="also list every shard")
    inspect.add_argument("--lengths", action="store_true", help="a histogram of document lengths (from the offsets)")
    inspect.add_argument(
        "--plot", type=check_png, metavar="FILE.png", help="with --lengths: draw it (needs matplotlib)"
    )
    inspect.add_argument(
        "--cache", metavar="DIR", help="for a URL: what the cache directory DIR (a loader's cache_dir) holds of it"
    )
    inspect.add_argument(
        "--cache-limit", metavar="SIZE", help="with --cache: the cache_limit_bytes to compare with (e.g. 10GiB)"
    )
    inspect.set_defaults(prepare=_prepare_inspect)
    verify = commands.add_parser("verify", help="recompute every shard's checksums; exit 1 on damage")
    verify.add_argument("path", help="a storage directory or URL")
    verify.add_argument("--quiet", action="store_true", help="no progress bar")
    verify.set_defaults(prepare=_prepare_verify)
    clean = commands.add_parser("clean", help="delete files left by dead writers")
    clean.add_argument("path", help="a storage directory or URL")
    clean.add_argument("--older-than", type=_seconds, default=3600.0, metavar="SECONDS", help="(default: 3600)")
    clean.set_defaults(prepare=_prepare_clean)
    index = commands.add_parser("index", help="write the index readers open a large storage by (after large writes)")
    index.add_argument("path", help="a storage directory or URL")
    index.set_defaults(prepare=_prepare_index)
    for command in (inspect, verify, clean, index):
        command.add_argument(
            "--storage-options",
            metavar="JSON",
            help='for a URL: fsspec options as a JSON object, e.g. \'{"endpoint_url": "http://127.0.0.1:9000"}\'',
        )
    from guideloom.tokenize._command import add_tokenize_command  # tokenizers itself is imported only when run

    add_tokenize_command(commands)
    from guideloom.importing._command import add_import_command  # pyarrow itself is imported only when run

    add_import_command(commands)
    add_explain_command(commands)
    return parser


def _report(command: str, error: BaseException) -> None:
    message = str(error) or type(error).__name__
    for note in getattr(error, "__notes__", []):
        message += f"\n{note}"
    print(f"guideloom {command}: error: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``guideloom`` command; returns its exit status (see the module docstring)."""
    arguments = _parser().parse_args(argv)  # a usage error exits 2 here
    try:
        try:
            run: Run = arguments.prepare(arguments)
        except REPORTED_ERRORS as error:
            _report(arguments.command, error)
            return EXIT_USAGE
        try:
            status = run()
            sys.stdout.flush()  # a reader gone is found here, not in the interpreter's last flush
            return status
        except BrokenPipeError as error:
            if not _stdout_reader_gone():
                _report(arguments.command, error)
                return EXIT_FAILED
            _discard_stdout()
            return EXIT_CLOSED_PIPE
        except REPORTED_ERRORS as error:
            _report(arguments.command, error)
            return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"guideloom {arguments.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reading end was closed (a broken pipe elsewhere is an error)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll on this platform, or stdout is no file
        return True


def _discard_stdout() -> None:
    """Point standard output at the null device, so that what is still buffered is dropped without a second error."""
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), sys.stdout.fileno())
