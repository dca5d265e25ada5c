"""Document-aware token windows: throughput against plain windows, padding share, and packing build time.

Writes ``results/window_modes.json`` and prints a table. Three measurements, one run:

1. Tokens/s (best of 3 interleaved runs) of one shuffled pass over (8, 2048) batches with plain
   windows, ``document_boundaries=True`` and ``pack_documents=True`` (uint32 tokens in documents of
   50-5,000 tokens), ``num_workers`` 0, as ratios to plain windows (goal: >= 0.8x). One more row, the
   floor: plain windows plus the two int64 arrays that both modes add to a batch, written and nothing
   more (no implementation of the modes on one core can be faster).
2. The padding share of the packed rows (goal: <= 2%).
3. Time to build the packing of 10^6 documents (one shard), first use and from the cache.

    python benchmarks/bench_window_modes.py            # 20M tokens (under a minute on 2 cores)
    python benchmarks/bench_window_modes.py --tokens 100_000_000 --documents 1_000_000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._windows.packing_cache import load_or_build

SEQUENCE_LENGTH = 2048
BATCH = 8
RESULTS = Path(__file__).parent / "results" / "window_modes.json"


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


def tokens_per_second(storage: TokenStorage, floor: bool = False, **mode: Any) -> tuple[float, int]:
    """One shuffled epoch (after a warm-up batch); returns tokens/s and the batches served.

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
        start = time.perf_counter()
        served = 1
        for batch in batches:
            served += 1
            if floor:
                labels, positions = batch.clone(), ramp.clone()  # noqa: F841 (written, then dropped)
        elapsed = time.perf_counter() - start
    return (served - 1) * BATCH * SEQUENCE_LENGTH / elapsed, served


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
    start = time.perf_counter()
    load_or_build(offsets, SEQUENCE_LENGTH)
    first = time.perf_counter() - start
    start = time.perf_counter()
    load_or_build(offsets, SEQUENCE_LENGTH)
    return {"first_use_s": first, "cached_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=lambda text: int(text.replace("_", "")), default=20_000_000)
    parser.add_argument("--documents", type=lambda text: int(text.replace("_", "")), default=1_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
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
        rates: dict[str, tuple[float, int]] = {}
        for _ in range(arguments.repeats):  # interleaved, best of each: the machine may be shared
            for name, mode in modes.items():
                options = dict(mode)
                rate, served = tokens_per_second(options.pop("storage", storage), **options)
                rates[name] = max(rates.get(name, (0.0, 0)), (rate, served))
        share = padding_share(storage)
        build = build_times(arguments.documents)
    plain = rates["plain windows"][0]
    results = {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}, torch {torch.__version__}, numpy {np.__version__}",
        "tokens": arguments.tokens,
        "throughput": {
            name: {"mtok_per_s": rate / 1e6, "batches": served, "ratio_to_plain": rate / plain}
            for name, (rate, served) in rates.items()
        },
        "padding_share": share,
        "packing_build": {"documents": arguments.documents, **build},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{arguments.tokens / 1e6:.0f}M uint32 tokens, documents of 50-5,000 tokens, ({BATCH}, {SEQUENCE_LENGTH})")
    print("| mode | Mtok/s | x plain |\n|---|---:|---:|")
    for name, entry in results["throughput"].items():  # type: ignore[attr-defined]
        print(f"| {name} | {entry['mtok_per_s']:.1f} | {entry['ratio_to_plain']:.2f} |")
    print(f"padding share of packed rows: {100 * share:.3f}%")
    print(
        f"packing {arguments.documents:,} documents: {build['first_use_s']:.2f} s first use, "
        f"{1000 * build['cached_s']:.1f} ms cached"
    )


if __name__ == "__main__":
    main()
