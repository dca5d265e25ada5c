"""Decoding a batch at once (``unpack_many``) and MessagePack records holding NumPy arrays."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from guideloom import DocumentMsgpackFormat, DocumentStorage, FormatMismatchError, StatefulDataLoader
from guideloom.types import DocumentStorageFormat

msgpack = pytest.importorskip("msgpack")


class TokenRecords(DocumentStorageFormat[dict[str, Any], dict[str, Any]]):
    """A uint32 id then int32 tokens; ``unpack_many`` decodes a batch with a few NumPy calls."""

    name = "token-records"
    prefix = struct.Struct("<I")

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def pack(self, data: dict[str, Any]) -> bytes:
        return self.prefix.pack(data["document_id"]) + np.asarray(data["tokens"], "<i4").tobytes()

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        (document_id,) = self.prefix.unpack_from(encoded_data)
        return {"document_id": document_id, "tokens": np.frombuffer(encoded_data, "<i4", offset=4), "shard": shard}

    def unpack_many(self, encoded_data: list[memoryview], shards: list[int]) -> list[dict[str, Any]]:
        self.batch_sizes.append(len(encoded_data))
        words = np.frombuffer(b"".join(encoded_data), "<i4")
        ends = np.cumsum([len(data) // 4 for data in encoded_data])
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        ids = words[starts].view("<u4").tolist()
        return [
            {"document_id": document_id, "tokens": words[start + 1 : end], "shard": shard}
            for document_id, start, end, shard in zip(ids, starts.tolist(), ends.tolist(), shards, strict=True)
        ]


class PerRecord(TokenRecords):
    """The same format (same name), decoding with the default: ``unpack`` per record."""

    unpack_many = DocumentStorageFormat.unpack_many


class ShortBatches(TokenRecords):
    name = "short-batches"

    def unpack_many(self, encoded_data: list[memoryview], shards: list[int]) -> list[dict[str, Any]]:
        return super().unpack_many(encoded_data, shards)[1:]


def write_records(storage: DocumentStorage[Any, Any], count: int) -> None:
    rng = np.random.default_rng(0)
    with storage.sync_writer() as writer:
        for document_id in range(count):
            writer.append(document_id % 3, {"document_id": document_id, "tokens": rng.integers(-5, 5, document_id % 7)})


def as_lists(batch: list[dict[str, Any]]) -> list[tuple[int, list[int], int]]:
    return [(record["document_id"], record["tokens"].tolist(), record["shard"]) for record in batch]


def test_the_loader_decodes_each_batch_with_one_unpack_many_call(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "records", TokenRecords())
    write_records(storage, 50)
    per_record = DocumentStorage(tmp_path / "records", PerRecord())
    sequences = []
    for each in (storage, per_record):
        with StatefulDataLoader.from_storage(each, device="cpu", local_batch_size=8, shuffle=True, seed=3) as loader:
            sequences.append([as_lists(batch) for batch in loader])
    assert storage.format.batch_sizes == [8] * 6 + [2]
    assert per_record.format.batch_sizes == []
    assert sequences[0] == sequences[1]


def test_unpack_many_and_unpack_decode_the_same_records(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "records", TokenRecords())
    write_records(storage, 30)
    with storage.sync_reader() as reader:
        indices = np.array([29, 0, 14, 14, 3], np.int64)
        assert as_lists(reader.read_many(indices)) == as_lists([reader.read(int(i)) for i in indices])


def test_the_default_unpack_many_calls_unpack_per_record() -> None:
    records = [{"document_id": 1, "tokens": [1, 2]}, {"document_id": 2, "tokens": []}]
    document_format = TokenRecords()
    encoded = [memoryview(document_format.pack(record)) for record in records]
    decoded = DocumentStorageFormat.unpack_many(document_format, encoded, [4, 9])
    assert as_lists(decoded) == [(1, [1, 2], 4), (2, [], 9)]


def test_an_unpack_many_that_loses_records_is_named(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "records", ShortBatches())
    write_records(storage, 10)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4) as loader:
        with pytest.raises(TypeError, match=r"ShortBatches.unpack_many must return a list of 4 records, got 3"):
            next(iter(loader))


ARRAYS = hnp.arrays(
    dtype=hnp.integer_dtypes(endianness="=") | hnp.floating_dtypes(endianness="<") | hnp.boolean_dtypes(),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
)


@settings(max_examples=60, deadline=None)
@given(array=ARRAYS, label=st.integers(-(2**63), 2**64 - 1))
def test_msgpack_numpy_arrays_round_trip_with_dtype_and_shape(array: np.ndarray, label: int) -> None:
    document_format = DocumentMsgpackFormat(numpy_arrays=True)
    decoded = document_format.unpack(memoryview(document_format.pack({"x": array, "label": label})), 0)
    assert decoded["label"] == label
    assert decoded["x"].dtype == array.dtype and decoded["x"].shape == array.shape
    np.testing.assert_array_equal(decoded["x"], array)
    assert not decoded["x"].flags.writeable


def test_msgpack_numpy_arrays_in_a_storage_and_the_loader(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "arrays", DocumentMsgpackFormat(numpy_arrays=True))
    tokens = [np.arange(n, dtype=np.int32) for n in (3, 0, 5)]
    with storage.sync_writer() as writer:
        for document_id, array in enumerate(tokens):
            writer.append(0, {"document_id": np.int64(document_id), "tokens": array, "text": "hi"})
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=3) as loader:
        (batch,) = list(loader)
    assert [record["document_id"] for record in batch] == [0, 1, 2]
    assert [type(record["document_id"]) for record in batch] == [int, int, int]
    assert [record["tokens"].tolist() for record in batch] == [t.tolist() for t in tokens]
    assert {record["tokens"].dtype for record in batch} == {np.dtype(np.int32)}


def test_msgpack_numpy_storages_have_their_own_identity(tmp_path: Path) -> None:
    with DocumentStorage(tmp_path / "arrays", DocumentMsgpackFormat(numpy_arrays=True)).sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(3)})
    with pytest.raises(FormatMismatchError, match="msgpack-numpy"):
        DocumentStorage(tmp_path / "arrays", DocumentMsgpackFormat())


def test_plain_msgpack_refuses_arrays_and_names_the_option() -> None:
    with pytest.raises(TypeError, match="numpy_arrays=True"):
        DocumentMsgpackFormat().pack({"tokens": np.arange(3)})
    assert DocumentMsgpackFormat().unpack(
        memoryview(DocumentMsgpackFormat().pack([np.int16(7), np.float32(0.5)])), 0
    ) == [
        7,
        0.5,
    ]


def test_msgpack_numpy_refuses_arrays_of_objects_and_strings() -> None:
    for array in (np.array(["a"]), np.array([object()], dtype=object), np.array(["2020-01-01"], "datetime64[D]")):
        with pytest.raises(TypeError, match="cannot store"):
            DocumentMsgpackFormat(numpy_arrays=True).pack(array)


@pytest.mark.parametrize(
    "payload",
    [
        b"<i4 \x01" + (5).to_bytes(8, "little") + bytes(8),  # shape says 5 elements, 2 are there
        b"|O  \x01" + (1).to_bytes(8, "little") + bytes(8),  # object arrays would construct objects
        b"\xff\xfe  \x01" + (0).to_bytes(8, "little"),  # not a dtype at all
        b"<i4",  # no dimension count
    ],
)
def test_malformed_stored_arrays_are_a_clear_error(payload: bytes) -> None:
    encoded = msgpack.packb({"x": msgpack.ExtType(1, payload)})
    with pytest.raises(ValueError, match="malformed NumPy array"):
        DocumentMsgpackFormat(numpy_arrays=True).unpack(memoryview(encoded), 0)


def test_other_extension_types_stay_extension_types() -> None:
    encoded = msgpack.packb(msgpack.ExtType(5, b"data"))
    assert DocumentMsgpackFormat(numpy_arrays=True).unpack(memoryview(encoded), 0) == msgpack.ExtType(5, b"data")
