"""Packed records: ``pack_documents=True, sequence_length=L`` on a DocumentStorage gives rows of whole records."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import DocumentStorage, Mixture, StatefulDataLoader
from guideloom._loading.reopen import loader_from_state
from guideloom._windows.packing import best_fit_decreasing
from tests.documents.records import identifier, make_sized_records, record_lengths
from tests.helpers.batches import assert_resumes_exactly, take

LENGTHS = record_lengths(80, seed=7)
ROW = 128


def rows_of_ids(rows: list[list[bytes]]) -> list[list[int]]:
    return [[identifier(data) for data in row] for row in rows]


@pytest.fixture
def storage(tmp_path: Path) -> DocumentStorage[Any, Any]:
    return make_sized_records(tmp_path / "records", LENGTHS, shards=2)


def packed(storage: Any, **options: Any) -> StatefulDataLoader:
    settings: dict[str, Any] = {"local_batch_size": 3, "shuffle": True, "seed": 1, **options}
    return StatefulDataLoader.from_storage(
        storage, rows_of_ids, device="cpu", pack_documents=True, sequence_length=ROW, **settings
    )


def test_every_record_lies_in_one_row_within_its_length(storage: DocumentStorage[Any, Any]) -> None:
    with packed(storage) as loader:
        rows = [row for batch in loader for row in batch]
    assert sorted(i for row in rows for i in row) == list(range(len(LENGTHS)))
    assert all(sum(LENGTHS[i] for i in row) <= ROW for row in rows)


def test_rows_are_the_token_packing_of_each_shard(storage: DocumentStorage[Any, Any]) -> None:
    expected = []
    for shard in (range(0, 40), range(40, 80)):  # the two shards' records
        starts, order = best_fit_decreasing(np.array([LENGTHS[i] for i in shard]), ROW)
        expected += [[shard[j] for j in order[a:b]] for a, b in pairwise(starts)]
    with packed(storage, shuffle=False, local_batch_size=1) as loader:
        assert [batch[0] for batch in loader] == expected
    assert sum(LENGTHS) / (len(expected) * ROW) > 0.95  # padding-free: few length units left unused


def test_resume_is_exact(storage: DocumentStorage[Any, Any]) -> None:
    with packed(storage) as loader:
        per_epoch = len(loader)
    assert_resumes_exactly(lambda: packed(storage), per_epoch + 3, [1, per_epoch, per_epoch + 1], list)


def test_worker_processes_give_the_same_rows(storage: DocumentStorage[Any, Any]) -> None:
    with packed(storage) as loader:
        expected = take(loader, 8)
    with packed(storage, num_workers=2) as loader:
        assert take(loader, 8) == expected


def test_explain_names_each_rows_records_by_global_index_and_a_state_reopens(
    storage: DocumentStorage[Any, Any],
) -> None:
    with packed(storage) as loader:
        take(loader, 2)
        explained = loader.explain(batches=1)
        state = json.loads(json.dumps(loader.state_dict()))
        (batch,) = take(loader, 1)
    shard_ids = sorted({piece["shard"] for sample in explained[0]["samples"] for piece in sample["pieces"]})
    assert all(piece["stop"] is None for sample in explained[0]["samples"] for piece in sample["pieces"])
    assert [[piece["index"] for piece in sample["pieces"]] for sample in explained[0]["samples"]] == batch
    assert set(shard_ids) <= {0, 1}
    with loader_from_state(state) as reopened:
        assert reopened.explain(batches=1) == explained


def test_a_mixture_of_packed_record_storages(tmp_path: Path) -> None:
    first = make_sized_records(tmp_path / "a", record_lengths(30, seed=1))
    second = make_sized_records(tmp_path / "b", record_lengths(30, seed=2), first_id=1000)
    with packed(Mixture({"a": first, "b": second}, weights={"a": 0.5, "b": 0.5})) as loader:
        rows = [row for batch in take(loader, 6) for row in batch]
    assert all(all(i < 1000 for i in row) or all(i >= 1000 for i in row) for row in rows)  # a row is one storage's


def test_a_record_longer_than_a_row_is_an_error_naming_it_or_dropped(tmp_path: Path) -> None:
    storage = make_sized_records(tmp_path / "records", [10, 200, 30], shards=1)
    with pytest.raises(
        ValueError, match=r"record 1 of shard 0 .* is 200 long, longer than a row of sequence_length=128"
    ):
        packed(storage)
    with packed(storage, long_documents="drop", shuffle=False) as loader:
        assert list(loader) == [[[2, 0]]]


def test_records_are_never_cut(tmp_path: Path) -> None:
    storage = make_sized_records(tmp_path / "records", [10, 200, 30], shards=1)
    with pytest.raises(ValueError, match="cannot apply to packed records, which are never cut"):
        packed(storage, long_documents="truncate")


def test_split_long_documents_is_refused_for_packed_records(tmp_path: Path) -> None:
    storage = make_sized_records(tmp_path / "records", [10, 20, 30], shards=1)
    refusal = r'long_documents="split" cannot apply to packed records \(pack_documents=True on a DocumentStorage\)'
    with pytest.raises(ValueError, match=refusal):
        packed(storage, long_documents="split")
    with pytest.raises(ValueError, match=refusal):  # a mixture's document component as well
        packed(Mixture({"a": storage}, weights={"a": 1.0}), long_documents="split")
    with packed(storage, shuffle=False) as loader:  # left out, the default packs the same records
        assert list(loader) == [[[2, 1, 0]]]


def test_packed_records_need_a_row_length(storage: DocumentStorage[Any, Any]) -> None:
    with pytest.raises(ValueError, match="needs sequence_length"):
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, pack_documents=True)
