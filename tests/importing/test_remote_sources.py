"""Sources on an object store (a real S3 API server, moto): Parquet, JSONL and tar objects, one or under a prefix."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from guideloom.importing import import_records
from tests.helpers.import_inputs import JPEG, stored_records, write_webdataset
from tests.remote.s3_support import S3Server


def _put(server: S3Server, bucket: str, key: str, data: bytes) -> str:
    import boto3

    boto3.client("s3", endpoint_url=server.endpoint).put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def _parquet(rows: list[dict[str, object]]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=7)
    return out.getvalue()


def test_a_prefix_of_parquet_and_jsonl_objects(tmp_path: Path, s3_server: S3Server, bucket: str) -> None:
    rows = [{"text": f"row {i}", "n": i} for i in range(40)]
    _put(s3_server, bucket, "data/a.parquet", _parquet(rows[:25]))
    _put(s3_server, bucket, "data/b.jsonl", "".join(json.dumps(row) + "\n" for row in rows[25:]).encode())
    _put(s3_server, bucket, "data/README.md", b"not an input")
    summary = import_records(
        [f"s3://{bucket}/data"], tmp_path / "out", storage_options=s3_server.options, shard_size=256, workers=1
    )
    assert summary.rows == 40
    assert stored_records(tmp_path / "out") == rows


def test_a_tar_object_and_its_provenance(tmp_path: Path, s3_server: S3Server, bucket: str) -> None:
    samples = [{"__key__": f"k{i}".encode(), "jpg": JPEG, "txt": f"c{i}".encode()} for i in range(6)]
    url = _put(
        s3_server, bucket, "shards/images-0.tar", write_webdataset(tmp_path / "images.tar", samples).read_bytes()
    )
    import_records([url], tmp_path / "out", storage_options=s3_server.options, workers=1)
    assert [record["txt"] for record in stored_records(tmp_path / "out")] == [f"c{i}" for i in range(6)]
    recorded = json.loads((tmp_path / "out" / "sources" / "inputs.json").read_text())
    assert recorded["inputs"] == [url]


def test_a_missing_object_is_named(tmp_path: Path, s3_server: S3Server, bucket: str) -> None:
    with pytest.raises(FileNotFoundError, match=f"source not found: s3://{bucket}/nothing"):
        import_records([f"s3://{bucket}/nothing"], tmp_path / "out", storage_options=s3_server.options)
