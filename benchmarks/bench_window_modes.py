"""Document-aware token windows: throughput against plain windows, padding share, and packing build time.

Writes ``results/window_modes.json`` and prints a table. Three measurements, one run:

1. Tokens/s of one shuffled pass over (8, 2048) batches with plain windows, ``document_boundaries=True``
   and ``pack_documents=True`` (uint32 tokens in documents of 50-5,000 tokens), ``num_workers`` 0, as
   ratios to plain windows. One more row, the floor: plain windows plus the two int64 arrays that both
   modes add to a batch, written and nothing more (no implementation of the modes on one core can be
   faster). The modes run interleaved, ``--repeats`` rounds (15: a pass takes tens of milliseconds, so
   a few rounds' median moves with every burst of other work): each round's ratios compare passes made
   under the same load; the median ratio and its spread over the rounds are reported, and the best rate,
   both by wall time and by the process's CPU time (which a machine loaded by other work disturbs less).
2. The padding share of the packed rows (goal: <= 2%).
3. Time to build the packing of 10^6 documents (one shard), first use and from the cache.

    python -m benchmarks.bench_window_modes            # 20M tokens (under a minute on 2 cores)
    python -m benchmarks.bench_window_modes --tokens 100_000_000 --documents 1_000_000
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import argument_parser, count, interleaved, machine, spread, timed, write_results
from guideloom import StatefulDataLoader, TokenStorage
from guideloom._windows.packing_cache import load_or_build

SEQUENCE_LENGTH = 2048
BATCH = 8


def write_documents(path: Path, tokens: int, shards: int, seed: int = 0, masked: bool = False) -> TokenStorage:
    """Documents of 50-5,000 uint32 tokens, about ``tokens`` in all, over ``shards`` shards; ``masked``: with a
    loss mask whose first half of each document is 0 (a prompt) and second half 1 (an answer)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 5001, tokens // 2525 + 1)
    storage = TokenStorage(path, dtype="uint32", loss_mask=masked)
    stream = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.uint32)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    per_shard = -(-len(lengths) // shards)
    with storage.sync_writer() as writer:
        for document, (start, stop) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
            if masked:
                mask = np.arange(stop - start) >= (stop - start) // 2
                writer.append(document // per_shard, stream[start:stop], loss_mask=mask)
            else:
                writer.append(document // per_shard, stream[start:stop])
    return storage


def tokens_per_second(storage: TokenStorage, floor: bool = False, **mode: Any) -> tuple[float, float, int]:
    """One shuffled epoch (after a warm-up batch): tokens per second of wall time and of this process's CPU
    time, and the batches served. On a machine that others load, a pass is often descheduled: its wall
    time then says little, its CPU time still measures the work (everything runs in this process).

    ``floor``: plain windows, and for each batch the two more (B, S) int64 arrays that both modes must
    write (a copy of the tokens as ``labels``, a ramp as ``position_ids``) and nothing else: what no
    implementation of the modes on one core can beat.
    """
    ramp = torch.arange(SEQUENCE_LENGTH).expand(BATCH, SEQUENCE_LENGTH)
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=BATCH, sequence_length=SEQUENCE_LENGTH, shuffle=True, **mode
    ) as loader:
        batches = iter(loader)
        next(batches)
        start, start_cpu = time.perf_counter(), time.process_time()
        served = 1
        for batch in batches:
            served += 1
            if floor:
                labels, positions = batch.clone(), ramp.clone()  # noqa: F841 (written, then dropped)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    tokens = (served - 1) * BATCH * SEQUENCE_LENGTH
    return tokens / elapsed, tokens / cpu, served


def padding_share(storage: TokenStorage) -> float:
    """Padding tokens over all tokens of the packed rows of one epoch."""
    with storage.sync_reader() as reader:
        real = reader.token_count
        rows = sum(load_or_build(shard.offsets, SEQUENCE_LENGTH).row_count for shard in reader.shards)
    return 1 - real / (rows * SEQUENCE_LENGTH)


def build_times(documents: int) -> dict[str, float]:
    """Seconds to pack one shard of ``documents`` documents of 50-5,000 tokens: first use, then cached."""
    lengths = np.random.default_rng(1).integers(50, 5001, documents)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
    first = timed(lambda: load_or_build(offsets, SEQUENCE_LENGTH)).best
    return {"first_use_s": first, "cached_s": timed(lambda: load_or_build(offsets, SEQUENCE_LENGTH)).best}


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--tokens", type=count, default=20_000_000)
    parser.add_argument("--documents", type=count, default=1_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds of every mode")
    parser.add_argument("--loss-mask", action="store_true", help="also each mode over a masked copy of the tokens")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["GUIDELOOM_CACHE_DIR"] = str(Path(scratch) / "cache")
        storage = write_documents(Path(scratch) / "tokens", arguments.tokens, arguments.shards)
        modes: dict[str, dict[str, Any]] = {
            "plain windows": {},
            "plain windows + two int64 arrays written (the floor)": {"floor": True},
            "document_boundaries": {"document_boundaries": True},
            "pack_documents": {"pack_documents": True},
        }
        if arguments.loss_mask:
            masked = write_documents(Path(scratch) / "masked", arguments.tokens, arguments.shards, masked=True)
            modes["plain windows, masked (input_ids, labels)"] = {"storage": masked}
            modes["document_boundaries, masked"] = {"storage": masked, "document_boundaries": True}
            modes["pack_documents, masked"] = {"storage": masked, "pack_documents": True}

        def epoch(mode: dict[str, Any]) -> tuple[float, float, int]:
            options = dict(mode)
            return tokens_per_second(options.pop("storage", storage), **options)

        rounds = interleaved({name: lambda mode=mode: epoch(mode) for name, mode in modes.items()}, arguments.repeats)
        share = padding_share(storage)
        build = build_times(arguments.documents)
    plain = rounds["plain windows"]
    throughput = {}
    for name, runs in rounds.items():
        throughput[name] = {
            "mtok_per_s": max(wall for wall, _, _ in runs) / 1e6,
            "mtok_per_cpu_s": max(cpu for _, cpu, _ in runs) / 1e6,
            "batches": runs[0][2],
            "ratio_to_plain": spread([run[0] / base[0] for run, base in zip(runs, plain, strict=True)]),
            "cpu_ratio_to_plain": spread([run[1] / base[1] for run, base in zip(runs, plain, strict=True)]),
        }
    results = {
        "machine": {**machine(), "torch": torch.__version__, "numpy": np.__version__},
        "tokens": arguments.tokens,
        "rounds": arguments.repeats,
        "throughput": throughput,
        "padding_share": share,
        "packing_build": {"documents": arguments.documents, **build},
    }
    lines = [
        f"{arguments.tokens / 1e6:.0f}M uint32 tokens, documents of 50-5,000 tokens, ({BATCH}, {SEQUENCE_LENGTH}) "
        f"batches; {arguments.repeats} interleaved rounds",
        "",
        "| mode | Mtok/s (best) | × plain, wall time: median (lowest - highest) | Mtok per CPU second (best) "
        "| × plain, CPU time: median (lowest - highest) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, entry in throughput.items():
        wall, cpu = entry["ratio_to_plain"], entry["cpu_ratio_to_plain"]
        lines.append(
            f"| {name} | {entry['mtok_per_s']:.1f} | {wall['median']:.2f} ({wall['low']:.2f} - {wall['high']:.2f}) "
            f"| {entry['mtok_per_cpu_s']:.1f} | {cpu['median']:.2f} ({cpu['low']:.2f} - {cpu['high']:.2f}) |"
        )
    lines += [
        "",
        f"padding share of packed rows: {100 * share:.3f}%",
        f"packing {arguments.documents:,} documents: {build['first_use_s']:.2f} s first use, "
        f"{1000 * build['cached_s']:.1f} ms cached",
    ]
    write_results("window_modes", results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
