"""Hostile and damaged inputs: tar members read as data only, damaged files named, nothing written outside DEST."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from guideloom.importing import ImportInputError, import_records
from tests.helpers.import_inputs import JPEG, add_member, stored_records, write_jsonl, write_webdataset
from tests.helpers.processes import child_environment


def _special(tar: tarfile.TarFile, name: str, kind: bytes, target: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    tar.addfile(info)


def _files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*")}


def test_links_and_devices_in_a_tar_are_skipped_and_counted(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "mixed.tar", "w") as tar:
        add_member(tar, "a.txt", b"first")
        _special(tar, "a.jpg", tarfile.SYMTYPE, "/etc/passwd")
        _special(tar, "b.jpg", tarfile.LNKTYPE, "a.txt")
        _special(tar, "b.dev", tarfile.CHRTYPE)
        _special(tar, "b.fifo", tarfile.FIFOTYPE)
        add_member(tar, "b.txt", b"second")
        add_member(tar, "b.npy", b"\x93NUMPY")
    summary = import_records([tmp_path / "mixed.tar"], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == [{"__key__": "a", "txt": "first"}, {"__key__": "b", "txt": "second"}]
    assert summary.skipped == {
        "tar members that are links": 2,
        "tar members that are devices and other special files": 2,
        "tar members with extension .npy (no field type)": 1,
    }


@pytest.mark.parametrize("name", ["../escape.txt", "/tmp/absolute.txt", "ok/../../escape.txt"])
def test_a_tar_member_named_outside_its_folder_is_refused_and_nothing_is_written_outside(
    tmp_path: Path, name: str
) -> None:
    with tarfile.open(tmp_path / "evil.tar", "w") as tar:
        add_member(tar, "a.txt", b"fine")
        add_member(tar, name, b"escaped")
    before = _files_under(tmp_path)
    with pytest.raises(ImportInputError, match=rf"evil\.tar: member '{name}' has an absolute name or one with '\.\.'"):
        import_records([tmp_path / "evil.tar"], tmp_path / "out", workers=1)
    assert {path for path in _files_under(tmp_path) - before if tmp_path / "out" not in path.parents} <= {
        tmp_path / "out"
    }
    assert not Path("/tmp/absolute.txt").exists()


def test_a_truncated_tar_names_the_tar_and_row(tmp_path: Path) -> None:
    samples = [{"__key__": f"k{i}".encode(), "jpg": JPEG * 40, "txt": b"caption"} for i in range(30)]
    data = write_webdataset(tmp_path / "whole.tar", samples).read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(ImportInputError, match=r"cut\.tar: a truncated or damaged tar, at row \d+"):
        import_records([tmp_path / "cut.tar"], tmp_path / "out", workers=1)


def test_a_truncated_parquet_file_is_named(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["a"] * 1000}), tmp_path / "whole.parquet")
    data = (tmp_path / "whole.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImportInputError, match=r"cut\.parquet: not a readable Parquet file"):
        import_records([tmp_path / "cut.parquet"], tmp_path / "out", workers=1)


def test_damaged_parquet_pages_are_named_with_the_row(tmp_path: Path) -> None:
    table = pa.table({"n": list(range(20_000))})
    pq.write_table(table, tmp_path / "rows.parquet", compression="zstd", row_group_size=5000)
    data = bytearray((tmp_path / "rows.parquet").read_bytes())
    metadata = pq.ParquetFile(tmp_path / "rows.parquet").metadata
    third = metadata.row_group(2).column(0)
    start = third.data_page_offset + 20
    data[start : start + 200] = b"\xab" * 200  # the third row group's page, inside its zstd frame
    (tmp_path / "rows.parquet").write_bytes(bytes(data))
    with pytest.raises(
        ImportInputError, match=r"rows\.parquet: a damaged Parquet file in row group 2 \(rows 10000 to 14999"
    ):
        import_records([tmp_path / "rows.parquet"], tmp_path / "out", workers=1)


def test_a_truncated_arrow_file_is_named(tmp_path: Path) -> None:
    table = pa.table({"text": [f"row {i}" for i in range(5000)]})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=500)
    (tmp_path / "cut.arrow").write_bytes(sink.getvalue()[: len(sink.getvalue()) * 2 // 3])
    with pytest.raises(ImportInputError, match=r"cut\.arrow: a damaged Arrow file near row \d+"):
        import_records([tmp_path / "cut.arrow"], tmp_path / "out", workers=1)


def test_a_damaged_zstd_file_is_named(tmp_path: Path) -> None:
    rows = [{"text": f"row {i} " * 20} for i in range(3000)]
    data = bytearray(write_jsonl(tmp_path / "rows.jsonl.zst", rows, compress=True).read_bytes())
    data[len(data) // 2 :] = random.Random(0).randbytes(len(data) - len(data) // 2)
    (tmp_path / "rows.jsonl.zst").write_bytes(bytes(data))
    with pytest.raises(ImportInputError, match=r"rows\.jsonl\.zst: damaged zstd data"):
        import_records([tmp_path / "rows.jsonl.zst"], tmp_path / "out", workers=1)


def test_a_truncated_zstd_file_is_named(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "rows.jsonl.zst", [{"text": "x"}] * 100, compress=True).read_bytes()
    (tmp_path / "rows.jsonl.zst").write_bytes(data[:-5])
    with pytest.raises(ImportInputError, match=r"rows\.jsonl\.zst: the zstd data ends early"):
        import_records([tmp_path / "rows.jsonl.zst"], tmp_path / "out", workers=1)


def test_the_command_names_a_damaged_input_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really parquet PAR1")
    result = subprocess.run(
        [sys.executable, "-m", "guideloom", "import", str(tmp_path / "junk.parquet"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_environment(),
    )
    assert result.returncode == 2
    assert "junk.parquet: not a readable Parquet file" in result.stderr
    assert "Traceback" not in result.stderr
