"""The schema: inferred from the sources, or given (a JSON file, module:attribute); rows that do not fit are named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from guideloom import DocumentStorage
from guideloom.fields import Array, Image, Json, RecordSchema, Scalar, Text, Tokens
from guideloom.importing import ImportInputError, import_records, imported_schema
from tests.helpers.import_inputs import JPEG, stored_records, write_jsonl, write_webdataset
from tests.helpers.processes import child_environment


def test_inferred_fields_from_arrow_types(tmp_path: Path) -> None:
    table = pa.table(
        {
            "text": pa.array(["a"], pa.string()),
            "ids": pa.array([[1, 2]], pa.list_(pa.uint16())),
            "embedding": pa.array([[0.5, 1.5]], pa.list_(pa.float32())),
            "label": pa.array([3], pa.int8()),
            "meta": pa.array([{"k": 1}], pa.struct([("k", pa.int64())])),
            "image": pa.array([JPEG], pa.binary()),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    import_records([tmp_path / "a.parquet"], tmp_path / "out", workers=1)
    assert (
        imported_schema(tmp_path / "out").name
        == RecordSchema(
            text=Text(),  # Parquet statistics: no nulls in these flat columns
            ids=Tokens("uint16", optional=True),
            embedding=Array("float32", shape=(None,), optional=True),
            label=Scalar("int8"),
            meta=Json(optional=True),
            image=Image(),
        ).name
    )


def test_a_json_schema_file_replaces_the_inferred_fields(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x", "ids": [1, 2, 3]}, {"ids": [4]}])
    (tmp_path / "schema.json").write_text(json.dumps({"text": {"type": "text", "optional": True}, "ids": {
        "type": "tokens", "dtype": "uint16"}}))  # fmt: skip
    import_records([tmp_path / "a.jsonl"], tmp_path / "out", schema=tmp_path / "schema.json", workers=1)
    assert imported_schema(tmp_path / "out").name == RecordSchema(text=Text(optional=True), ids=Tokens("uint16")).name
    assert stored_records(tmp_path / "out") == [{"text": "x", "ids": [1, 2, 3]}, {"text": None, "ids": [4]}]


def test_a_record_schema_named_module_attribute_keeps_its_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_schemas.py").write_text(
        "from guideloom.fields import RecordSchema, Text, Tokens\n"
        "def cost(record):\n    return len(record['ids'])\n"
        "SCHEMA = RecordSchema(text=Text(), ids=Tokens('int32'), length=cost)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x", "ids": [1, 2, 3]}, {"text": "y", "ids": [4]}])
    import_records([tmp_path / "a.jsonl"], tmp_path / "out", schema="my_schemas:SCHEMA", workers=1)
    import my_schemas  # type: ignore[import-not-found]

    with DocumentStorage(tmp_path / "out", my_schemas.SCHEMA).sync_reader() as reader:
        assert [reader.length(index) for index in range(len(reader))] == [3, 1]


def test_a_value_the_given_schema_cannot_hold_names_input_and_row(tmp_path: Path) -> None:
    pq.write_table(pa.table({"ids": [[1], [2], [70_000], [3]]}), tmp_path / "a.parquet")
    with pytest.raises(ImportInputError, match=r"a\.parquet: row 2 does not fit the schema: field 'ids': values"):
        import_records(
            [tmp_path / "a.parquet"], tmp_path / "out", schema={"ids": {"type": "tokens", "dtype": "uint16"}}
        )


def test_a_missing_field_names_input_and_row(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}, {"text": "y"}, {"other": 1}])
    with pytest.raises(ImportInputError, match=r"a\.jsonl: row 2 does not fit the schema: field 'other' is not in"):
        import_records([tmp_path / "a.jsonl"], tmp_path / "out", schema={"text": "text"}, workers=1)


def test_a_damaged_image_names_the_tar_and_row(tmp_path: Path) -> None:
    samples = [{"__key__": b"good", "jpg": JPEG}, {"__key__": b"bad", "jpg": JPEG[:40]}]
    write_webdataset(tmp_path / "images.tar", samples)
    with pytest.raises(ImportInputError, match=r"images\.tar: row 1 does not fit the schema"):
        import_records([tmp_path / "images.tar"], tmp_path / "out", workers=1)


def test_inputs_with_other_fields_need_a_schema(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"n": "text"}])
    write_jsonl(tmp_path / "b.jsonl", [{"n": [1, 2]}])
    with pytest.raises(ImportInputError, match=r"b\.jsonl: field 'n' holds Tokens\(int64\), elsewhere Text\(\)"):
        import_records([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "out", workers=1)


def test_the_command_takes_a_schema_file(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"n": 1}, {"n": 2}])
    (tmp_path / "schema.json").write_text(json.dumps({"n": {"type": "scalar", "dtype": "uint8"}}))
    command = [sys.executable, "-m", "guideloom", "import", str(tmp_path / "a.jsonl"), str(tmp_path / "out")]
    result = subprocess.run(
        [*command, "--schema", str(tmp_path / "schema.json"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_environment(),
    )
    assert result.returncode == 0, result.stderr
    assert "fields: n: Scalar(uint8)" in result.stdout
    assert imported_schema(tmp_path / "out").name == RecordSchema(n=Scalar("uint8")).name
