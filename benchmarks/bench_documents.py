"""Documents as training data: named parts, each measured in one run and reported as ratios or shares.

Parts (``--parts``, default: all):

* ``padding``: preference (DPO) records, each a prompt, a chosen and a rejected completion of 20 to 600
  tokens, read for one shuffled epoch four ways, and the share of the token slots of the batches that
  hold no record token:

  - fixed batches of ``--batch`` records through TRL's ``DataCollatorForPreference`` (the DPO trainer's:
    prompt + chosen and prompt + rejected, each field padded to the batch's longest);
  - ``batch_tokens=N`` through the same TRL collator (a budget alone does not even out lengths);
  - ``batch_tokens=N`` laid out padding-free (the records' sequences one after another in a row of N
    slots, as varlen attention takes them): the padding is the budget left unused;
  - ``pack_documents=True, sequence_length=L``: rows of whole records best-fit decreasing, each row L slots.

  A record's length is what the DPO layout makes of it, ``2 × prompt + chosen + rejected`` tokens: the
  format's ``length``, recorded by the writer (a storage without recorded lengths counts bytes instead).
  Goals: under 10% padding with a budget, under 2% packed.

Writes ``results/documents.json`` (one entry per part measured; other parts' entries are kept).

    python -m benchmarks.bench_documents                      # 20,000 records (seconds)
    python -m benchmarks.bench_documents --records 100_000 --parts padding
"""

from __future__ import annotations

import argparse
import json
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import argument_parser, count, machine, read_results, write_results
from guideloom import DocumentStorage, StatefulDataLoader
from guideloom.types import DocumentStorageFormat

VOCABULARY = 32_000
SHARDS = 4
PAD_ID = 0


class PreferenceFormat(DocumentStorageFormat[dict[str, Any], dict[str, Any]]):
    """A preference record as three little-endian counts and its int32 tokens; no pickle."""

    name = "bench-preference"
    counts = struct.Struct("<III")

    def pack(self, data: dict[str, Any]) -> bytes:
        fields = [np.asarray(data[key], "<i4") for key in ("prompt_ids", "chosen_ids", "rejected_ids")]
        return self.counts.pack(*(len(field) for field in fields)) + b"".join(field.tobytes() for field in fields)

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        counts = self.counts.unpack_from(encoded_data)
        tokens = np.frombuffer(encoded_data, "<i4", offset=self.counts.size)
        bounds = np.cumsum([0, *counts]).tolist()
        keys = ("prompt_ids", "chosen_ids", "rejected_ids")
        return {key: tokens[bounds[k] : bounds[k + 1]] for k, key in enumerate(keys)}

    def length(self, data: dict[str, Any]) -> int:
        """The tokens the record takes in a DPO batch: the prompt twice, then each completion."""
        return 2 * len(data["prompt_ids"]) + len(data["chosen_ids"]) + len(data["rejected_ids"])


def preference_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 601, (count, 3))
    return [
        {
            key: rng.integers(1, VOCABULARY, n).tolist()
            for key, n in zip(("prompt_ids", "chosen_ids", "rejected_ids"), row, strict=True)
        }
        for row in lengths.tolist()
    ]


def write_records(path: Path, records: list[dict[str, Any]]) -> DocumentStorage[Any, Any]:
    storage = DocumentStorage(path, PreferenceFormat())
    per_shard = -(-len(records) // SHARDS)
    with storage.sync_writer() as writer:
        for index, record in enumerate(records):
            writer.append(index // per_shard, record)
    return storage


def record_tokens(record: dict[str, Any]) -> int:
    return 2 * len(record["prompt_ids"]) + len(record["chosen_ids"]) + len(record["rejected_ids"])


def trl_padding(records: list[dict[str, Any]]) -> tuple[int, int]:
    """(record tokens, token slots) of a batch through TRL's DPO collator."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    collator = DataCollatorForPreference(pad_token_id=PAD_ID)
    batch = collator([{key: value.tolist() for key, value in record.items()} for record in records])
    return int(batch["attention_mask"].sum()), int(batch["input_ids"].numel())


def epoch_share(storage: Any, count: Callable[[Any], tuple[int, int]], **options: Any) -> dict[str, Any]:
    """One shuffled epoch; each batch's (record tokens, slots) summed into the padding share."""
    tokens = slots = batches = 0
    with StatefulDataLoader.from_storage(
        storage, lambda samples: samples, device="cpu", shuffle=True, **options
    ) as loader:
        for batch in loader:
            used, room = count(batch)
            tokens, slots, batches = tokens + used, slots + room, batches + 1
    return {"batches": batches, "record_tokens": tokens, "slots": slots, "padding_share": 1 - tokens / slots}


def padding_part(arguments: argparse.Namespace) -> dict[str, Any]:
    """The padding share of fixed batches (TRL's DPO collator), budgets and packed records."""
    records = preference_records(arguments.records)
    budget, row = arguments.batch_tokens, arguments.sequence_length
    with tempfile.TemporaryDirectory() as directory:
        storage = write_records(Path(directory) / "preferences", records)
        rows = {
            "fixed batches, TRL DPO collator": epoch_share(storage, trl_padding, local_batch_size=arguments.batch),
            "batch_tokens, TRL DPO collator": epoch_share(storage, trl_padding, batch_tokens=budget),
            "batch_tokens, padding-free row": epoch_share(
                storage, lambda batch: (sum(map(record_tokens, batch)), budget), batch_tokens=budget
            ),
            "pack_documents, rows of sequence_length": epoch_share(
                storage,
                lambda batch: (sum(record_tokens(record) for packed in batch for record in packed), row * len(batch)),
                local_batch_size=1,
                pack_documents=True,
                sequence_length=row,
            ),
        }
    return {
        "records": arguments.records,
        "batch": arguments.batch,
        "batch_tokens": budget,
        "sequence_length": row,
        "rows": rows,
        "goals": {"batch_tokens, padding-free row": 0.10, "pack_documents, rows of sequence_length": 0.02},
    }


PARTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {"padding": padding_part}


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--records", type=count, default=20_000)
    parser.add_argument("--batch", type=int, default=32, help="records per fixed batch")
    parser.add_argument("--batch-tokens", type=count, default=32_768, help="the budget of a batch, in length units")
    parser.add_argument("--sequence-length", type=count, default=8_192, help="the length of a packed row")
    arguments = parser.parse_args()
    chosen = [part.strip() for part in arguments.parts.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}: choose from {sorted(PARTS)}")
    results = read_results("documents") or {}
    for part in chosen:
        results[part] = {**PARTS[part](arguments), "machine": machine()}
        print(json.dumps({part: results[part]}, indent=2))
    write_results("documents", results)


if __name__ == "__main__":
    main()
