"""Packed fine-tuning batches: guideloom's ``pack_documents=True`` beside TRL's own BFD packing.

The same tokenized conversations (synthetic: lengths lognormal between 50 and 4,000 tokens, about half
of each conversation in assistant turns) are packed into rows of ``--sequence-length`` tokens both ways,
conversations longer than a row truncated in both (TRL's ``strategy="bfd"``, guideloom's
``long_documents="truncate"``), and read for one shuffled epoch of batches of ``--batch`` rows:

* guideloom: a masked ``TokenStorage`` read by ``StatefulDataLoader.from_storage(pack_documents=True)``,
  batches of ``(B, S)`` with ``labels`` -100 outside the assistant's turns;
* TRL: ``datasets.Dataset`` of ``input_ids`` and ``labels`` (-100 outside the assistant's turns, as
  ``SFTTrainer`` builds them), ``trl.pack_dataset(..., strategy="bfd")``, read by a plain
  ``torch.utils.data.DataLoader`` with TRL's ``DataCollatorForLanguageModeling(padding_free=True)``,
  which is what ``SFTTrainer`` does (its batches are flattened to ``(1, N)``); once with the dataset as
  ``SFTTrainer`` leaves it (Python lists), once in NumPy format (``with_format("numpy")``), faster.

Measured, as ratios in one run: tokens per second of the batches delivered (conversation tokens; best
of ``--repeats`` interleaved epochs), the padding share (the share of the ``B x S`` token slots of a
batch that hold no conversation token: padding for guideloom, the unfilled room of the packed rows
for TRL, which a fixed-shape step would pad), and the one-off preparation (TRL's ``pack_dataset``,
guideloom's packing at first use). Writes ``results/sft.json``.

    python -m benchmarks.bench_sft                       # 20,000 conversations (about a minute on 2 cores)
    python -m benchmarks.bench_sft --conversations 100_000
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import harness
from guideloom import StatefulDataLoader, TokenStorage

VOCABULARY = 32_000
SHARDS = 4
PAD_ID = VOCABULARY  # an id no conversation holds: padding is counted exactly


def conversations(count: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` conversations: tokens and a loss mask alternating user and assistant turns (about half each)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=6.3, sigma=0.9, size=count), 50, 4000).astype(np.int64)
    made = []
    for length in lengths.tolist():
        tokens = rng.integers(0, VOCABULARY, length, dtype=np.uint32)
        turns = rng.integers(1, 5)  # user/assistant exchanges
        cuts = np.sort(rng.choice(np.arange(1, length), size=min(2 * turns - 1, length - 1), replace=False))
        mask = np.zeros(length, np.bool_)
        bounds = [0, *cuts.tolist(), length]
        for turn in range(1, len(bounds) - 1, 2):  # the odd segments are the assistant's
            mask[bounds[turn] : bounds[turn + 1]] = True
        made.append((tokens, mask))
    return made


def write_storage(path: Path, data: list[tuple[np.ndarray, np.ndarray]]) -> TokenStorage:
    storage = TokenStorage(path, dtype="uint32", loss_mask=True)
    per_shard = -(-len(data) // SHARDS)
    with storage.sync_writer() as writer:
        for index, (tokens, mask) in enumerate(data):
            writer.append(index // per_shard, tokens, loss_mask=mask)
    return storage


def guideloom_epoch(storage: TokenStorage, batch: int, length: int, count: bool = False) -> dict[str, float]:
    """One shuffled epoch of packed batches: seconds, conversation tokens delivered (``count``), token slots.

    Counting the padding costs a pass over each batch, so the timed epochs leave it to the first.
    """
    with StatefulDataLoader.from_storage(
        storage,
        device="cpu",
        local_batch_size=batch,
        sequence_length=length,
        pack_documents=True,
        long_documents="truncate",
        pad_id=PAD_ID,
        shuffle=True,
        seed=0,
    ) as loader:
        start = time.perf_counter()
        real = slots = 0
        for rows in loader:
            ids = rows["input_ids"]
            slots += ids.numel()
            if count:
                real += int((ids != PAD_ID).sum())
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": real, "slots": slots}


def trl_dataset(data: list[tuple[np.ndarray, np.ndarray]], length: int) -> tuple[Any, float]:
    """TRL's packed dataset of the conversations, and the seconds ``pack_dataset`` took."""
    from datasets import Dataset, disable_progress_bars
    from trl import pack_dataset

    disable_progress_bars()
    dataset = Dataset.from_dict(
        {
            "input_ids": [tokens.tolist() for tokens, _ in data],
            "labels": [np.where(mask, tokens.astype(np.int64), -100).tolist() for tokens, mask in data],
        }
    )
    start = time.perf_counter()
    packed = pack_dataset(dataset, length, strategy="bfd")
    return packed, time.perf_counter() - start


def trl_epoch(packed: Any, batch: int, length: int) -> dict[str, float]:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    loader = torch.utils.data.DataLoader(
        packed, batch_size=batch, shuffle=True, collate_fn=collate, generator=torch.Generator().manual_seed(0)
    )
    start = time.perf_counter()
    real = slots = 0
    for rows in loader:
        real += rows["input_ids"].numel()  # flattened, no padding: (1, N)
        slots += batch * length  # what a batch of B rows of S would hold
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": real, "slots": slots}


def main() -> None:
    parser = harness.argument_parser(__doc__)
    parser.add_argument("--conversations", type=harness.count, default=20_000)
    parser.add_argument("--sequence-length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    length, batch = arguments.sequence_length, arguments.batch
    data = conversations(arguments.conversations)
    total = sum(len(tokens) for tokens, _ in data)
    kept = sum(min(len(tokens), length) for tokens, _ in data)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["GUIDELOOM_CACHE_DIR"] = str(Path(scratch) / "cache")
        storage = write_storage(Path(scratch) / "sft", data)
        start = time.perf_counter()
        counted = guideloom_epoch(storage, batch, length, count=True)  # builds the packing (cached below)
        guideloom_first_epoch = time.perf_counter() - start
        assert counted["tokens"] == kept, (counted["tokens"], kept)  # every kept token served once
        packed, trl_packing = trl_dataset(data, length)
        readers: dict[str, Callable[[], dict[str, float]]] = {
            "guideloom": lambda: guideloom_epoch(storage, batch, length),
            "trl": lambda: trl_epoch(packed, batch, length),
            "trl, numpy format": lambda: trl_epoch(packed.with_format("numpy"), batch, length),
        }
        rounds = harness.interleaved(readers, arguments.repeats)  # the best of each: the machine may be shared
        runs = {name: min(epochs, key=lambda run: run["seconds"]) for name, epochs in rounds.items()}
        for run in runs.values():
            run["tokens"] = run["tokens"] or counted["tokens"]
    for name, run in runs.items():
        assert run["tokens"] == kept, (name, run["tokens"], kept)  # each serves every kept token once
    rates = {name: run["tokens"] / run["seconds"] for name, run in runs.items()}
    fastest_trl = max(rate for name, rate in rates.items() if name.startswith("trl"))
    padding = {name: 1 - run["tokens"] / run["slots"] for name, run in runs.items()}
    results = {
        "machine": {**harness.machine(), "torch": torch.__version__},
        "conversations": arguments.conversations,
        "tokens": total,
        "tokens_kept": kept,
        "sequence_length": length,
        "batch": batch,
        "mtok_per_s": {name: rate / 1e6 for name, rate in rates.items()},
        "throughput_ratio_guideloom_to_fastest_trl": rates["guideloom"] / fastest_trl,
        "padding_share": padding,
        "preparation_s": {"trl_pack_dataset": trl_packing, "guideloom_first_epoch": guideloom_first_epoch},
        "resumable": {"guideloom": "state_dict(), exact, O(1)", "trl": "no state (the Trainer skips consumed batches)"},
    }
    harness.write_results("sft", results)
    print(
        f"{arguments.conversations:,} conversations, {total / 1e6:.1f}M tokens ({kept / 1e6:.1f}M kept in rows of "
        f"{length}), batches of {batch}"
    )
    print("| | Mtok/s | x TRL's fastest | padding share |\n|---|---:|---:|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate / 1e6:.2f} | {rate / fastest_trl:.1f} | {100 * padding[name]:.2f}% |")
    print(
        f"TRL pack_dataset: {trl_packing:.2f} s; guideloom's first epoch, packing built: {guideloom_first_epoch:.2f} s"
    )


if __name__ == "__main__":
    main()
