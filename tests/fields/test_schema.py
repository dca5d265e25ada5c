"""A RecordSchema is a document format: dict records written and read back, its fields recorded in the header."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from guideloom import DocumentStorage, FormatMismatchError, RecordPackError
from guideloom.fields import Array, Image, Json, RecordSchema, Scalar, Text, Tokens
from tests.fields.records import write

SCHEMA = RecordSchema(
    tokens=Tokens("int32"),
    text=Text(),
    score=Scalar("float64"),
    flag=Scalar("bool", optional=True),
    matrix=Array("int16", shape=(None, 2)),
    meta=Json(),
)
RECORDS = [
    {"tokens": [1, 2, 3], "text": "héllo", "score": 0.25, "flag": True, "matrix": [[1, 2], [3, 4]], "meta": {"a": [1]}},
    {"tokens": np.array([7], np.int64), "text": "", "score": 3, "matrix": np.zeros((0, 2), np.int16), "meta": None},
]


def test_records_read_back_field_by_field(storage_path: Path) -> None:
    storage = write(storage_path, SCHEMA, RECORDS)
    with storage.sync_reader() as reader:
        first, second = reader.read(0), reader.read(1)
    assert list(first) == list(SCHEMA.fields)
    assert first["tokens"].dtype == np.int32 and first["tokens"].tolist() == [1, 2, 3]
    assert first["text"] == "héllo" and first["meta"] == {"a": [1]}
    assert first["score"] == 0.25 and first["score"].dtype == np.float64
    assert first["flag"] == np.True_
    assert first["matrix"].tolist() == [[1, 2], [3, 4]] and first["matrix"].dtype == np.int16
    assert second["flag"] is None and second["meta"] is None and second["text"] == ""
    assert second["matrix"].shape == (0, 2) and second["tokens"].tolist() == [7]


def test_the_header_records_the_fields_so_another_schema_is_refused(storage_path: Path) -> None:
    write(storage_path, SCHEMA, RECORDS)
    assert isinstance(DocumentStorage(storage_path, RecordSchema(**SCHEMA.fields)), DocumentStorage)
    others = [
        {**SCHEMA.fields, "tokens": Tokens("int64")},  # another dtype
        {name: SCHEMA.fields[name] for name in reversed(SCHEMA.fields)},  # another order
        {**SCHEMA.fields, "extra": Text(optional=True)},  # another field
        {**SCHEMA.fields, "text": Text(optional=True)},  # optional where it was not
    ]
    for fields in others:
        with pytest.raises(FormatMismatchError, match="record-schema"):
            DocumentStorage(storage_path, RecordSchema(**fields))


def test_an_image_field_s_encoding_is_how_to_write_not_what_is_stored(storage_path: Path) -> None:
    write(storage_path, RecordSchema(image=Image()), [])
    assert DocumentStorage(storage_path, RecordSchema(image=Image(encode="jpeg", quality=80))).format.name


@pytest.mark.parametrize(
    ("record", "error", "message"),
    [
        ({**RECORDS[0], "unknown": 1}, ValueError, "field 'unknown' that the schema does not"),
        ({name: value for name, value in RECORDS[0].items() if name != "text"}, ValueError, "field 'text' is missing"),
        ({**RECORDS[0], "text": b"bytes"}, TypeError, "field 'text': expected a str, got bytes"),
        ({**RECORDS[0], "tokens": ["a"]}, TypeError, "field 'tokens': expected a sequence of integers"),
        ({**RECORDS[0], "tokens": [2**40]}, ValueError, "field 'tokens': values from .* do not fit int32"),
        ({**RECORDS[0], "matrix": [[1, 2, 3]]}, ValueError, r"field 'matrix': expected an array of shape \(None, 2\)"),
        ({**RECORDS[0], "flag": 1}, TypeError, "field 'flag': expected bools"),
        ({**RECORDS[0], "meta": {"a": object()}}, TypeError, "field 'meta': expected a JSON value"),
        ({**RECORDS[0], "score": "1"}, TypeError, "field 'score': expected a number"),
        ([1, 2], TypeError, "a dict of its fields, got list"),
    ],
)
def test_a_record_that_does_not_fit_is_named_with_its_field(
    storage_path: Path, record: object, error: type[Exception], message: str
) -> None:
    storage = DocumentStorage(storage_path, SCHEMA)
    with pytest.raises(RecordPackError, match="record 1 of shard 0") as raised, storage.sync_writer() as writer:
        writer.append(0, RECORDS[0])
        writer.append(0, record)
    assert isinstance(raised.value.__cause__, error)
    assert raised.match(message)


def test_a_schema_is_no_pickle_and_pickles_for_workers(storage_path: Path) -> None:
    storage = write(storage_path, SCHEMA, RECORDS)
    assert "pickle" not in storage.format.name
    copy = pickle.loads(pickle.dumps(SCHEMA))
    assert copy.name == SCHEMA.name and copy.fields == SCHEMA.fields
    with DocumentStorage(storage_path, copy).sync_reader() as reader:
        assert reader.read(0)["text"] == "héllo"


def test_field_types_are_checked_when_the_schema_is_made() -> None:
    with pytest.raises(TypeError, match=r"pass Text\(\)"):
        RecordSchema(text=Text)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="field 'text' must be a field type"):
        RecordSchema(text="text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="integer type"):
        Tokens("float32")
    with pytest.raises(ValueError, match="encode must be one of"):
        Image(encode="gif")
