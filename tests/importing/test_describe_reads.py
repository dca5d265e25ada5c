"""Planning an import reads the inputs' heads, not the inputs: fields are told from metadata and a few values."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from guideloom.importing._parquet import describe
from tests.helpers.import_inputs import JPEG


def _bytes_read() -> int:
    """What this process has read so far (rchar: every read call's bytes, from the page cache or not)."""
    return next(int(line.split()[1]) for line in open("/proc/self/io") if line.startswith("rchar:"))


def test_a_parquet_row_group_is_not_read_to_tell_its_fields(tmp_path: Path) -> None:
    rows = 4000
    table = pa.table({"text": ["y" * 2000] * rows, "image": [JPEG + bytes(2000)] * rows})  # 16 MB, one row group
    pq.write_table(table, tmp_path / "one.parquet", compression="none", use_dictionary=False, row_group_size=rows)
    size = (tmp_path / "one.parquet").stat().st_size
    before = _bytes_read()
    described = describe(tmp_path / "one.parquet", 256 << 20)
    assert _bytes_read() - before < size // 4
    assert described.fields["image"].kind == "image" and described.fields["text"].kind == "text"
