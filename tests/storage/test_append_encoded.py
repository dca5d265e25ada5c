"""``append_encoded``: many records already encoded, appended in one write, read back as if appended one by one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from guideloom import DocumentStorage, TokenStorage
from guideloom.fields import Image, RecordSchema, Text, Tokens
from tests.helpers.import_inputs import JPEG

SCHEMA = RecordSchema(text=Text(), ids=Tokens("int32"))
RECORDS = [{"text": f"record {i} ✓" * (i % 3), "ids": list(range(i % 5))} for i in range(40)]


def _read_all(path: Path) -> list[bytes]:
    with DocumentStorage(path, SCHEMA).sync_reader() as reader:
        return [SCHEMA.pack({"text": r["text"], "ids": r["ids"]}) for r in (reader.read(i) for i in range(len(reader)))]


def test_records_appended_encoded_read_back_as_appended_one_by_one(tmp_path: Path) -> None:
    encoded = [SCHEMA.pack(record) for record in RECORDS]
    with DocumentStorage(tmp_path / "one", SCHEMA).sync_writer() as writer:
        for record in RECORDS:
            writer.append(0, record)
    with DocumentStorage(tmp_path / "many", SCHEMA).sync_writer() as writer:
        writer.append_encoded(0, b"".join(encoded[:25]), [len(data) for data in encoded[:25]])
        writer.append(0, RECORDS[25])
        writer.append_encoded(
            0, np.frombuffer(b"".join(encoded[26:]), np.uint8), np.array([len(d) for d in encoded[26:]])
        )
    assert _read_all(tmp_path / "many") == _read_all(tmp_path / "one") == encoded
    one = sorted(p.read_bytes() for p in (tmp_path / "one" / "shards").iterdir())
    many = sorted(p.read_bytes() for p in (tmp_path / "many" / "shards").iterdir())
    assert one == many  # the same shard file, byte for byte


def test_sizes_that_do_not_add_up_are_refused(tmp_path: Path) -> None:
    with DocumentStorage(tmp_path, SCHEMA).sync_writer() as writer:
        with pytest.raises(ValueError, match="add up to 3 bytes, not the 4"):
            writer.append_encoded(0, b"abcd", [1, 2])


def test_a_token_storage_refuses_encoded_records(tmp_path: Path) -> None:
    with TokenStorage(tmp_path, dtype="uint16").sync_writer() as writer:
        with pytest.raises(ValueError, match="document storage"):
            writer.append_encoded(0, b"ab", [2])
        writer.append(0, [1, 2])


def test_records_of_a_schema_with_field_columns_fill_the_columns_too(tmp_path: Path) -> None:
    schema = RecordSchema(text=Text(), image=Image(optional=True))
    records = [{"text": f"caption {i}", "image": JPEG if i % 2 else None} for i in range(6)]
    encoded = [schema.pack(record) for record in records]
    with DocumentStorage(tmp_path / "one", schema).sync_writer() as writer:
        for record in records:
            writer.append(0, record)
    with DocumentStorage(tmp_path / "many", schema).sync_writer() as writer:
        writer.append_encoded(0, b"".join(encoded), [len(data) for data in encoded])
    one = sorted(p.read_bytes() for p in (tmp_path / "one" / "shards").iterdir())
    many = sorted(p.read_bytes() for p in (tmp_path / "many" / "shards").iterdir())
    assert one == many  # records and field columns alike
