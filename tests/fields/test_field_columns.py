"""Field columns: the small fields of a schema with media fields, held again per field after a shard's records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from guideloom import CorruptStorageError, DocumentStorage
from guideloom._shards.layout import shard_size
from guideloom.fields import Image, Json, RecordSchema, Text, Tokens
from tests.fields.media_files import image_bytes

SCHEMA = RecordSchema(caption=Text(), image=Image(), meta=Json(optional=True), tokens=Tokens("int32"))


def record(number: int, caption_size: int = 40) -> dict[str, Any]:
    caption = f"caption {number} " + "é" * number
    return {
        "caption": caption.ljust(caption_size, "."),
        "image": image_bytes(6 + number % 5, 4, "PNG", seed=number),
        "meta": {"n": number} if number % 2 else None,
        "tokens": list(range(number % 7)),
    }


def write(path: Path, records: list[dict[str, Any]], schema: RecordSchema = SCHEMA) -> DocumentStorage[Any, Any]:
    storage = DocumentStorage(path, schema)
    with storage.sync_writer() as writer:
        for number, data in enumerate(records):
            writer.append(number % 3, data)
    return storage


def test_the_header_names_the_non_media_fields_of_a_schema_with_media(storage_path: Path, tmp_path: Path) -> None:
    write(storage_path, [record(0)])
    header = json.loads((storage_path / "guideloom.json").read_text())
    assert header["field_columns"] == ["caption", "meta", "tokens"]
    text_only = RecordSchema(caption=Text(), tokens=Tokens("int32"))
    write(tmp_path / "text", [{"caption": "a", "tokens": [1]}], text_only)
    assert "field_columns" not in json.loads((tmp_path / "text" / "guideloom.json").read_text())


@pytest.mark.parametrize("caption_size", [40, 300, 70_000], ids=["1-byte-sizes", "2-byte-sizes", "4-byte-sizes"])
def test_fields_read_from_the_columns_are_those_of_the_records(storage_path: Path, caption_size: int) -> None:
    records = [record(number, caption_size) for number in range(14)]
    with write(storage_path, records).sync_reader() as reader:
        whole = [reader.read(index) for index in range(len(reader))]
        small = [reader.read(index, fields=("tokens", "meta", "caption")) for index in range(len(reader))]
    assert [{"tokens": r["tokens"].tolist(), "meta": r["meta"], "caption": r["caption"]} for r in whole] == [
        {"tokens": r["tokens"].tolist(), "meta": r["meta"], "caption": r["caption"]} for r in small
    ]
    assert sorted(r["caption"] for r in small) == sorted(r["caption"] for r in records)


def test_a_local_read_of_column_fields_reads_the_columns(storage_path: Path) -> None:
    """The records' captions are overwritten in the shard: a caption read from the columns is still the one written."""
    write(storage_path, [record(0)])
    shard = storage_path / "shards" / "000000000000.shard"
    content = bytearray(shard.read_bytes())
    first = content.index(b"caption 0")
    content[first : first + 9] = b"CAPTION 0"  # the record's copy; the column's comes after the records
    shard.chmod(0o644)
    shard.write_bytes(bytes(content))
    with DocumentStorage(storage_path, SCHEMA).sync_reader() as reader:
        assert reader.read(0, fields=("caption",))["caption"].startswith("caption 0")
        assert reader.read(0)["caption"].startswith("CAPTION 0")


def damage(path: Path, find: bytes, last: bool = True) -> None:
    content = bytearray(path.read_bytes())
    at = content.rindex(find) if last else content.index(find)
    content[at] ^= 0x20
    path.chmod(0o644)
    path.write_bytes(bytes(content))


def test_a_damaged_column_is_named_by_verify_and_by_a_read_of_it(storage_path: Path) -> None:
    write(storage_path, [record(number) for number in range(6)])
    damage(storage_path / "shards" / "000000000001.shard", b"caption 4")
    storage = DocumentStorage(storage_path, SCHEMA)
    (problem,) = storage.verify()
    assert "shard 1: its column of field 'caption' is damaged: its checksum does not match" in problem
    with storage.sync_reader() as reader:
        assert reader.read(0, fields=("caption",))["caption"].startswith("caption 0")
        with pytest.raises(CorruptStorageError, match="shard 1: its column of field 'caption' is damaged"):
            reader.read(2, fields=("caption",))  # shard 1's first record


def test_opening_a_shard_checks_its_size_with_its_columns(storage_path: Path) -> None:
    write(storage_path, [record(number) for number in range(3)])
    shard = storage_path / "shards" / "000000000000.shard"
    content = shard.read_bytes()
    shard.chmod(0o644)
    shard.write_bytes(content[: -64 - 56] + bytes(8) + content[-64 - 56 :])  # 8 bytes more before the table
    with DocumentStorage(storage_path, SCHEMA).sync_reader() as reader:
        with pytest.raises(CorruptStorageError, match=r"shard 0 has damaged field columns .*does not fit"):
            reader.read(0)


def test_a_damaged_column_table_is_named(storage_path: Path) -> None:
    write(storage_path, [record(number) for number in range(3)])
    shard = storage_path / "shards" / "000000000000.shard"
    content = bytearray(shard.read_bytes())
    content[-64 - 56] ^= 0x01  # the first entry of the table: caption's values size
    shard.chmod(0o644)
    shard.write_bytes(bytes(content))
    with DocumentStorage(storage_path, SCHEMA).sync_reader() as reader:
        with pytest.raises(CorruptStorageError, match=r"shard 0 has damaged field columns .*column table is damaged"):
            reader.read(0)


def test_a_storage_created_before_columns_reads_and_grows_without_them(storage_path: Path) -> None:
    storage_path.mkdir()
    older = {"checkpoint_bytes": 4096, "format": SCHEMA.name, "kind": "documents", "layout_version": 1}
    (storage_path / "guideloom.json").write_text(json.dumps(older, sort_keys=True) + "\n")
    records = [record(number) for number in range(4)]
    storage = write(storage_path, records)
    with storage.sync_reader() as reader:
        shard = reader.shard(0)
        assert len(shard.view) == shard_size(shard.record_count, shard.data_size, reader.header)  # no columns
        assert [reader.read(index, fields=("caption",)) for index in range(len(reader))] == [
            {"caption": reader.read(index)["caption"]} for index in range(len(reader))
        ]
    assert storage.verify() == []


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"field_columns": []}, "it must name fields"),
        ({"field_columns": ["caption", "caption"]}, "it must name fields"),
        ({"field_columns": "caption"}, "it must name fields"),
        ({"kind": "tokens", "dtype": "uint16", "format": None, "field_columns": ["caption"]}, "no valid storage"),
    ],
    ids=["empty", "twice", "not-a-list", "tokens"],
)
def test_a_header_with_unusable_field_columns_is_refused(storage_path: Path, fields: Any, problem: str) -> None:
    storage_path.mkdir()
    header = {"format": SCHEMA.name, "kind": "documents", "layout_version": 1, **fields}
    (storage_path / "guideloom.json").write_text(json.dumps({k: v for k, v in header.items() if v is not None}))
    with pytest.raises(CorruptStorageError, match=problem):
        DocumentStorage(storage_path, SCHEMA)
