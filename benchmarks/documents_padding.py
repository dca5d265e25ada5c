"""``bench_documents --parts padding``: the padding of preference batches, fixed, by budget and packed.

One shuffled epoch of the ``records`` part's preference records, read four ways, and the share of the
token slots of the batches that hold no record token:

- fixed batches of ``--batch`` records through TRL's ``DataCollatorForPreference`` (the DPO trainer's:
  prompt + chosen and prompt + rejected, each field padded to the batch's longest);
- ``batch_tokens=N`` through the same TRL collator (a budget alone does not even out lengths);
- ``batch_tokens=N`` laid out padding-free (the records' sequences one after another in a row of N
  slots, as varlen attention takes them): the padding is the budget left unused;
- ``pack_documents=True, sequence_length=L``: rows of whole records best-fit decreasing, each row L slots;
- the padding-free budget and the packed rows again with ``shuffle_window`` over 1, 4 and 8 machines (one
  rank each, every rank's epoch counted), the records written in 64 shards (packed rows beside the same 64
  shards in the global order: rows are packed shard by shard). Every step by budget takes as many records
  from each machine's share, so a step is as long as the machine with the longest records allows.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.documents_data import FIELDS, preference_tokens, write_records
from guideloom import StatefulDataLoader

PAD_ID = 0
WINDOW = 4  # shards a machine mixes at a time in the windowed rows
WINDOWED_SHARDS = 64
TRL_KEYS = ("prompt_ids", "chosen_ids", "rejected_ids")


def trl_padding(records: list[dict[str, Any]]) -> tuple[int, int]:
    """(record tokens, token slots) of a batch through TRL's DPO collator."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    collator = DataCollatorForPreference(pad_token_id=PAD_ID)
    examples = [{key: record[name].tolist() for key, name in zip(TRL_KEYS, FIELDS, strict=True)} for record in records]
    batch = collator(examples)
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


def machines_share(
    storage: Any, count: Callable[[Any], tuple[int, int]], machines: int, **options: Any
) -> dict[str, Any]:
    """`epoch_share` over every rank of ``machines`` machines of one rank each, read with ``shuffle_window``."""
    ranks = [
        StatefulDataLoader.from_storage(
            storage,
            lambda samples: samples,
            device="cpu",
            shuffle=True,
            shuffle_window=WINDOW,
            rank=rank,
            world_size=machines,
            local_world_size=1,
            **options,
        )
        for rank in range(machines)
    ]
    tokens = slots = 0
    try:
        for step in zip(*ranks, strict=True):
            for batch in step:
                used, room = count(batch)
                tokens, slots = tokens + used, slots + room
        batches = len(ranks[0])
    finally:
        for loader in ranks:
            loader.close()
    return {"batches": batches, "record_tokens": tokens, "slots": slots, "padding_share": 1 - tokens / slots}


def padding_part(arguments: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The padding share of fixed batches (TRL's DPO collator), budgets and packed records."""
    storage = write_records(root, arguments.records)
    budget, row = arguments.batch_tokens, arguments.sequence_length
    rows = {
        "fixed batches, TRL DPO collator": epoch_share(storage, trl_padding, local_batch_size=arguments.batch),
        "batch_tokens, TRL DPO collator": epoch_share(storage, trl_padding, batch_tokens=budget),
        "batch_tokens, padding-free row": epoch_share(
            storage, lambda batch: (sum(map(preference_tokens, batch)), budget), batch_tokens=budget
        ),
        "pack_documents, rows of sequence_length": epoch_share(
            storage,
            lambda batch: (sum(preference_tokens(record) for packed in batch for record in packed), row * len(batch)),
            local_batch_size=1,
            pack_documents=True,
            sequence_length=row,
        ),
    }
    (root / "windowed").mkdir()
    streamed = write_records(root / "windowed", arguments.records, max(1, arguments.records // WINDOWED_SHARDS))
    for machines in (1, 4, 8):
        rows[f"batch_tokens, padding-free row, shuffle_window={WINDOW}, {machines} machines"] = machines_share(
            streamed, lambda batch: (sum(map(preference_tokens, batch)), budget), machines, batch_tokens=budget
        )
    rows[f"pack_documents, rows of sequence_length, {WINDOWED_SHARDS} shards"] = epoch_share(
        streamed,
        lambda batch: (sum(preference_tokens(record) for packed in batch for record in packed), row * len(batch)),
        local_batch_size=1,
        pack_documents=True,
        sequence_length=row,
    )
    rows[f"pack_documents, rows of sequence_length, {WINDOWED_SHARDS} shards, shuffle_window={WINDOW}, 4 machines"] = (
        machines_share(
            streamed,
            lambda batch: (sum(preference_tokens(record) for packed in batch for record in packed), row * len(batch)),
            4,
            local_batch_size=1,
            pack_documents=True,
            sequence_length=row,
        )
    )
    print("| padding: batches | batches | padding share |")
    print("|---|---:|---:|")
    for name, share in rows.items():
        print(f"| {name} | {share['batches']:,} | {share['padding_share']:.2%} |")
    return {
        "records": arguments.records,
        "batch": arguments.batch,
        "batch_tokens": budget,
        "sequence_length": row,
        "rows": rows,
        "goals": {"batch_tokens, padding-free row": 0.10, "pack_documents, rows of sequence_length": 0.02},
    }
