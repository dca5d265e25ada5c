"""Reading some fields: ``reader.read(i, fields=...)`` returns those keys alone and reads nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from guideloom import CorruptStorageError, DocumentJsonFormat, DocumentStorage
from guideloom.fields import Image, ImageValue, Json, RecordSchema, Text
from tests.fields.media_files import image_bytes

SCHEMA = RecordSchema(caption=Text(), image=Image(), meta=Json(optional=True))


def write(path: Path, count: int) -> DocumentStorage:
    storage = DocumentStorage(path, SCHEMA)
    with storage.sync_writer() as writer:
        for number in range(count):
            writer.append(number % 2, {"caption": f"caption {number}", "image": image_bytes(8 + number, 5, "PNG")})
    return storage


def test_the_fields_named_are_read_in_the_order_named(storage_path: Path) -> None:
    with write(storage_path, 4).sync_reader() as reader:
        assert [reader.read(index, fields=("caption",)) for index in range(4)] == [
            {"caption": "caption 0"},
            {"caption": "caption 2"},
            {"caption": "caption 1"},
            {"caption": "caption 3"},
        ]
        both = reader.read(3, fields=("image", "caption"))
        assert list(both) == ["image", "caption"] and isinstance(both["image"], ImageValue)
        assert both["image"].width == 11
        assert reader.read(3, fields=("meta",)) == {"meta": None}
        assert reader.read(3, fields=()) == {}


def test_fields_left_out_are_not_read(storage_path: Path) -> None:
    """The image's metadata in the shard is overwritten: its caption still reads, its image does not."""
    write(storage_path, 1)
    shard = next((storage_path / "shards").iterdir())
    content = bytearray(shard.read_bytes())
    record = content.index(b"caption 0") + len("caption 0")
    content[record : record + 16] = b"\xff" * 16  # the image's head (it follows the caption): no longer ASCII
    shard.chmod(0o644)
    shard.write_bytes(bytes(content))
    with DocumentStorage(storage_path, SCHEMA).sync_reader() as reader:
        assert reader.read(0, fields=("caption",)) == {"caption": "caption 0"}
        with pytest.raises(CorruptStorageError, match="record 0 of shard 0 is damaged: field 'image' cannot be read"):
            reader.read(0)


def test_fields_must_be_the_schema_s_and_need_a_schema(storage_path: Path, tmp_path: Path) -> None:
    with write(storage_path, 1).sync_reader() as reader:
        with pytest.raises(ValueError, match="the schema has no field 'text'"):
            reader.read(0, fields=("text",))
        with pytest.raises(TypeError, match="fields must be a tuple of field names, got str"):
            reader.read(0, fields="caption")  # type: ignore[arg-type]
    json_storage = DocumentStorage(tmp_path / "json", DocumentJsonFormat())
    with json_storage.sync_writer() as writer:
        writer.append(0, {"caption": "a"})
    with (
        json_storage.sync_reader() as reader,
        pytest.raises(TypeError, match="fields= reads records of a RecordSchema"),
    ):
        reader.read(0, fields=("caption",))
