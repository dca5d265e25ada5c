"""guideloom.collate.pad: records of token sequences padded into a dict of tensors."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from guideloom import DocumentMsgpackFormat, DocumentStorage, StatefulDataLoader
from guideloom.collate import pad
from guideloom.types import DocumentStorageFormat


def test_a_token_field_is_padded_to_the_batch_s_longest_with_its_mask_and_lengths() -> None:
    batch = pad(pad_id=7)([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 7, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["lengths"].tolist() == [3, 1]
    assert {value.dtype for value in batch.values()} == {torch.int64}


def test_label_like_fields_are_padded_with_minus_100_and_get_no_mask() -> None:
    batch = pad(pad_id=0)([{"input_ids": [5, 6], "labels": [5, 6]}, {"input_ids": [8], "labels": [8]}])
    assert batch["labels"].tolist() == [[5, 6], [8, -100]]
    assert list(batch) == ["input_ids", "attention_mask", "lengths", "labels"]


def test_preference_records_get_a_mask_and_lengths_per_sequence_field() -> None:
    records = [
        {"prompt_input_ids": [1, 2], "chosen_input_ids": [3], "rejected_input_ids": [4, 5, 6], "id": "a"},
        {"prompt_input_ids": [7], "chosen_input_ids": [8, 9], "rejected_input_ids": [10], "id": "b"},
    ]
    batch = pad(pad_id=0)(records)
    assert batch["chosen_input_ids"].tolist() == [[3, 0], [8, 9]]
    assert batch["chosen_attention_mask"].tolist() == [[1, 0], [1, 1]]
    assert batch["rejected_lengths"].tolist() == [3, 1]
    assert batch["prompt_attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert batch["id"] == ["a", "b"]


def test_other_token_field_names_get_suffixed_companions() -> None:
    batch = pad()([{"tokens": np.array([1, 2], np.int32)}, {"tokens": np.array([3], np.int32)}])
    assert batch["tokens"].tolist() == [[1, 2], [3, 0]]
    assert batch["tokens_attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert batch["tokens_lengths"].tolist() == [2, 1]


def test_lists_arrays_and_tensors_pad_alike() -> None:
    records = [{"input_ids": [1, 2, 3]}, {"input_ids": np.array([4], np.uint16)}, {"input_ids": torch.tensor([5, 6])}]
    assert pad()(records)["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]]


def test_scalars_are_stacked_and_strings_kept_as_lists() -> None:
    records = [
        {"score": 0.5, "label": 1, "ok": True, "text": "x"},
        {"score": 1.5, "label": 0, "ok": False, "text": "y"},
    ]
    batch = pad()(records)
    assert batch["score"].dtype == torch.float32 and batch["score"].tolist() == [0.5, 1.5]
    assert batch["label"].dtype == torch.int64 and batch["label"].tolist() == [1, 0]
    assert batch["ok"].tolist() == [True, False]
    assert batch["text"] == ["x", "y"]


def test_float_and_bool_sequences_are_padded_with_zero_and_get_no_mask() -> None:
    records = [{"weights": [0.5, 0.25], "loss_mask": [True, False]}, {"weights": [1.0], "loss_mask": [True]}]
    batch = pad(pad_id=9)(records)
    assert batch["weights"].tolist() == [[0.5, 0.25], [1.0, 0.0]]
    assert batch["loss_mask"].tolist() == [[True, False], [True, False]]
    assert list(batch) == ["weights", "loss_mask"]


def test_a_record_s_own_attention_mask_is_padded_and_none_is_made() -> None:
    records = [{"input_ids": [1, 2], "attention_mask": [1, 0]}, {"input_ids": [3], "attention_mask": [1]}]
    batch = pad()(records)
    assert batch["attention_mask"].tolist() == [[1, 0], [1, 0]]
    assert list(batch) == ["input_ids", "lengths", "attention_mask"]


def test_left_padding_puts_the_padding_before_the_tokens() -> None:
    batch = pad(pad_id=0, padding_side="left")([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [0, 0, 4]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]


def test_pad_to_multiple_of_rounds_the_width_up() -> None:
    batch = pad(pad_to_multiple_of=4)([{"input_ids": [1] * 5}, {"input_ids": [2]}])
    assert batch["input_ids"].shape == (2, 8)
    assert batch["attention_mask"].sum(1).tolist() == [5, 1]


def test_max_length_keeps_the_first_items() -> None:
    batch = pad(max_length=2)([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4], "labels": [4]}])
    assert batch["input_ids"].tolist() == [[1, 2], [4, 0]]
    assert batch["labels"].tolist() == [[1, 2], [4, -100]]
    assert batch["lengths"].tolist() == [2, 1]


def test_arrays_of_two_dimensions_are_stacked_when_their_shapes_match() -> None:
    batch = pad()([{"image": np.zeros((2, 3), np.float32)}, {"image": np.ones((2, 3), np.float32)}])
    assert batch["image"].shape == (2, 2, 3)
    with pytest.raises(ValueError, match="field 'image'"):
        pad()([{"image": np.zeros((2, 3))}, {"image": np.zeros((3, 3))}])


@pytest.mark.parametrize(
    ("records", "error", "message"),
    [
        ([[1, 2]], TypeError, "record 0 of the batch is a list"),
        ([{"input_ids": [1]}, {"labels": [1]}], ValueError, r"record 1 of the batch lacks \['input_ids'\]"),
    ],
)
def test_records_that_are_not_alike_dicts_are_refused_by_name(records: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        pad()(records)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"pad_id": 1.5}, TypeError, "pad_id must be an int"),
        ({"padding_side": "top"}, ValueError, "padding_side must be 'right' or 'left'"),
        ({"pad_to_multiple_of": 0}, ValueError, "pad_to_multiple_of must be at least 1"),
        ({"max_length": 0}, ValueError, "max_length must be at least 1"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        pad(**options)


def test_the_collate_survives_pickling_with_its_options() -> None:
    collate = pickle.loads(pickle.dumps(pad(pad_id=3, padding_side="left", max_length=4)))
    assert repr(collate) == "guideloom.collate.pad(pad_id=3, label_pad_id=-100, padding_side='left', max_length=4)"
    assert collate([{"input_ids": [1, 2, 3, 4, 5]}, {"input_ids": [6]}])["input_ids"].tolist() == [
        [1, 2, 3, 4],
        [3, 3, 3, 6],
    ]


@given(
    st.lists(st.lists(st.integers(0, 1000), max_size=12), min_size=1, max_size=8),
    st.sampled_from(["right", "left"]),
    st.integers(1, 5),
)
def test_padding_keeps_every_sequence_and_the_mask_marks_exactly_its_tokens(
    sequences: list[list[int]], side: str, multiple: int
) -> None:
    batch = pad(pad_id=-1, padding_side=side, pad_to_multiple_of=multiple)(  # type: ignore[arg-type]
        [{"input_ids": sequence} for sequence in sequences]
    )
    longest = max(map(len, sequences))
    assert batch["input_ids"].shape[1] == -(-longest // multiple) * multiple
    rows, masks = batch["input_ids"].tolist(), batch["attention_mask"].tolist()
    for row, mask, sequence in zip(rows, masks, sequences, strict=True):
        assert [token for token, kept in zip(row, mask, strict=True) if kept] == sequence
        assert all(token == -1 for token, kept in zip(row, mask, strict=True) if not kept)
    assert batch["lengths"].tolist() == [len(sequence) for sequence in sequences]


class PreferenceRecords(DocumentStorageFormat[dict[str, Any], dict[str, Any]]):
    """prompt, chosen and rejected int32 tokens after three lengths: decoded as read-only views."""

    name = "test-preference-v1"
    counts = struct.Struct("<3I")

    def pack(self, data: dict[str, Any]) -> bytes:
        fields = [np.asarray(data[name], "<i4") for name in ("prompt", "chosen", "rejected")]
        return self.counts.pack(*map(len, fields)) + b"".join(field.tobytes() for field in fields)

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        counts = self.counts.unpack_from(encoded_data)
        tokens = np.frombuffer(encoded_data, "<i4", offset=self.counts.size)
        ends = np.cumsum(counts)
        return {
            "prompt_input_ids": tokens[: ends[0]],
            "chosen_input_ids": tokens[ends[0] : ends[1]],
            "rejected_input_ids": tokens[ends[1] :],
        }


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pad_collates_a_document_storage_s_records_in_the_loader(tmp_path: Path, num_workers: int) -> None:
    storage = DocumentStorage(tmp_path / "pairs", PreferenceRecords())
    rng = np.random.default_rng(0)
    records = [
        {name: rng.integers(0, 100, int(rng.integers(1, 9))) for name in ("prompt", "chosen", "rejected")}
        for _ in range(24)
    ]
    with storage.sync_writer() as writer:
        for index, record in enumerate(records):
            writer.append(index // 12, record)
    with StatefulDataLoader.from_storage(
        storage, pad(pad_id=-1), device="cpu", local_batch_size=8, num_workers=num_workers
    ) as loader:
        batches = list(loader)
    assert len(batches) == 3
    for number, batch in enumerate(batches):
        for row, record in enumerate(records[8 * number : 8 * number + 8]):
            length = int(batch["chosen_lengths"][row])
            assert batch["chosen_input_ids"][row, :length].tolist() == record["chosen"].tolist()
            assert batch["chosen_attention_mask"][row].sum() == length == len(record["chosen"])


def test_pad_reads_messagepack_records_with_lists(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "sft", DocumentMsgpackFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "source": "web"})
        writer.append(0, {"input_ids": [4, 5], "labels": [-100, 5], "source": "code"})
    with StatefulDataLoader.from_storage(storage, pad(), device="cpu", local_batch_size=2) as loader:
        (batch,) = list(loader)
    assert batch["labels"].tolist() == [[-100, 2, 3], [-100, 5, -100]]
    assert batch["source"] == ["web", "code"]
