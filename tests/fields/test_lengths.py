"""``RecordSchema(length=fn)``: a record's length from its text and its media's metadata, stored at write time, so
``batch_tokens`` and ``pack_documents`` budget by it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from guideloom import DocumentStorage, StatefulDataLoader
from guideloom.fields import Image, ImageValue, RecordSchema, Tokens
from tests.fields.media_files import image_bytes

PATCH = 28
SIZES = [(56, 28), (90, 60), (28, 28), (200, 120), (40, 100), (150, 150), (30, 29), (84, 56)] * 3


def image_tokens(image: ImageValue) -> int:
    return (image.height // PATCH) * (image.width // PATCH)


def sequence_cost(record: dict[str, Any]) -> int:
    return len(record["tokens"]) + image_tokens(record["image"])


SCHEMA = RecordSchema(tokens=Tokens("int32"), image=Image(), length=sequence_cost)


def write(path: Path) -> tuple[DocumentStorage, list[int]]:
    """Records of a few text tokens and an image each, over two shards; and each record's cost, reckoned here."""
    storage = DocumentStorage(path, SCHEMA)
    costs = []
    with storage.sync_writer() as writer:
        for number, (width, height) in enumerate(SIZES):
            tokens = list(range(number % 7 + 1))
            writer.append(number // 12, {"tokens": tokens, "image": image_bytes(width, height, "JPEG", seed=number)})
            costs.append(len(tokens) + (height // PATCH) * (width // PATCH))
    return storage, costs


def record_ids(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """What a batch's records are: (text tokens, image width), telling every record of SIZES apart."""
    return [(len(record["tokens"]), record["image"].width) for record in records]


def test_the_length_counts_text_tokens_and_image_patches(storage_path: Path) -> None:
    storage, costs = write(storage_path)
    with storage.sync_reader() as reader:
        assert [reader.length(index) for index in range(len(reader))] == costs
        assert np.concatenate([reader.shard_lengths(position) for position in range(2)]).tolist() == costs


def test_budget_batches_hold_records_whose_costs_fit(storage_path: Path) -> None:
    """Against a reference that walks the records one by one, in order, with their costs reckoned from sizes."""
    storage, costs = write(storage_path)
    budget = 40
    expected, batch, used = [], [], 0
    for index, cost in enumerate(costs):
        if batch and used + cost > budget:
            expected.append(batch)
            batch, used = [], 0
        batch.append(index)
        used += cost
    expected.append(batch)
    with storage.sync_reader() as reader:
        keys = [record_ids([reader.read(index)])[0] for index in range(len(reader))]
    with StatefulDataLoader.from_storage(storage, record_ids, device="cpu", batch_tokens=budget) as loader:
        batches = list(loader)
    assert batches == [[keys[index] for index in batch] for batch in expected]


def test_packed_rows_fit_the_row_by_their_costs(storage_path: Path) -> None:
    storage, costs = write(storage_path)
    row = 64
    with storage.sync_reader() as reader:
        cost_of = {record_ids([reader.read(index)])[0]: costs[index] for index in range(len(reader))}
    with StatefulDataLoader.from_storage(
        storage,
        lambda rows: [record_ids(records) for records in rows],
        device="cpu",
        local_batch_size=1,
        pack_documents=True,
        sequence_length=row,
    ) as loader:
        rows = [packed for batch in loader for packed in batch]
    assert sorted(key for packed in rows for key in packed) == sorted(cost_of)
    assert all(sum(cost_of[key] for key in packed) <= row for packed in rows)
    # best-fit decreasing per shard: a row's records go longest first
    assert all(
        [cost_of[key] for key in packed] == sorted((cost_of[key] for key in packed), reverse=True) for packed in rows
    )
