"""Exactly once: an import killed with SIGKILL at random moments and run again holds every row once, in order."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from guideloom import DocumentStorage
from guideloom.importing import ImportInputError, import_records, imported_schema
from tests.helpers.import_inputs import JPEG, stored_records, write_jsonl, write_webdataset
from tests.helpers.processes import child_environment


def _inputs(folder: Path) -> tuple[list[Path], list[dict[str, object]]]:
    """Parquet files, a JSONL file and a tar of the same fields, and every row they hold in import order."""
    folder.mkdir()
    rows = [{"text": f"document {i} " + "x" * (i % 50), "n": i} for i in range(24_000)]
    paths = []
    for part in range(4):
        path = folder / f"part-{part}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[part * 5000 : part * 5000 + 5000]), path, row_group_size=700)
        paths.append(path)
    paths.append(write_jsonl(folder / "tail.jsonl", rows[20_000:]))
    return paths, rows


def _import(paths: list[Path], destination: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "guideloom", "import", *map(str, paths), str(destination)]
    command += ["--workers", "2", "--shard-size", "32KiB", "--quiet"]
    return subprocess.Popen(
        command, env=child_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )


def _committed(destination: Path) -> int:
    shards = destination / "shards"
    return len(list(shards.iterdir())) if shards.is_dir() else 0


def _kill_after_a_commit(process: subprocess.Popen[bytes], destination: Path, delay: float) -> bool:
    """SIGKILL the command and its workers ``delay`` seconds after its next shard commit; False if it ended first."""
    before = _committed(destination)
    deadline = time.monotonic() + 120
    while _committed(destination) == before and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    if process.poll() is not None:
        return False
    os.killpg(process.pid, signal.SIGKILL)  # the command and its workers, as a machine's crash would
    process.wait()
    return True


def test_killed_at_random_moments_then_run_again_holds_every_row_once(tmp_path: Path) -> None:
    paths, rows = _inputs(tmp_path / "inputs")
    destination = tmp_path / "out"
    chooser = random.Random(int(os.environ.get("GUIDELOOM_KILL_SEED", "40")))
    kills = 0
    for _ in range(5):
        # Within 50 ms of a commit: on a quiet machine an import of what is left can end within a few tenths.
        if not _kill_after_a_commit(_import(paths, destination), destination, chooser.uniform(0, 0.05)):
            break
        kills += 1
    assert kills >= 2 and 0 < _committed(destination)
    finished = _import(paths, destination)
    _, errors = finished.communicate(timeout=300)
    assert finished.returncode == 0, errors.decode()
    assert stored_records(destination) == rows
    assert DocumentStorage(destination, imported_schema(destination)).verify() == []


def _group_members(group: int) -> list[int]:
    """The processes still running in process group ``group`` (zombies, which have ended, left out)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_workers_whose_command_is_killed_stop_and_a_rerun_holds_every_row_once(tmp_path: Path) -> None:
    paths, rows = _inputs(tmp_path / "inputs")
    destination = tmp_path / "out"
    process = _import(paths, destination)
    before = _committed(destination)
    while _committed(destination) == before and process.poll() is None:
        time.sleep(0.01)
    workers = [member for member in _group_members(process.pid) if member != process.pid]
    assert workers, "the import ended before its workers could be seen"
    os.kill(process.pid, signal.SIGKILL)  # the command alone: its workers see it gone and stop
    process.wait()
    deadline = time.monotonic() + 30
    while _group_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group_members(process.pid) == []
    finished = _import(paths, destination)
    _, errors = finished.communicate(timeout=300)
    assert finished.returncode == 0, errors.decode()
    assert stored_records(destination) == rows


def test_a_second_run_over_a_finished_import_writes_nothing(tmp_path: Path) -> None:
    paths, rows = _inputs(tmp_path / "inputs")
    destination = tmp_path / "out"
    first = import_records(paths, destination, shard_size="64KiB", workers=1)
    listing = sorted((destination / "shards").iterdir())
    times = [path.stat().st_mtime_ns for path in listing]
    again = import_records(paths, destination, shard_size="64KiB", workers=1)
    assert (first.rows, again.rows, again.shards, again.bytes) == (len(rows), 0, 0, 0)
    assert sorted((destination / "shards").iterdir()) == listing
    assert [path.stat().st_mtime_ns for path in listing] == times


def test_a_run_stopped_by_a_bad_row_goes_on_where_it_stopped_once_fixed(tmp_path: Path) -> None:
    good = [{"text": f"t{i}", "n": i} for i in range(2000)]
    bad = [*good[:1500], {"text": 5, "n": 1500}, *good[1501:]]  # after the rows the fields are inferred from
    path = write_jsonl(tmp_path / "rows.jsonl", bad)
    with pytest.raises(ImportInputError, match=r"rows\.jsonl: row 1500 does not fit the schema: field 'text'"):
        import_records([path], tmp_path / "out", shard_size=1024, workers=1)
    committed = stored_records(tmp_path / "out")
    assert 0 < len(committed) <= 1500 and committed == good[: len(committed)]
    write_jsonl(path, good)
    summary = import_records([path], tmp_path / "out", shard_size=1024, workers=1)
    assert summary.rows == 2000 - len(committed)
    assert stored_records(tmp_path / "out") == good


def test_the_same_shards_whatever_the_number_of_workers(tmp_path: Path) -> None:
    paths, _ = _inputs(tmp_path / "inputs")
    import_records(paths, tmp_path / "one", shard_size="64KiB", workers=1)
    import_records(paths, tmp_path / "three", shard_size="64KiB", workers=3)
    names = [sorted(path.name for path in (tmp_path / out / "shards").iterdir()) for out in ("one", "three")]
    assert names[0] == names[1]


def test_a_tar_is_resumed_after_its_last_committed_sample(tmp_path: Path) -> None:
    samples = [{"__key__": f"k{i:04d}".encode(), "jpg": JPEG, "txt": f"c{i}".encode()} for i in range(2000)]
    tar = write_webdataset(tmp_path / "images.tar", samples)
    assert _kill_after_a_commit(_import([tar], tmp_path / "out"), tmp_path / "out", 0.05)
    import_records([tar], tmp_path / "out", shard_size="32KiB", workers=2)
    assert [record["__key__"] for record in stored_records(tmp_path / "out")] == [f"k{i:04d}" for i in range(2000)]


def test_inputs_whose_pieces_changed_since_the_import_began_are_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"n": list(range(10))}), tmp_path / "rows.parquet", row_group_size=4)
    import_records([tmp_path / "rows.parquet"], tmp_path / "out", workers=1, shard_size=16)
    pq.write_table(pa.table({"n": list(range(11))}), tmp_path / "rows.parquet", row_group_size=4)
    with pytest.raises(ValueError, match=r"holds an import of other jobs \(input pieces\)"):
        import_records([tmp_path / "rows.parquet"], tmp_path / "out", workers=1, shard_size=16)
    with pytest.raises(ValueError, match="holds an import of other inputs"):
        import_records([write_jsonl(tmp_path / "other.jsonl", [{"n": 0}])], tmp_path / "out", workers=1)


def test_jobs_are_as_few_as_the_shard_size_allows_and_of_equal_size(tmp_path: Path) -> None:
    from guideloom.importing._plan import cut_into_jobs
    from guideloom.importing._stream import Piece

    def pieces(size: int) -> list[tuple[int, Piece]]:
        return [(n, Piece(tmp_path / f"{n}.parquet", "parquet", 0, 10, size)) for n in range(8)]

    # 8 files just under half a shard: 4 jobs of 2 (not 3, 3 and 2, which leave 2 workers unevenly loaded).
    assert [len(job.pieces) for job in cut_into_jobs(pieces(499), 1000)] == [2, 2, 2, 2]
    assert [len(job.pieces) for job in cut_into_jobs(pieces(600), 1000)] == [2, 2, 2, 2]
    assert [len(job.pieces) for job in cut_into_jobs(pieces(300), 1000)] == [3, 3, 2]
    assert [len(job.pieces) for job in cut_into_jobs(pieces(1500), 1000)] == [1] * 8
    # 8 files of 0.2 shards: 2 jobs of 4 (not 5 and 3: the second worker would wait on the first)
    assert [len(job.pieces) for job in cut_into_jobs(pieces(200), 1000)] == [4, 4]
