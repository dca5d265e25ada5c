"""``guideloom import``: the progress bar (bytes/s, rows/s), the closing summary, and its exit statuses."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers.import_inputs import add_member, stored_records, write_jsonl
from tests.helpers.processes import child_environment


def _import(*arguments: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "guideloom", "import", *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_environment(),
    )


def test_progress_and_summary(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(5000)]}), tmp_path / "a.parquet")
    with tarfile.open(tmp_path / "b.tar", "w") as tar:
        add_member(tar, "k.txt", b"text")
        add_member(tar, "k.npy", b"\x93NUMPY")
    result = _import(tmp_path / "a.parquet", tmp_path / "b.tar", tmp_path / "out", "--schema", _schema(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "rows/s" in result.stderr and "B/s" in result.stderr  # the bar: input bytes/s, rows/s
    lines = result.stdout.splitlines()
    assert lines[0].startswith("imported 5,001 rows from 2 inputs (") and " into 1 shard in " in lines[0]
    assert lines[1:] == [
        "fields: text: Text(), optional, __key__: Text(), optional, txt: Text(), optional",
        "skipped 1 row: tar members with extension .npy (no field type)",
    ]


def _schema(tmp_path: Path) -> Path:
    path = tmp_path / "schema.json"
    optional_text = {"type": "text", "optional": True}
    path.write_text(json.dumps({"text": optional_text, "__key__": optional_text, "txt": optional_text}))
    return path


def test_quiet_shows_no_bar(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"n": 1}])
    result = _import(tmp_path / "a.jsonl", tmp_path / "out", "--quiet")
    assert (result.returncode, result.stderr) == (0, "")


def test_a_bad_row_exits_1_naming_it_and_keeps_what_was_committed(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"n": i} for i in range(3000)] + [{"n": "x"}])
    result = _import(tmp_path / "a.jsonl", tmp_path / "out", "--quiet", "--shard-size", "1KiB")
    assert result.returncode == 1
    assert result.stderr.startswith(f"guideloom import: error: {tmp_path / 'a.jsonl'}: row 3000 does not fit")
    assert "Traceback" not in result.stderr
    assert [record["n"] for record in stored_records(tmp_path / "out")] == list(
        range(len(stored_records(tmp_path / "out")))
    )


def test_a_missing_source_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    result = _import(tmp_path / "missing.parquet", tmp_path / "out")
    assert result.returncode == 2
    assert "source not found" in result.stderr
    assert not (tmp_path / "out").exists()
