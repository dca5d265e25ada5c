"""Each source format imported: every source row read back equal, in the sources' order, with inferred fields."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from guideloom.importing import ImportInputError, import_records
from tests.helpers.import_inputs import (
    FLAC,
    JPEG,
    PNG,
    add_member,
    stored_records,
    write_jsonl,
    write_litdata,
    write_mds,
    write_webdataset,
)

ROWS = [{"text": f"row {i}", "ids": list(range(i % 5 + 1)), "score": i / 4} for i in range(40)]


def test_parquet_files_in_a_folder_keep_each_files_row_order(tmp_path: Path) -> None:
    folder = tmp_path / "parquet"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:25]), folder / "a.parquet", row_group_size=7)
    pq.write_table(pa.Table.from_pylist(ROWS[25:]), folder / "b.parquet", row_group_size=4)
    summary = import_records([folder], tmp_path / "out", shard_size="1KiB", workers=1)
    assert stored_records(tmp_path / "out") == ROWS
    assert (summary.rows, summary.skipped) == (40, {})
    assert summary.shards > 2  # rolled over at the shard size


def test_jsonl_and_zstd_jsonl(tmp_path: Path) -> None:
    plain = write_jsonl(tmp_path / "a.jsonl", ROWS[:10])
    packed = write_jsonl(tmp_path / "b.jsonl.zst", ROWS[10:], compress=True)
    import_records([plain, packed], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == ROWS


def test_a_saved_dataset_with_image_and_audio_features(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"caption": datasets.Value("string"), "image": datasets.Image(), "sound": datasets.Audio(decode=False)}
    )
    rows = {
        "caption": ["a", "b", "c"],
        "image": [{"bytes": PNG, "path": None}] * 3,
        "sound": [{"bytes": FLAC, "path": None}] * 3,
    }
    table = pa.Table.from_pydict(rows, schema=features.arrow_schema)  # encoding audio would need torchcodec
    datasets.Dataset(table).save_to_disk(str(tmp_path / "saved"))
    summary = import_records([tmp_path / "saved"], tmp_path / "out", workers=1)
    assert "image: Image()" in summary.fields and "sound: Audio()" in summary.fields
    assert stored_records(tmp_path / "out") == [{"caption": c, "image": PNG, "sound": FLAC} for c in "abc"]


def test_an_arrow_ipc_file(tmp_path: Path) -> None:
    table = pa.Table.from_pylist(ROWS)
    with pa.ipc.new_file(str(tmp_path / "rows.arrow"), table.schema) as writer:
        writer.write_table(table, max_chunksize=9)
    import_records([tmp_path / "rows.arrow"], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == ROWS


def test_a_webdataset_tar_by_key_and_extension(tmp_path: Path) -> None:
    samples = [
        {
            "__key__": f"s{i:03d}".encode(),
            "jpg": JPEG,
            "txt": f"caption {i}".encode(),
            "cls": str(i % 3).encode(),
            "json": json.dumps({"i": i}).encode(),
        }
        for i in range(12)
    ]
    write_webdataset(tmp_path / "shard-0.tar", samples)
    summary = import_records([tmp_path / "shard-0.tar"], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == [
        {"__key__": f"s{i:03d}", "jpg": JPEG, "txt": f"caption {i}", "cls": i % 3, "json": {"i": i}} for i in range(12)
    ]
    assert "jpg: Image()" in summary.fields and "cls: Scalar(int64)" in summary.fields


def test_an_mds_folder(tmp_path: Path) -> None:
    rows = [{"text": f"t{i}", "n": i, "tokens": [i, i + 1, i + 2], "image": PNG} for i in range(8)]
    folder = write_mds(tmp_path / "mds", {"text": "str", "n": "int", "tokens": "ndarray:int32", "image": "bytes"}, rows)
    summary = import_records([folder], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == rows
    assert "tokens: Tokens(int32)" in summary.fields and "image: Image()" in summary.fields


def test_a_litdata_folder(tmp_path: Path) -> None:
    items = [{"text": f"t{i}", "n": i, "x": i / 2, "ids": np.arange(i + 1, dtype=np.int32)} for i in range(7)]
    formats = {"text": "str", "n": "int", "x": "float", "ids": "no_header_numpy:2"}
    write_litdata(tmp_path / "lit", formats, items)
    import_records([tmp_path / "lit"], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == [{**item, "ids": item["ids"].tolist()} for item in items]


def test_several_formats_into_one_storage_in_the_order_given(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(ROWS[:20]), tmp_path / "a.parquet")
    write_jsonl(tmp_path / "b.jsonl", ROWS[20:])
    import_records([tmp_path / "b.jsonl", tmp_path / "a.parquet"], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == ROWS[20:] + ROWS[:20]


def test_worker_processes_write_the_same_records(tmp_path: Path) -> None:
    for part in range(4):
        pq.write_table(pa.Table.from_pylist(ROWS[part * 10 : part * 10 + 10]), tmp_path / f"p{part}.parquet")
    inputs = sorted(tmp_path.glob("*.parquet"))
    summary = import_records(inputs, tmp_path / "out", workers=2, shard_size=100)
    assert summary.processes == 2
    assert stored_records(tmp_path / "out") == ROWS


def test_a_saved_dataset_dict_with_lists_of_images_and_class_labels(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {
            "label": datasets.ClassLabel(names=["cat", "dog"]),
            "frames": datasets.Sequence(datasets.Image()),
            "ids": datasets.Sequence(datasets.Value("int32")),
        }
    )

    def split(offset: int) -> Any:
        rows = {
            "label": [offset % 2, (offset + 1) % 2],
            "frames": [[{"bytes": PNG, "path": None}] * 2, [{"bytes": JPEG, "path": None}]],
            "ids": [[offset, 1], [2]],
        }
        return datasets.Dataset.from_dict(rows, features=features)

    datasets.DatasetDict({"train": split(0), "test": split(1)}).save_to_disk(str(tmp_path / "saved"))
    summary = import_records([tmp_path / "saved"], tmp_path / "out", workers=1)
    assert "frames: Images()" in summary.fields and "label: Scalar(int64)" in summary.fields
    split_rows = [
        {"label": label, "frames": frames, "ids": ids}
        for offset in (0, 1)
        for label, frames, ids in zip(
            [offset % 2, (offset + 1) % 2], [[PNG, PNG], [JPEG]], [[offset, 1], [2]], strict=True
        )
    ]
    assert stored_records(tmp_path / "out") == split_rows


def test_a_gzipped_tar_with_keys_in_folders(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "images.tar.gz", "w:gz") as tar:
        for i in range(5):
            add_member(tar, f"part/{i}/img.seg.png", PNG)
            add_member(tar, f"part/{i}/img.txt", f"t{i}".encode())
    import_records([tmp_path / "images.tar.gz"], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == [
        {"__key__": f"part/{i}/img", "seg.png": PNG, "txt": f"t{i}"} for i in range(5)
    ]


def test_compressed_mds_and_litdata_folders(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    rows = [{"text": f"t{i}", "n": i} for i in range(7)]
    mds = write_mds(tmp_path / "mds", {"text": "str", "n": "int"}, rows)
    index = json.loads((mds / "index.json").read_text())
    for shard in index["shards"]:
        raw = mds / shard["raw_data"]["basename"]
        zipped = raw.with_name(raw.name + ".zstd")
        zipped.write_bytes(zstandard.ZstdCompressor().compress(raw.read_bytes()))
        raw.unlink()
        shard["compression"], shard["zip_data"] = "zstd:7", {"basename": zipped.name, "bytes": 0, "hashes": {}}
    (mds / "index.json").write_text(json.dumps(index))
    lit = write_litdata(tmp_path / "lit", {"text": "str", "n": "int"}, rows)
    index = json.loads((lit / "index.json").read_text())
    for chunk in index["chunks"]:
        path = lit / chunk["filename"]
        path.write_bytes(zstandard.ZstdCompressor().compress(path.read_bytes()))
    index["config"]["compression"] = "zstd"
    (lit / "index.json").write_text(json.dumps(index))
    import_records([mds, lit], tmp_path / "out", workers=1)
    assert stored_records(tmp_path / "out") == rows + rows


@pytest.mark.parametrize(
    ("write", "named"),
    [
        (write_mds, "a damaged MDS shard, at row 3 (the sample offsets run past the shard's"),
        (write_litdata, "a damaged LitData chunk, at row 3 (the item offsets run past the chunk's"),
    ],
)
def test_a_truncated_mds_shard_or_litdata_chunk_is_named_with_its_row(tmp_path: Path, write: Any, named: str) -> None:
    folder = write(tmp_path / "folder", {"text": "str", "n": "int"}, [{"text": f"t{i}", "n": i} for i in range(7)])
    second = sorted(path for path in folder.iterdir() if path.name != "index.json")[1]  # rows 3 to 5
    second.write_bytes(second.read_bytes()[:-5])
    with pytest.raises(ImportInputError, match=re.escape(f"{folder}: {named}")):
        import_records([folder], tmp_path / "out", workers=1)


def test_saved_dataset_features_arrays_sequences_and_dicts(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {
            "grid": datasets.Array2D((2, 3), "float32"),
            "words": datasets.Sequence(datasets.Value("string")),
            "pair": {"x": datasets.Value("int32"), "y": datasets.Value("string")},
            "ragged": datasets.Sequence(datasets.Sequence(datasets.Value("int64"))),
        }
    )
    rows = {
        "grid": [np.arange(6, dtype=np.float32).reshape(2, 3)] * 2,
        "words": [["a", "b"], []],
        "pair": [{"x": 1, "y": "q"}, {"x": 2, "y": "r"}],
        "ragged": [[[1, 2], [3]], []],
    }
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "saved"))
    summary = import_records([tmp_path / "saved"], tmp_path / "out", workers=1)
    assert summary.fields.startswith("grid: Array(float32), optional, words: Json(), optional")
    assert stored_records(tmp_path / "out") == [
        {
            "grid": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]],
            "words": ["a", "b"],
            "pair": {"x": 1, "y": "q"},
            "ragged": [[1, 2], [3]],
        },
        {"grid": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "words": [], "pair": {"x": 2, "y": "r"}, "ragged": []},
    ]


def test_dictionary_encoded_columns_and_a_byte_order_mark(tmp_path: Path) -> None:
    table = pa.table({"label": pa.array(["cat", "dog", "cat"]).dictionary_encode(), "n": [1, 2, 3]})
    pq.write_table(table, tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"label": "bird", "n": 4}\n')
    summary = import_records([tmp_path / "a.parquet", tmp_path / "b.jsonl"], tmp_path / "out", workers=1)
    assert summary.fields.startswith("label: Text()")
    assert [record["label"] for record in stored_records(tmp_path / "out")] == ["cat", "dog", "cat", "bird"]


def test_parquet_media_as_bytes_or_bytes_and_path_structs_without_metadata(tmp_path: Path) -> None:
    media = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "jpg": pa.array([JPEG, JPEG], pa.binary()),
            "audio": pa.array([{"bytes": FLAC, "path": "a.flac"}, {"bytes": FLAC, "path": None}], media),
        }
    )
    pq.write_table(table, tmp_path / "media.parquet")
    summary = import_records([tmp_path / "media.parquet"], tmp_path / "out", workers=1)
    assert summary.fields == "jpg: Image(), audio: Audio(), optional"
    assert stored_records(tmp_path / "out") == [{"jpg": JPEG, "audio": FLAC}] * 2
