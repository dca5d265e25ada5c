"""TokenStorage: dtypes, accepted inputs, the concatenated stream, windows and document starts."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom import FormatMismatchError, StorageNotFoundError, TokenStorage

DTYPES = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
MAX_SHARD = 10**12 - 1


def write(storage: TokenStorage, appends: list[tuple[int, Any]]) -> None:
    with storage.sync_writer() as writer:
        for shard, tokens in appends:
            writer.append(shard, tokens)


def documents(storage: TokenStorage) -> list[list[int]]:
    with storage.sync_reader() as reader:
        return [reader.read(i).tolist() for i in range(len(reader))]


def storage_order(appends: list[tuple[int, Any]]) -> list[list[int]]:
    return [list(tokens) for _, tokens in sorted(appends, key=lambda item: item[0])]


def token_appends(dtype: str, max_documents: int = 15) -> st.SearchStrategy[list[tuple[int, list[int]]]]:
    """Documents (some empty) of in-range ids, appended to a few shards, interleaved."""
    limits = np.iinfo(dtype)
    document = st.lists(st.integers(int(limits.min), int(limits.max)), max_size=30)
    shard_ids = st.lists(st.integers(0, MAX_SHARD) | st.integers(0, 5), min_size=1, max_size=4, unique=True)
    return shard_ids.flatmap(lambda ids: st.lists(st.tuples(st.sampled_from(ids), document), max_size=max_documents))


# --- round trips -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_round_trip_in_storage_order(dtype: str, data: st.DataObject) -> None:
    appends = data.draw(token_appends(dtype))
    with tempfile.TemporaryDirectory() as directory:
        storage = TokenStorage(Path(directory) / "s", dtype)
        write(storage, appends)
        expected = storage_order(appends)
        with storage.sync_reader() as reader:
            assert len(reader) == len(expected)
            assert [reader.read(i).tolist() for i in range(len(reader))] == expected
            assert all(document.dtype == np.dtype(dtype) for document in reader)
            assert reader.token_count == sum(map(len, expected))


@settings(max_examples=40, deadline=None)
@given(appends=token_appends("uint16", max_documents=25), data=st.data())
def test_read_tokens_equals_the_concatenation(appends: list[tuple[int, list[int]]], data: st.DataObject) -> None:
    stream = np.array([t for document in storage_order(appends) for t in document], np.int64)
    start = data.draw(st.integers(0, len(stream)))
    stop = data.draw(st.integers(start, len(stream)))
    with tempfile.TemporaryDirectory() as directory:
        storage = TokenStorage(Path(directory) / "s", "uint16")
        write(storage, appends)
        with storage.sync_reader() as reader:
            assert reader.read_tokens(0, len(stream)).tolist() == stream.tolist()
            assert reader.read_tokens(start, stop).tolist() == stream[start:stop].tolist()
            out = np.full(stop - start, -1, np.int64)
            assert reader.read_tokens(start, stop, out) is out
            assert out.tolist() == stream[start:stop].tolist()


@settings(max_examples=40, deadline=None)
@given(appends=token_appends("uint32", max_documents=25), data=st.data())
def test_document_starts_match_the_document_lengths(appends: list[tuple[int, list[int]]], data: st.DataObject) -> None:
    lengths = [len(document) for document in storage_order(appends)]
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1].astype(int).tolist()
    total = sum(lengths)
    start = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(start, total))
    with tempfile.TemporaryDirectory() as directory:
        storage = TokenStorage(Path(directory) / "s")
        write(storage, appends)
        with storage.sync_reader() as reader:
            found = reader.document_starts(start, stop)
            assert found.dtype == np.int64
            assert sorted(set(found.tolist())) == sorted({s for s in starts if start <= s < stop})


def test_read_tokens_across_shard_boundaries(storage_path: Path) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(2, [5, 6]), (0, [1, 2, 3]), (1, []), (1, [4]), (MAX_SHARD, [7, 8, 9])])
    with storage.sync_reader() as reader:
        assert reader.read_tokens(0, 9).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
        assert reader.read_tokens(2, 7).tolist() == [3, 4, 5, 6, 7]
        assert reader.read_tokens(3, 4).tolist() == [4]
        assert reader.read_tokens(9, 9).tolist() == []


@pytest.mark.parametrize(("start", "stop"), [(-1, 2), (0, 10), (5, 4), (10, 10)])
def test_read_tokens_out_of_range_is_index_error(storage_path: Path, start: int, stop: int) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(0, list(range(9)))])
    with storage.sync_reader() as reader, pytest.raises(IndexError):
        reader.read_tokens(start, stop)


def test_window_count(storage_path: Path) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(0, list(range(10))), (1, list(range(7)))])
    with storage.sync_reader() as reader:
        assert reader.token_count == 17
        assert [reader.window_count(s) for s in (1, 2, 5, 17, 18)] == [17, 8, 3, 1, 0]


@pytest.mark.parametrize("sequence_length", [0, -1])
def test_window_count_of_non_positive_length_is_value_error(storage_path: Path, sequence_length: int) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(0, [1, 2, 3])])
    with storage.sync_reader() as reader, pytest.raises(ValueError, match="sequence_length"):
        reader.window_count(sequence_length)


def test_document_read_is_a_read_only_array(storage_path: Path) -> None:
    storage = TokenStorage(storage_path, "uint16")
    write(storage, [(0, [1, 2, 3])])
    with storage.sync_reader() as reader:
        document = reader.read(0)
        assert isinstance(document, np.ndarray)
        assert document.dtype == np.uint16
        assert not document.flags.writeable
        with pytest.raises(ValueError):
            document[0] = 9
    assert document.tolist() == [1, 2, 3]  # still valid after close


def test_empty_documents_are_kept(storage_path: Path) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(0, []), (0, [1]), (0, np.array([], np.int64)), (1, [])])
    assert documents(storage) == [[], [1], [], []]


@pytest.mark.parametrize("index", [-1, 2])
def test_read_out_of_range_is_index_error(storage_path: Path, index: int) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(0, [1]), (1, [2])])
    with storage.sync_reader() as reader, pytest.raises(IndexError):
        reader.read(index)


@pytest.mark.parametrize("index", [0.0, "1", None])
def test_read_non_int_is_type_error(storage_path: Path, index: Any) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(0, [1])])
    with storage.sync_reader() as reader, pytest.raises(TypeError):
        reader.read(index)


# --- dtypes ------------------------------------------------------------------------------------------


def test_default_dtype_of_a_new_storage_is_uint32(storage_path: Path) -> None:
    storage = TokenStorage(storage_path)
    assert storage.dtype == np.uint32
    write(storage, [(0, [2**32 - 1])])
    with TokenStorage(storage_path).sync_reader() as reader:
        assert reader.read(0).dtype == np.uint32


def test_existing_storage_keeps_its_recorded_dtype(storage_path: Path) -> None:
    write(TokenStorage(storage_path, "uint16"), [(0, [65535])])
    reopened = TokenStorage(storage_path)
    assert reopened.dtype == np.uint16
    write(reopened, [(1, [7])])
    assert documents(TokenStorage(storage_path, np.uint16)) == [[65535], [7]]


@pytest.mark.parametrize("other", ["uint32", "int16", np.int64])
def test_other_explicit_dtype_is_format_mismatch(storage_path: Path, other: Any) -> None:
    write(TokenStorage(storage_path, "uint16"), [(0, [1])])
    with pytest.raises(FormatMismatchError, match="uint16"):
        TokenStorage(storage_path, other)


@pytest.mark.parametrize("dtype", ["float32", "bool", "complex64", "U4"])
def test_non_integer_dtype_is_value_error(storage_path: Path, dtype: str) -> None:
    with pytest.raises(ValueError, match="dtype"):
        TokenStorage(storage_path, dtype)


def test_unknown_dtype_is_type_error(storage_path: Path) -> None:
    with pytest.raises(TypeError, match="dtype"):
        TokenStorage(storage_path, "no-such-dtype")


@pytest.mark.parametrize(
    ("dtype", "tokens"),
    [
        ("uint16", [1, 65536]),
        ("uint16", [-1]),
        ("uint32", [2**32]),
        ("uint32", np.array([-5, 3], np.int64)),
        ("int8", [128]),
        ("int8", [-129]),
        ("int64", np.array([2**63], np.uint64)),
        ("uint64", [-1]),
        ("uint64", [2**64]),
        ("uint8", torch.tensor([0, 256])),
        ("uint32", [-1, 2**64 - 1]),
    ],
)
def test_ids_that_do_not_fit_are_value_error(storage_path: Path, dtype: str, tokens: Any) -> None:
    with TokenStorage(storage_path, dtype).sync_writer() as writer, pytest.raises(ValueError, match="token"):
        writer.append(0, tokens)


def test_large_uint64_ids_in_a_list_are_accepted(storage_path: Path) -> None:
    """A list mixing small ids and ids >= 2**63 is valid uint64 data (NumPy alone would make it float64)."""
    storage = TokenStorage(storage_path, "uint64")
    write(storage, [(0, [0, 2**63, 2**64 - 1])])
    assert documents(storage) == [[0, 2**63, 2**64 - 1]]


def test_rejected_ids_lose_nothing_committed(storage_path: Path) -> None:
    storage = TokenStorage(storage_path, "uint16")
    write(storage, [(0, [1, 2])])
    with storage.sync_writer() as writer:
        writer.append(1, [3])
        with pytest.raises(ValueError):
            writer.append(1, [4, 70000])
        writer.append(1, [5])
    with pytest.raises(ValueError), storage.sync_writer() as writer:
        writer.append(2, [6])
        writer.append(2, [-1])
    assert documents(storage) == [[1, 2], [3], [5]]
    assert storage.verify() == []


# --- accepted inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens",
    [
        [1, 2, 3],
        (1, 2, 3),
        range(1, 4),
        np.array([1, 2, 3], np.int64),
        np.array([1, 2, 3], np.uint8),
        np.array([1, 0, 2, 0, 3, 0], np.int32)[::2],
        torch.tensor([1, 2, 3]),
        torch.tensor([1, 2, 3], dtype=torch.int16),
    ],
    ids=["list", "tuple", "range", "int64", "uint8", "strided", "tensor", "tensor-int16"],
)
def test_accepted_token_inputs(storage_path: Path, tokens: Any) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(0, tokens)])
    assert documents(storage) == [[1, 2, 3]]


@pytest.mark.parametrize(
    "tokens",
    [np.zeros((2, 2), np.int64), torch.zeros((2, 3), dtype=torch.int64), [[1, 2], [3, 4]], np.int64(3)],
    ids=["numpy-2d", "tensor-2d", "nested-list", "numpy-0d"],
)
def test_not_one_dimensional_is_value_error(storage_path: Path, tokens: Any) -> None:
    with TokenStorage(storage_path).sync_writer() as writer, pytest.raises((ValueError, TypeError)):
        writer.append(0, tokens)


@pytest.mark.parametrize(
    "tokens",
    [[1.0, 2.0], [1, 2.5], np.array([1.0]), torch.tensor([1.5]), ["1", "2"], 7, "123", iter([1, 2])],
    ids=["floats", "mixed", "numpy-float", "tensor-float", "strings", "int", "str", "iterator"],
)
def test_non_integer_tokens_are_type_error(storage_path: Path, tokens: Any) -> None:
    with TokenStorage(storage_path).sync_writer() as writer, pytest.raises(TypeError, match="tokens"):
        writer.append(0, tokens)


def test_two_dimensional_tensor_is_value_error(storage_path: Path) -> None:
    with TokenStorage(storage_path).sync_writer() as writer, pytest.raises(ValueError, match="one-dimensional"):
        writer.append(0, torch.zeros((2, 3), dtype=torch.int64))


# --- storages and readers ----------------------------------------------------------------------------


def test_missing_path_for_reading_is_storage_not_found(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFoundError):
        TokenStorage(tmp_path / "missing").sync_reader()


def test_reader_sees_a_snapshot(storage_path: Path) -> None:
    storage = TokenStorage(storage_path)
    write(storage, [(1, [1, 2])])
    with storage.sync_reader() as reader:
        write(storage, [(0, [3])])
        assert reader.token_count == 2
        assert reader.read_tokens(0, 2).tolist() == [1, 2]
    assert documents(storage) == [[3], [1, 2]]


def test_async_round_trip(storage_path: Path) -> None:
    storage = TokenStorage(storage_path, "int32")

    async def main() -> list[list[int]]:
        async with storage.async_writer() as writer:
            await writer.append(1, [-1, 2])
            await writer.append(0, np.array([3]))
        async with storage.async_reader() as reader:
            assert len(reader) == 2
            return [document.tolist() async for document in reader]

    assert asyncio.run(main()) == [[3], [-1, 2]]


# --- memory ------------------------------------------------------------------------------------------

MEASURE_READING = """
import json
import sys

import numpy as np

from guideloom import TokenStorage


def anonymous_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))


storage = TokenStorage(sys.argv[1])
out = np.empty(1 << 20, np.uint32)
before = anonymous_kib()
with storage.sync_reader() as reader:
    document_sum = sum(int(reader.read(i).sum(dtype=np.uint64)) for i in range(len(reader)))
    stream_sum = 0
    for start in range(0, reader.token_count, len(out)):
        stop = min(start + len(out), reader.token_count)
        stream_sum += int(reader.read_tokens(start, stop, out[: stop - start]).sum(dtype=np.uint64))
    copied_sum = 0
    for start in range(0, reader.token_count, len(out)):
        copied_sum += int(reader.read_tokens(start, min(start + len(out), reader.token_count)).sum(dtype=np.uint64))
    after = anonymous_kib()
print(json.dumps({"growth_kib": after - before, "sums": [document_sum, stream_sum, copied_sum]}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_reading_a_large_storage_does_not_grow_anonymous_memory(storage_path: Path, run_python: Any) -> None:
    """About 200 MB of tokens are read three ways; the reading process's own memory stays flat."""
    document = np.arange(250_000, dtype=np.uint32)
    with TokenStorage(storage_path).sync_writer() as writer:
        for shard in range(4):
            for index in range(50):
                writer.append(shard, document + index)
    expected = 4 * sum(int(document.sum()) + index * len(document) for index in range(50))
    completed = run_python(MEASURE_READING, storage_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result["sums"] == [expected] * 3
    assert result["growth_kib"] < 30 * 1024
