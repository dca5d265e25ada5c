"""An import on a Ray cluster (``guideloom.ray.import_records``): the same shards and records as worker processes."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("ray")

from guideloom.importing import import_records
from guideloom.ray import import_records as import_on_ray
from tests.helpers.import_inputs import stored_records, write_jsonl


def test_a_ray_import_writes_what_worker_processes_write_and_resumes(ray_cluster: str, tmp_path: Path) -> None:
    rows = [{"text": f"row {i}", "n": i} for i in range(900)]
    for part in range(3):
        pq.write_table(pa.Table.from_pylist(rows[part * 300 : part * 300 + 300]), tmp_path / f"p{part}.parquet")
    write_jsonl(tmp_path / "tail.jsonl", [{"text": "last", "n": 900}])
    inputs = [*sorted(tmp_path.glob("*.parquet")), tmp_path / "tail.jsonl"]
    summary = import_on_ray(inputs, tmp_path / "ray", address=ray_cluster, shard_size="2KiB")
    import_records(inputs, tmp_path / "here", shard_size="2KiB", workers=1)
    assert summary.rows == 901
    names = [sorted(path.name for path in (tmp_path / out / "shards").iterdir()) for out in ("ray", "here")]
    assert names[0] == names[1]
    assert stored_records(tmp_path / "ray") == [*rows, {"text": "last", "n": 900}]
    again = import_on_ray(inputs, tmp_path / "ray", address=ray_cluster, shard_size="2KiB")
    assert (again.rows, again.shards) == (0, 0)
