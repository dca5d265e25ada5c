"""StorageDatasink into an object store: a Ray Data write to the local S3 API server, read back exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from guideloom import TokenStorage
from guideloom.ray import StorageDatasink
from guideloom.tokenize import load_tokenizer, tokenize_files, train_tokenizer
from tests.remote.conftest import ServiceStorage

ROWS = 2_000
BLOCKS = 4


def token_rows(batch: pa.Table) -> pa.Table:
    ids = batch["id"].to_numpy()
    lengths = ids % 5
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return pa.table({"tokens": pa.LargeListArray.from_arrays(offsets, np.repeat(ids, lengths))})


def _options(service: ServiceStorage) -> dict[str, Any]:
    """The service's options, with S3's credentials: Ray's workers get them in the storage."""
    return {**service.options, "key": "testing", "secret": "testing"} if service.name == "s3" else service.options


def test_write_into_a_service_and_run_it_again(ray_cluster: str, service: ServiceStorage, tmp_path: Path) -> None:
    options = _options(service)

    def write() -> StorageDatasink:
        storage = TokenStorage(service.url, dtype="uint16", storage_options=options, cache_dir=tmp_path / "cache")
        sink = StorageDatasink(storage, column="tokens", write_id="s3-corpus")
        dataset = ray.data.range(ROWS, override_num_blocks=BLOCKS)
        dataset.map_batches(token_rows, batch_format="pyarrow", batch_size=None).write_datasink(sink)
        return sink

    first, again = write(), write()
    assert first.shards == again.shards == list(range(BLOCKS))
    assert first.records == again.records == ROWS
    assert len(service.object_bytes("shards.index")) == 40 * (1 + BLOCKS)  # written when the write completed
    storage = TokenStorage(service.url, storage_options=options, cache_dir=tmp_path / "reader")
    with storage.sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == [[i] * (i % 5) for i in range(ROWS)]


def test_tokenize_with_ray_into_a_service(ray_cluster: str, service: ServiceStorage, tmp_path: Path) -> None:
    options = _options(service)
    texts = [f"document {i} of part {part}" for part in range(3) for i in range(20)]
    inputs = []
    for part in range(3):
        inputs.append(tmp_path / f"part-{part}.jsonl")
        inputs[-1].write_text("".join(json.dumps({"text": text}) + "\n" for text in texts[part * 20 : part * 20 + 20]))
    tokenizer = train_tokenizer(texts, 300, tmp_path / "tokenizer.json")
    summary = tokenize_files(inputs, service.url, tokenizer, ray=True, storage_options=options, progress=False)
    assert (summary.shards, summary.documents, summary.ray_tasks) == ((0,), 60, 1)  # small files: one group, one shard
    decoder = load_tokenizer(tokenizer)
    storage = TokenStorage(service.url, storage_options=options, cache_dir=tmp_path / "reader")
    with storage.sync_reader() as reader:
        assert [decoder.decode(reader.read(i)[:-1].tolist()) for i in range(len(reader))] == texts
