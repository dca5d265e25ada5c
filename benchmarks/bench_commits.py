"""Opening a local storage as its index ages: current, k shards committed since, no index, a damaged one.

    python benchmarks/bench_commits.py [--quick] [--data DIR]

A storage's shard files are its commits and ``shards.index`` is a snapshot of them. Opening reads a
current index and nothing else (one ``stat`` of ``shards/`` proves it current); after commits it
lists ``shards/`` once and reads one footer per shard committed since, then writes the index anew;
without a usable index it reads every footer. Measured here, for 10^2 .. 10^5 shards (``--quick``:
10^2, 10^3) of 4,096 uint32 tokens: loader construction + first batch (the median of 7, in this
process, each repetition starting from the same index state), as a ratio to the current index at 10^2
shards. Storages are kept in ``--data`` (default ``benchmarks/.data/commits``). Results go to
``results/commits.json`` and ``results/commits.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._shards.checkpoints import checkpoints_of
from guideloom._shards.layout import SHARDS_DIR, shard_file_name, shard_trailer

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TOKENS, DOCUMENT = 4096, 2048
REPEATS = 7
SINCE = (1, 100)  # shards committed after the index was written


def generate(path: Path, shards: int) -> None:
    """``shards`` shards laid out as a writer lays them out, without its fsyncs (10^5 commits would take minutes)."""
    header = TokenStorage(path, "uint32").create()
    offsets = [0, DOCUMENT, TOKENS]
    for shard in range(shards):
        data = np.random.default_rng(shard).integers(0, 50_000, TOKENS, dtype=np.uint32).tobytes()
        checkpoints = checkpoints_of(data, header.checkpoint_bytes)
        trailer = shard_trailer(shard, offsets, len(data), zlib.crc32(data), header, checkpoints=checkpoints)
        (path / SHARDS_DIR / shard_file_name(shard)).write_bytes(data + trailer)


def open_and_read(path: Path) -> float:
    """Seconds for loader construction and its first batch."""
    started = time.perf_counter()
    with StatefulDataLoader.from_storage(
        TokenStorage(path, "uint32"), device="cpu", local_batch_size=8, sequence_length=1024, shuffle=True, seed=0
    ) as loader:
        next(iter(loader))
    return time.perf_counter() - started


def median_ms(path: Path, prepare: Callable[[], None]) -> float:
    times = []
    for _ in range(REPEATS):
        prepare()
        times.append(open_and_read(path))
    return 1e3 * statistics.median(times)


def rows_for(path: Path, shards: int) -> list[dict[str, Any]]:
    index = path / "shards.index"
    open_and_read(path)  # the first reader writes the index of what the generator laid out
    open_and_read(path)  # now current
    current = index.read_bytes()
    rows = [{"shards": shards, "case": "index current", "ms": median_ms(path, lambda: None)}]
    committed = shards
    for since in SINCE:
        with TokenStorage(path, "uint32").sync_writer() as writer:
            for shard in range(committed, shards + since):
                writer.append(shard, np.arange(TOKENS, dtype=np.uint32))
        committed = shards + since

        def stale(saved: bytes = current) -> None:
            index.write_bytes(saved)  # the index of before these commits: a listing, footers of the new ones

        rows.append({"shards": shards, "case": f"{since} committed since", "ms": median_ms(path, stale)})
    rows.append({"shards": shards, "case": "no index", "ms": median_ms(path, lambda: index.unlink())})

    def damaged() -> None:
        index.write_bytes(index.read_bytes()[:-7])

    rows.append({"shards": shards, "case": "index cut short", "ms": median_ms(path, damaged)})
    for since in reversed(range(shards, committed)):  # back to the generated storage for the next run
        (path / SHARDS_DIR / shard_file_name(since)).unlink()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    base = next(row["ms"] for row in rows if row["shards"] == rows[0]["shards"] and row["case"] == "index current")
    lines = [
        "Loader construction + first batch, median of 7 (ms), and the ratio to a current index at "
        f"{rows[0]['shards']:,} shards.",
        "",
        "| shards | index | ms | ratio |",
        "|---:|---|---:|---:|",
    ]
    lines += [f"| {row['shards']:,} | {row['case']} | {row['ms']:.1f} | {row['ms'] / base:.1f}x |" for row in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10^2 and 10^3 shards")
    parser.add_argument("--data", type=Path, default=HERE / ".data" / "commits")
    arguments = parser.parse_args()
    counts = [10**2, 10**3] if arguments.quick else [10**2, 10**3, 10**4, 10**5]
    rows = []
    for count in counts:
        path = arguments.data / f"tokens-{count}"
        marker = path.with_name(path.name + ".complete")
        if not marker.exists():
            generate(path, count)
            marker.touch()
        rows += rows_for(path, count)
        print(json.dumps(rows[-len(SINCE) - 3 :]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "commits.json").write_text(json.dumps(rows, indent=1) + "\n")
    (RESULTS / "commits.md").write_text(table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
