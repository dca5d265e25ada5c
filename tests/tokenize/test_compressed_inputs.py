"""``guideloom tokenize`` reads gzip, zstd, bz2 and xz inputs as they are, by name and by their first bytes."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zstandard

pytest.importorskip("tokenizers")  # the 'tokenize' extra

from guideloom import TokenStorage
from guideloom._shards.layout import committed_shard_ids
from guideloom.tokenize import TokenizeInputError, tokenize_files, train_tokenizer

TEXTS = [f"Document {number}: the quick brown fox, naïve café {number * 7}." for number in range(300)]
COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.compress,
    "zst": zstandard.ZstdCompressor().compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(TEXTS, 300, tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


def jsonl(texts: list[str]) -> bytes:
    return "".join(json.dumps({"text": text}) + "\n" for text in texts).encode()


def tokens(path: Path) -> np.ndarray:
    with TokenStorage(path).sync_reader() as reader:
        return reader.read_tokens(0, reader.token_count)


@pytest.fixture(scope="module")
def plain_tokens(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> np.ndarray:
    root = tmp_path_factory.mktemp("plain")
    (root / "plain.jsonl").write_bytes(jsonl(TEXTS))
    tokenize_files([root / "plain.jsonl"], root / "out", tokenizer_path, progress=False)
    return tokens(root / "out")


@pytest.mark.parametrize("suffix", COMPRESS)
def test_compressed_jsonl_gives_the_tokens_of_the_plain_file(
    tmp_path: Path, tokenizer_path: Path, plain_tokens: np.ndarray, suffix: str
) -> None:
    source = tmp_path / f"corpus.jsonl.{suffix}"
    source.write_bytes(COMPRESS[suffix](jsonl(TEXTS)))
    summary = tokenize_files([source], tmp_path / "out", tokenizer_path, progress=False)
    assert np.array_equal(tokens(tmp_path / "out"), plain_tokens)
    assert summary.documents == len(TEXTS)
    assert summary.bytes == source.stat().st_size  # progress counts the bytes of the file as stored


def test_compression_is_known_by_the_data_whatever_the_name(tmp_path: Path, tokenizer_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(gzip.compress(jsonl(TEXTS[:2])))
    (tmp_path / "b.txt").write_bytes(COMPRESS["zst"](TEXTS[2].encode()))
    (tmp_path / "c.gz").write_bytes(lzma.compress(TEXTS[3].encode()))  # the data says xz: it is read as xz
    summary = tokenize_files(sorted(tmp_path.glob("[abc]*")), tmp_path / "out", tokenizer_path, eos_token=None)
    assert summary.documents == 4
    with TokenStorage(tmp_path / "out").sync_reader() as reader:
        assert [shard.record_count for shard in reader.shards] == [4]  # small files: one group, one shard


def test_files_of_many_streams_are_read_to_the_end(tmp_path: Path, tokenizer_path: Path) -> None:
    halves = [jsonl(TEXTS[:150]), jsonl(TEXTS[150:])]
    (tmp_path / "a.jsonl.gz").write_bytes(b"".join(map(gzip.compress, halves)) + b"\0" * 8)  # zero padding too
    (tmp_path / "b.jsonl.zst").write_bytes(b"".join(map(COMPRESS["zst"], halves)))
    (tmp_path / "c.jsonl.bz2").write_bytes(b"".join(map(bz2.compress, halves)))
    (tmp_path / "d.jsonl.xz").write_bytes(b"".join(map(lzma.compress, halves)))
    summary = tokenize_files([tmp_path], tmp_path / "out", tokenizer_path, workers=2, progress=False, shard_size=1)
    assert summary.documents == 4 * len(TEXTS) and summary.processes == 2


def test_a_directory_stands_for_its_compressed_text_and_jsonl_files(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl.gz").write_bytes(gzip.compress(jsonl(TEXTS[:3])))
    (corpus / "b.txt.xz").write_bytes(lzma.compress(TEXTS[3].encode()))
    (corpus / "c.json.gz").write_bytes(gzip.compress(b"[]"))  # not an input kind: left out
    (corpus / "notes.md.gz").write_bytes(gzip.compress(b"left out"))
    summary = tokenize_files([corpus], tmp_path / "out", tokenizer_path, progress=False)
    assert summary.files == 2 and summary.documents == 4


@pytest.mark.parametrize("name", ["arr.json", "arr.json.gz", "arr.JSON.zst"])
def test_json_documents_are_refused_compressed_or_not(tmp_path: Path, tokenizer_path: Path, name: str) -> None:
    source = tmp_path / name
    source.write_bytes(b"[]")
    with pytest.raises(TokenizeInputError) as raised:
        tokenize_files([source], tmp_path / "out", tokenizer_path)
    assert str(raised.value) == (
        f"{source}: JSON documents are not supported as input; use JSON Lines (.jsonl), .txt or .parquet"
    )


@pytest.mark.parametrize("suffix", COMPRESS)
def test_a_truncated_file_commits_nothing(tmp_path: Path, tokenizer_path: Path, suffix: str) -> None:
    good = tmp_path / "a.jsonl"
    good.write_bytes(jsonl(TEXTS))
    source = tmp_path / f"b.jsonl.{suffix}"
    source.write_bytes(COMPRESS[suffix](jsonl(TEXTS))[:-20])
    codec = {"gz": "gzip", "zst": "zstd"}.get(suffix, suffix)
    with pytest.raises(TokenizeInputError) as raised:
        tokenize_files(
            [good, source], tmp_path / "out", tokenizer_path, workers=1, progress=False, shard_size=good.stat().st_size
        )
    assert str(raised.value) == f"{source}: the {codec} data ends early (a truncated file?)"
    assert committed_shard_ids(tmp_path / "out") == [0]


def test_damaged_data_names_the_file(tmp_path: Path, tokenizer_path: Path) -> None:
    source = tmp_path / "a.jsonl.gz"
    data = bytearray(gzip.compress(jsonl(TEXTS)))
    data[len(data) // 2 : len(data) // 2 + 40] = b"\xff" * 40
    source.write_bytes(bytes(data))
    with pytest.raises(TokenizeInputError, match=r"a\.jsonl\.gz: damaged gzip data \(.+\)"):
        tokenize_files([source], tmp_path / "out", tokenizer_path, progress=False)
    assert committed_shard_ids(tmp_path / "out") == []


def test_zstd_compressed_parquet_columns_are_read(tmp_path: Path, tokenizer_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    source = tmp_path / "corpus.parquet"
    parquet.write_table(pa.table({"text": TEXTS}), source, compression="zstd")
    assert parquet.ParquetFile(source).metadata.row_group(0).column(0).compression == "ZSTD"
    summary = tokenize_files([source], tmp_path / "out", tokenizer_path, progress=False)
    assert summary.documents == len(TEXTS)


def test_a_compressed_parquet_file_is_refused_up_front(tmp_path: Path, tokenizer_path: Path) -> None:
    source = tmp_path / "corpus.parquet.gz"
    source.write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(TokenizeInputError) as raised:
        tokenize_files([source], tmp_path / "out", tokenizer_path)
    assert str(raised.value) == (
        f"{source}: a gzip-compressed Parquet file cannot be read; Parquet compresses its columns itself "
        "(write it with compression='zstd', for instance)"
    )
    assert not (tmp_path / "out").exists()
