"""Record batches packed whole give the bytes ``RecordSchema.pack`` gives each of their rows, or go row by row."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from guideloom import DocumentStorage
from guideloom._fields import record_columns
from guideloom.importing import import_records, imported_schema
from guideloom.importing._arrow_columns import batch_rows, fields_of_schema, packed_batch
from guideloom.importing._schema import record_schema


def _packed_as_rows(batch: pa.RecordBatch) -> list[bytes]:
    """The batch packed whole, cut back into records (it must take the whole-batch path)."""
    fields = fields_of_schema(batch.schema)
    packed = packed_batch(batch, fields, record_schema(fields))
    assert packed is not None, "the batch went row by row"
    payload, sizes = packed
    ends = [0, *sizes.cumsum().tolist()]
    data = payload.tobytes()
    assert len(data) == ends[-1]
    return [data[start:stop] for start, stop in itertools.pairwise(ends)]


def _rows_packed(batch: pa.RecordBatch) -> list[bytes]:
    fields = fields_of_schema(batch.schema)
    schema = record_schema(fields)
    return [schema.pack(row) for row in batch_rows(batch, fields)]


MIXED = pa.record_batch(
    {
        "text": pa.array(["héllo wörld ✓", "", None, "日本語のテキスト", "plain"], pa.string()),
        "big_text": pa.array(["a", "bb", "", "ccc", None], pa.large_string()),
        "ids": pa.array([[1, 2, 3], [], None, [70000], [5]], pa.list_(pa.int32())),
        "wide_ids": pa.array([[1], [2, 3], [], [4], [2**40]], pa.large_list(pa.int64())),
        "label": pa.array([1, None, 3, -4, 5], pa.int8()),
        "score": pa.array([0.5, 1.5, None, float("nan"), -2.0], pa.float32()),
        "flag": pa.array([True, False, None, True, False], pa.bool_()),
        "embedding": pa.array([[0.5, 1.0], [], None, [2.5], [1.0, 2.0, 3.0]], pa.list_(pa.float64())),
        "pairs": pa.array(
            [[[1.0, 2.0]], [], [[3.0, 4.0], [5.0, 6.0]], [[0.0, 0.0]], None], pa.list_(pa.list_(pa.float32(), 2))
        ),
        "fixed": pa.array([[1, 2, 3]] * 5, pa.list_(pa.int16(), 3)),
        "blob": pa.array([b"\x00\x01", b"", None, b"zz", b"\xff"], pa.binary()),
        "meta": pa.array(
            [{"k": 1, "s": "ä"}, None, {"k": None, "s": ""}, {"k": 3, "s": "x"}, {"k": 4, "s": "y"}],
            pa.struct([("k", pa.int64()), ("s", pa.string())]),
        ),
        "tags": pa.array([["a", "b"], [], None, ["ü"], ["c"]], pa.list_(pa.string())),
    }
)


def test_a_mixed_batch_packs_as_its_rows_do() -> None:
    assert _packed_as_rows(MIXED) == _rows_packed(MIXED)


def test_a_slice_of_a_batch_packs_as_its_rows_do() -> None:
    part = MIXED.slice(1, 3)
    assert _packed_as_rows(part) == _rows_packed(part)


def test_a_batch_of_required_fields_packs_without_presence_bits() -> None:
    batch = pa.record_batch({"text": pa.array(["x", "yz"]), "ids": pa.array([[1], [2, 3]], pa.list_(pa.uint16()))})
    fields = fields_of_schema(
        pa.schema([pa.field(name, batch.schema.field(name).type, False) for name in batch.schema.names])
    )
    schema = record_schema(fields)
    packed = packed_batch(batch, fields, schema)
    assert packed is not None
    assert packed[0].tobytes() == b"".join(schema.pack(row) for row in batch_rows(batch, fields))


def test_rows_without_pyarrow_join_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    with_pyarrow = _packed_as_rows(MIXED)
    monkeypatch.setattr(record_columns, "join_rows", record_columns._join_rows_by_slices)
    assert _packed_as_rows(MIXED) == with_pyarrow


def test_a_null_inside_a_list_goes_row_by_row() -> None:
    batch = pa.record_batch({"ids": pa.array([[1, None]], pa.list_(pa.int64()))})
    fields = fields_of_schema(batch.schema)
    assert packed_batch(batch, fields, record_schema(fields)) is None


def test_a_value_out_of_its_fields_range_goes_row_by_row() -> None:
    batch = pa.record_batch({"ids": pa.array([[1], [70000]], pa.list_(pa.int32()))})
    fields = fields_of_schema(batch.schema)
    fields["ids"] = fields["ids"].__class__("tokens", "uint16", True)
    assert packed_batch(batch, fields, record_schema(fields)) is None


def test_an_import_packed_by_batches_cuts_shards_at_the_shard_size(tmp_path: Path) -> None:
    table = pa.table(
        {"text": [f"row {i} " * (i % 7) for i in range(3000)], "ids": [[i] * (i % 11) for i in range(3000)]}
    )
    pq.write_table(table, tmp_path / "in.parquet")  # one row group: one job, its shards cut inside a batch
    summary = import_records([tmp_path / "in.parquet"], tmp_path / "out", workers=1, shard_size="8KiB")
    schema = imported_schema(tmp_path / "out")
    expected = [schema.pack(row) for row in table.to_pylist()]
    storage = DocumentStorage(tmp_path / "out", schema)
    with storage.sync_reader() as reader:
        assert [schema.pack(reader.read(index)) for index in range(len(reader))] == expected
    sizes = [len(record) for record in expected]
    cut, held = 0, 0  # shards cut as the rows go: a shard is full once it holds the shard size
    for size in sizes:
        if held >= 8192:
            cut, held = cut + 1, 0
        held += size
    assert summary.shards == cut + 1
