"""Quick-start, step 1: tokenize a text corpus into a guideloom TokenStorage.

By default the corpus is the source code of the Python standard library that runs
this script (always there, no download): its ``.py`` files, sorted, the first
``--max-files``. Each file is one document; the sorted files go, in groups, into
shards of 256 MiB of tokens, so the default slice is one shard (``guideloom
tokenize`` runs the same engine; see its ``--shard-size``). Worker processes
tokenize groups in parallel. By default processes are started only for inputs over
8 MiB (below that, starting them costs more than it saves); ``--workers N``
forces N. With ``--input`` you tokenize your own ``.txt``, ``.jsonl`` or
``.parquet`` files (``--text-field`` names the JSONL field / Parquet column).

Without ``--tokenizer`` a byte-level BPE of ``--vocab-size`` tokens is trained on
the corpus in seconds and saved as ``OUTPUT/tokenizer.json``; the token storage
goes to ``OUTPUT/tokens``::

    python examples/quickstart/preprocess.py --output runs/quickstart/data
    guideloom inspect runs/quickstart/data/tokens
"""

from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
import time
from pathlib import Path

from guideloom.tokenize import tokenize_files, train_tokenizer

# Test suites and vendored tools make the sample less like "the library": leave them out.
EXCLUDED_DIRECTORIES = {"site-packages", "dist-packages", "test", "tests", "idlelib", "turtledemo", "__pycache__"}


def stdlib_files(max_files: int) -> list[Path]:
    """The standard library's ``.py`` files, sorted by relative path, at most ``max_files``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if EXCLUDED_DIRECTORIES.isdisjoint(relative.parts[:-1]) and path.is_file():
            found.append((relative.as_posix(), path))
    found.sort()
    return [path for _, path in found[:max_files]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("runs/quickstart/data"), help="directory to write")
    parser.add_argument("--input", type=Path, nargs="+", help="your .txt/.jsonl/.parquet files (default: stdlib)")
    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text")
    parser.add_argument("--max-files", type=int, default=300, help="stdlib files to use (default corpus only)")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json (default: train a byte-level BPE)")
    parser.add_argument("--vocab-size", type=int, default=2048, help="vocabulary of the trained tokenizer")
    parser.add_argument(
        "--workers", type=int, default=None, help="tokenize processes (default: min(4, cpus) if over 8 MiB)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT/tokens")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    arguments = parser.parse_args(argv)

    inputs = arguments.input or stdlib_files(arguments.max_files)
    if not inputs:
        parser.error("no input files")
    storage_path = arguments.output / "tokens"
    if storage_path.exists():
        if not arguments.overwrite:
            parser.error(f"{storage_path} exists; pass --overwrite to replace it")
        shutil.rmtree(storage_path)
    arguments.output.mkdir(parents=True, exist_ok=True)

    tokenizer_path = arguments.tokenizer
    if tokenizer_path is None:
        tokenizer_path = arguments.output / "tokenizer.json"
        started = time.perf_counter()
        train_tokenizer(inputs, arguments.vocab_size, tokenizer_path, text_field=arguments.text_field)
        print(f"trained a {arguments.vocab_size}-token byte-level BPE in {time.perf_counter() - started:.1f} s")

    summary = tokenize_files(
        inputs,
        storage_path,
        tokenizer_path,
        workers=arguments.workers,
        text_field=arguments.text_field,
        progress=not arguments.quiet,
    )
    print(summary.describe())
    print(f"storage:   {storage_path}")
    print(f"tokenizer: {tokenizer_path}")
    return 0


if __name__ == "__main__":  # the guard matters: tokenize workers are spawned processes that import this file
    sys.exit(main())
