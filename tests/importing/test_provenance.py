"""Provenance: ``explain`` (API and command) names each imported record's input file and row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from guideloom import DocumentMsgpackFormat, DocumentStorage, StatefulDataLoader
from guideloom._cli import main
from guideloom.importing import import_records, imported_schema


def _imported(tmp_path: Path) -> tuple[Path, dict[int, tuple[str, int]]]:
    """Two inputs imported; each record's ``n`` and the (file, row) it came from."""
    pq.write_table(pa.table({"n": list(range(30))}), tmp_path / "a.parquet", row_group_size=8)
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("\n".join(json.dumps({"n": 30 + i}) if i % 4 else "" for i in range(24)) + "\n")  # blank lines
    import_records([tmp_path / "a.parquet", jsonl], tmp_path / "out", shard_size=64, workers=1)
    origin = {n: (str(tmp_path / "a.parquet"), n) for n in range(30)}
    origin.update({30 + i: (str(jsonl), i) for i in range(24) if i % 4})
    return tmp_path / "out", origin


def _loader(destination: Path, **options: Any) -> StatefulDataLoader:
    storage = DocumentStorage(destination, imported_schema(destination))
    return StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4, shuffle=True, seed=3, **options)


def test_explain_names_each_samples_input_and_row(tmp_path: Path) -> None:
    destination, origin = _imported(tmp_path)
    with _loader(destination) as loader:
        explained = loader.explain(batches=5)
        read = [record["n"] for batch, _ in zip(loader, range(5), strict=False) for record in batch]
    sources = [
        (piece["source"]["file"], piece["source"]["row"])
        for batch in explained
        for sample in batch["samples"]
        for piece in sample["pieces"]
    ]
    assert sources == [origin[n] for n in read]


def test_the_command_prints_input_and_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    destination, origin = _imported(tmp_path)
    with _loader(destination) as loader:
        batches = iter(loader)
        next(batches)
        (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
        following = [record["n"] for record in next(batches)]
    assert main(["explain", str(tmp_path / "state.json")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " from " in line]
    assert [line.split(" from ")[1] for line in lines] == [f"{origin[n][0]} row {origin[n][1]}" for n in following]


def test_storages_written_otherwise_explain_as_before(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "plain", DocumentMsgpackFormat())
    with storage.sync_writer() as writer:
        for n in range(4):
            writer.append(0, {"n": n})
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2) as loader:
        pieces = loader.explain()[0]["samples"][0]["pieces"]
    assert pieces == [{"shard": 0, "record": 0, "index": 0, "start": 0, "stop": None}]
