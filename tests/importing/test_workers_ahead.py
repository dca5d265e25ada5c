"""Worker processes started while an import is planned: they write its jobs, and none is left behind."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from guideloom.importing import import_records
from guideloom.importing._plan import gather_inputs
from guideloom.importing._run import PYTHON_NAMES, start_workers
from tests.helpers.import_inputs import stored_records, write_jsonl

ROWS = [{"id": index, "text": "x" * 500} for index in range(400)]


def _inputs(folder: Path) -> list[Path]:
    return [write_jsonl(folder / f"part-{number}.jsonl", ROWS[number::4]) for number in range(4)]


def test_as_many_are_started_as_the_inputs_likely_make_jobs(tmp_path: Path) -> None:
    inputs = gather_inputs(_inputs(tmp_path), PYTHON_NAMES)
    with start_workers(inputs, 8, False, "60KiB", PYTHON_NAMES) as started:  # about 4 jobs of 52 KiB
        assert len(started.waiting) == 4
    with start_workers(inputs, None, False, "60KiB", PYTHON_NAMES) as started:  # under 8 MiB: this process
        assert started.waiting == []
    with start_workers(inputs, 2, "auto", "60KiB", PYTHON_NAMES) as started:  # Ray tasks
        assert started.waiting == []
    assert multiprocessing.active_children() == []


def test_workers_started_ahead_write_the_import(tmp_path: Path) -> None:
    summary = import_records(_inputs(tmp_path), tmp_path / "out", workers=2, shard_size="60KiB")
    assert summary.processes == 2 and summary.shards >= 4
    assert sorted(record["id"] for record in stored_records(tmp_path / "out")) == list(range(400))
    assert multiprocessing.active_children() == []


def test_a_plan_that_fails_lets_the_workers_started_ahead_go(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="exists and is not a folder"):
        import_records(inputs, tmp_path / "file", workers=2, shard_size="60KiB")
    assert multiprocessing.active_children() == []
