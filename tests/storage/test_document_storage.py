"""DocumentStorage: round trips for every format, zero-copy reads, format identity, writer semantics."""

from __future__ import annotations

import asyncio
import gc
import os
import struct
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom import (
    DocumentJsonFormat,
    DocumentMsgpackFormat,
    DocumentPickleFormat,
    DocumentStorage,
    FormatMismatchError,
    GuideloomError,
    ShardExistsError,
    StorageNotFoundError,
    TokenStorage,
)
from guideloom.types import DocumentStorageFormat
from tests.helpers.storages import RawFormat

MAX_SHARD = 10**12 - 1


class StructTokenFormat(DocumentStorageFormat[dict[str, Any], dict[str, Any]]):
    """The spec's custom format: a uint32 document id, then little-endian int32 tokens."""

    prefix = struct.Struct("<I")

    def pack(self, data: dict[str, Any]) -> bytes:
        return self.prefix.pack(data["document_id"]) + np.asarray(data["tokens"], dtype="<i4").tobytes()

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        (document_id,) = self.prefix.unpack_from(encoded_data)
        tokens = np.frombuffer(encoded_data, dtype="<i4", offset=self.prefix.size)
        return {"document_id": document_id, "tokens": tokens, "shard": shard}


class ViewFormat(DocumentStorageFormat[bytes, memoryview]):
    """Hands back the buffer it was given, to inspect what ``unpack`` receives."""

    name = "raw-bytes"

    def pack(self, data: bytes) -> bytes:
        return bytes(data)

    def unpack(self, encoded_data: memoryview, shard: int) -> memoryview:
        return encoded_data


def write(storage: DocumentStorage[Any, Any], appends: list[tuple[int, Any]]) -> None:
    with storage.sync_writer() as writer:
        for shard, record in appends:
            writer.append(shard, record)


def read_all(storage: DocumentStorage[Any, Any]) -> list[Any]:
    with storage.sync_reader() as reader:
        return [reader.read(i) for i in range(len(reader))]


def storage_order(appends: list[tuple[int, Any]]) -> list[Any]:
    """The global order: ascending shard id, append order within a shard (sorted is stable)."""
    return [record for _, record in sorted(appends, key=lambda item: item[0])]


# --- round trips -------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
FORMATS = {
    "raw": (RawFormat, st.binary(max_size=300)),
    "pickle": (
        DocumentPickleFormat,
        st.binary(max_size=50) | json_values | st.tuples(st.integers(), st.floats(allow_nan=False)),
    ),
    "json": (DocumentJsonFormat, json_values),
    "msgpack": (DocumentMsgpackFormat, json_values | st.binary(max_size=50)),
    "struct": (
        StructTokenFormat,
        st.fixed_dictionaries(
            {"document_id": st.integers(0, 2**32 - 1), "tokens": st.lists(st.integers(-(2**31), 2**31 - 1))}
        ),
    ),
}


def appends_of(records: st.SearchStrategy[Any]) -> st.SearchStrategy[list[tuple[int, Any]]]:
    """Appends to a few random shard ids (up to the largest allowed), interleaved in random order."""
    shard_ids = st.lists(st.integers(0, MAX_SHARD) | st.integers(0, 5), min_size=1, max_size=4, unique=True)
    return shard_ids.flatmap(lambda ids: st.lists(st.tuples(st.sampled_from(ids), records), max_size=20))


def as_written(record: Any) -> Any:
    """A record as its format was given it: a struct record's tokens as a list, without the shard unpack adds."""
    if isinstance(record, dict) and isinstance(record.get("tokens"), np.ndarray):
        return {"document_id": record["document_id"], "tokens": record["tokens"].tolist()}
    return record


@pytest.mark.parametrize("format_name", sorted(FORMATS))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip_in_storage_order(format_name: str, data: st.DataObject) -> None:
    format_class, records = FORMATS[format_name]
    appends = data.draw(appends_of(records))
    with tempfile.TemporaryDirectory() as directory:
        storage = DocumentStorage(Path(directory) / "s", format_class())
        write(storage, appends)
        assert [as_written(r) for r in read_all(storage)] == [as_written(r) for r in storage_order(appends)]


@settings(max_examples=15, deadline=None)
@given(appends=appends_of(st.binary(max_size=20)))
def test_iteration_and_len_match_read(appends: list[tuple[int, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        storage = DocumentStorage(Path(directory) / "s", RawFormat())
        write(storage, appends)
        with storage.sync_reader() as reader:
            assert len(reader) == len(appends)
            assert list(reader) == storage_order(appends)


def test_empty_records_round_trip(storage_path: Path) -> None:
    write(DocumentStorage(storage_path, RawFormat()), [(0, b""), (0, b"x"), (0, b""), (1, b""), (2, b"")])
    assert read_all(DocumentStorage(storage_path, RawFormat())) == [b"", b"x", b"", b"", b""]


def test_unpack_gets_the_shard_id(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, StructTokenFormat())
    write(storage, [(MAX_SHARD, {"document_id": 1, "tokens": []}), (3, {"document_id": 2, "tokens": [5]})])
    assert [(r["document_id"], r["shard"]) for r in read_all(storage)] == [(2, 3), (1, MAX_SHARD)]


def test_writer_with_no_appends_makes_an_empty_storage(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    with storage.sync_writer():
        pass
    with storage.sync_reader() as reader:
        assert len(reader) == 0
        assert list(reader) == []
    assert storage.verify() == []


@pytest.mark.parametrize("index", [-1, -3, 3, 4, 10**12])
def test_read_out_of_range_is_index_error(storage_path: Path, index: int) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    write(storage, [(0, b"a"), (1, b"b"), (1, b"c")])
    with storage.sync_reader() as reader, pytest.raises(IndexError, match="index"):
        reader.read(index)


@pytest.mark.parametrize("index", [1.0, "0", None, True, [0]])
def test_read_non_int_is_type_error(storage_path: Path, index: Any) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    write(storage, [(0, b"a"), (1, b"b")])
    with storage.sync_reader() as reader, pytest.raises(TypeError, match="index"):
        reader.read(index)


def test_read_accepts_numpy_integers(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    write(storage, [(0, b"a"), (1, b"b")])
    with storage.sync_reader() as reader:
        assert reader.read(np.int64(1)) == b"b"


def test_read_from_empty_storage_is_index_error(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    write(storage, [])
    with storage.sync_reader() as reader, pytest.raises(IndexError):
        reader.read(0)


# --- zero-copy ---------------------------------------------------------------------------------------


def test_unpack_receives_a_read_only_memoryview(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, ViewFormat())
    write(storage, [(0, b"hello"), (1, b"")])
    with storage.sync_reader() as reader:
        for index, expected in enumerate([b"hello", b""]):
            view = reader.read(index)
            assert isinstance(view, memoryview)
            assert view.readonly
            assert view.tobytes() == expected
            with pytest.raises(TypeError):
                view[:1] = b"x"
            del view


def test_reads_share_the_mapping_instead_of_copying(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, StructTokenFormat())
    write(storage, [(0, {"document_id": 1, "tokens": list(range(1000))})])
    with storage.sync_reader() as reader:
        first, second = reader.read(0)["tokens"], reader.read(0)["tokens"]
        assert np.shares_memory(first, second)
        assert not first.flags.writeable
        del first, second


@pytest.mark.parametrize("release", ["close", "del"])
def test_numpy_view_outlives_the_reader(storage_path: Path, release: str) -> None:
    storage = DocumentStorage(storage_path, StructTokenFormat())
    tokens = list(range(-500, 500))
    write(storage, [(0, {"document_id": 9, "tokens": tokens}), (1, {"document_id": 10, "tokens": [1]})])
    reader = storage.sync_reader()
    record = reader.read(0)
    if release == "close":
        reader.close()
    del reader
    gc.collect()
    assert record["tokens"].tolist() == tokens
    assert record["document_id"] == 9


def test_close_with_live_views_never_raises_buffer_error(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, ViewFormat())
    write(storage, [(0, b"abc"), (1, b"def")])
    with storage.sync_reader() as reader:
        view = reader.read(1)
        array = np.frombuffer(reader.read(0), np.uint8)
    reader.close()  # a second close is harmless too
    assert view.tobytes() == b"def"
    assert array.tobytes() == b"abc"


def test_closed_reader_refuses_reads(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    write(storage, [(0, b"a")])
    reader = storage.sync_reader()
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.read(0)


# --- format identity and argument errors -------------------------------------------------------------


def test_other_format_class_is_format_mismatch(storage_path: Path) -> None:
    write(DocumentStorage(storage_path, DocumentPickleFormat()), [(0, {"a": 1})])
    for other in (DocumentJsonFormat(), DocumentMsgpackFormat(), StructTokenFormat()):
        with pytest.raises(FormatMismatchError, match="pickle"):
            DocumentStorage(storage_path, other).sync_reader()


def test_mismatch_is_refused_before_writing(storage_path: Path) -> None:
    write(DocumentStorage(storage_path, DocumentJsonFormat()), [(0, [1])])
    with pytest.raises(FormatMismatchError):
        DocumentStorage(storage_path, DocumentPickleFormat()).sync_writer()
    assert read_all(DocumentStorage(storage_path, DocumentJsonFormat())) == [[1]]


def test_named_format_may_be_renamed(storage_path: Path) -> None:
    class Original(RawFormat):
        name = "x"

    class Renamed(DocumentStorageFormat[bytes, bytes]):
        name = "x"

        def pack(self, data: bytes) -> bytes:
            return data

        def unpack(self, encoded_data: memoryview, shard: int) -> bytes:
            return bytes(encoded_data)

    write(DocumentStorage(storage_path, Original()), [(0, b"kept")])
    assert read_all(DocumentStorage(storage_path, Renamed())) == [b"kept"]


def test_unnamed_format_may_move_to_another_module(storage_path: Path) -> None:
    source = """
import struct
import numpy as np
from guideloom.types import DocumentStorageFormat

class StructTokenFormat(DocumentStorageFormat):
    prefix = struct.Struct("<I")

    def pack(self, data):
        return self.prefix.pack(data["document_id"]) + np.asarray(data["tokens"], dtype="<i4").tobytes()

    def unpack(self, encoded_data, shard):
        return {"moved": True, "document_id": self.prefix.unpack_from(encoded_data)[0]}
"""
    moved = types.ModuleType("shared_formats")
    exec(source, moved.__dict__)
    assert moved.StructTokenFormat.__module__ != StructTokenFormat.__module__
    write(DocumentStorage(storage_path, StructTokenFormat()), [(0, {"document_id": 4, "tokens": [1]})])
    assert read_all(DocumentStorage(storage_path, moved.StructTokenFormat())) == [{"moved": True, "document_id": 4}]


def test_token_storage_on_documents_is_format_mismatch(storage_path: Path) -> None:
    write(DocumentStorage(storage_path, RawFormat()), [(0, b"a")])
    with pytest.raises(FormatMismatchError):
        TokenStorage(storage_path)


def test_documents_on_token_storage_is_format_mismatch(storage_path: Path) -> None:
    storage = TokenStorage(storage_path)
    with storage.sync_writer() as writer:
        writer.append(0, [1, 2])
    with pytest.raises(FormatMismatchError):
        DocumentStorage(storage_path, DocumentPickleFormat()).sync_reader()


def test_format_class_instead_of_instance_is_type_error(storage_path: Path) -> None:
    with pytest.raises(TypeError, match=r"DocumentPickleFormat\(\)"):
        DocumentStorage(storage_path, DocumentPickleFormat)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_format", [None, "pickle", object()])
def test_non_format_is_type_error(storage_path: Path, bad_format: Any) -> None:
    with pytest.raises(TypeError, match="format"):
        DocumentStorage(storage_path, bad_format)


def test_non_path_is_type_error() -> None:
    with pytest.raises(TypeError, match="path"):
        DocumentStorage(42, RawFormat())  # type: ignore[arg-type]


def test_pack_returning_non_bytes_is_type_error(storage_path: Path) -> None:
    class TextFormat(RawFormat):
        name = "text"

        def pack(self, data: Any) -> Any:
            return str(data)

    with DocumentStorage(storage_path, TextFormat()).sync_writer() as writer, pytest.raises(TypeError, match="pack"):
        writer.append(0, "x")


@pytest.mark.parametrize(
    ("shard", "error"),
    [(-1, ValueError), (10**12, ValueError), ("0", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError)],
)
def test_bad_shard_id_is_refused(storage_path: Path, shard: Any, error: type[Exception]) -> None:
    with DocumentStorage(storage_path, RawFormat()).sync_writer() as writer, pytest.raises(error, match="shard"):
        writer.append(shard, b"x")


def test_missing_path_for_reading_is_storage_not_found(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "nothing" / "here", RawFormat())
    with pytest.raises(StorageNotFoundError, match="nothing"):
        storage.sync_reader()
    with pytest.raises(StorageNotFoundError):
        storage.verify()
    assert not (tmp_path / "nothing").exists()


def test_directory_without_header_is_storage_not_found(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFoundError, match=r"guideloom\.json"):
        DocumentStorage(tmp_path, RawFormat()).sync_reader()


def test_errors_are_guideloom_errors() -> None:
    assert issubclass(StorageNotFoundError, GuideloomError)
    assert issubclass(FormatMismatchError, GuideloomError)
    assert issubclass(ShardExistsError, GuideloomError)


# --- writer semantics --------------------------------------------------------------------------------


class Boom(Exception):
    pass


def test_exception_in_writer_commits_nothing_of_it(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    write(storage, [(0, b"committed")])
    with pytest.raises(Boom), storage.sync_writer() as writer:
        writer.append(1, b"lost")
        writer.append(2, b"lost")
        raise Boom
    assert read_all(storage) == [b"committed"]
    assert os.listdir(storage_path / "incomplete") == []
    write(storage, [(1, b"again")])
    assert read_all(storage) == [b"committed", b"again"]


def test_early_commit_survives_a_later_exception(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    with pytest.raises(Boom), storage.sync_writer() as writer:
        writer.append(0, b"early")
        writer.commit(0)
        writer.append(1, b"lost")
        raise Boom
    assert read_all(storage) == [b"early"]


def test_committed_shard_is_visible_before_the_writer_ends(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    with storage.sync_writer() as writer:
        writer.append(0, b"a")
        writer.append(1, b"b")
        writer.commit(0)
        assert read_all(storage) == [b"a"]
    assert read_all(storage) == [b"a", b"b"]


def test_append_after_commit_is_shard_exists(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    with storage.sync_writer() as writer:
        writer.append(5, b"a")
        writer.commit(5)
        with pytest.raises(ShardExistsError, match="5"):
            writer.append(5, b"b")
        writer.append(6, b"c")
    assert read_all(storage) == [b"a", b"c"]


def test_commit_of_unwritten_shard_is_value_error(storage_path: Path) -> None:
    with DocumentStorage(storage_path, RawFormat()).sync_writer() as writer, pytest.raises(ValueError, match="7"):
        writer.commit(7)


def test_second_writer_of_committed_shard_is_shard_exists(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    write(storage, [(3, b"first")])
    with storage.sync_writer() as writer, pytest.raises(ShardExistsError, match="3"):
        writer.append(3, b"second")
    assert read_all(storage) == [b"first"]


def test_concurrent_writers_of_one_shard_one_wins(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    first, second = storage.sync_writer(), storage.sync_writer()
    first.append(3, b"first")
    second.append(3, b"second")
    first.close()
    with pytest.raises(ShardExistsError, match="3"):
        second.close()
    assert read_all(storage) == [b"first"]
    assert os.listdir(storage_path / "incomplete") == []


def test_failed_commit_of_one_shard_still_commits_the_others(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    with storage.sync_writer() as late:
        late.append(1, b"late")
        late.append(2, b"kept")
        write(storage, [(1, b"early")])
        with pytest.raises(ShardExistsError, match="1"):
            late.close()
    assert read_all(storage) == [b"early", b"kept"]


def test_storage_object_made_before_the_header_still_refuses_another_format(storage_path: Path) -> None:
    late = DocumentStorage(storage_path, DocumentJsonFormat())
    write(DocumentStorage(storage_path, DocumentPickleFormat()), [(0, "x")])
    with pytest.raises(FormatMismatchError, match="pickle"):
        late.sync_writer()
    with pytest.raises(FormatMismatchError):
        late.sync_reader()


def test_reader_sees_a_snapshot(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    write(storage, [(1, b"old")])
    with storage.sync_reader() as reader:
        write(storage, [(0, b"new")])
        assert len(reader) == 1
        assert reader.read(0) == b"old"
        assert list(reader) == [b"old"]
    assert read_all(storage) == [b"new", b"old"]


def test_many_interleaved_shards_in_one_writer(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    shard_count, rounds = 150, 3
    with storage.sync_writer() as writer:
        for round_ in range(rounds):
            for shard in range(shard_count):
                writer.append(shard, f"{shard}:{round_}".encode())
    expected = [f"{shard}:{round_}".encode() for shard in range(shard_count) for round_ in range(rounds)]
    assert read_all(storage) == expected


def open_files_under(directory: Path) -> int:
    count = 0
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            continue
        count += target.startswith(str(directory))
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_writer_bounds_its_open_files(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())
    with storage.sync_writer() as writer:
        most = 0
        for round_ in range(3):
            for shard in range(200):
                writer.append(shard, bytes([round_]))
                if shard % 10 == 0:
                    most = max(most, open_files_under(storage_path))
        assert most <= 64
    assert len(read_all(storage)) == 600


def test_writer_refuses_appends_after_close(storage_path: Path) -> None:
    writer = DocumentStorage(storage_path, RawFormat()).sync_writer()
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.append(0, b"x")


def test_async_writer_and_reader_round_trip(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, DocumentMsgpackFormat())

    async def main() -> tuple[int, Any, list[Any]]:
        async with storage.async_writer() as writer:
            await writer.append(2, {"id": 2})
            await writer.append(0, {"id": 0})
            await writer.commit(0)
            await writer.append(1, {"id": 1})
        async with storage.async_reader() as reader:
            return len(reader), await reader.read(2), [record async for record in reader]

    length, last, everything = asyncio.run(main())
    assert length == 3
    assert last == {"id": 2}
    assert everything == [{"id": 0}, {"id": 1}, {"id": 2}]


def test_async_writer_exception_commits_nothing(storage_path: Path) -> None:
    storage = DocumentStorage(storage_path, RawFormat())

    async def main() -> None:
        async with storage.async_writer() as writer:
            await writer.append(0, b"lost")
            raise Boom

    with pytest.raises(Boom):
        asyncio.run(main())
    assert read_all(storage) == []
