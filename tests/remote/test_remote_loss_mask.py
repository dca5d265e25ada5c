"""Masked token storages on an S3 API server: written, listed, cached, verified and loaded as local ones."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import numpy as np
import torch

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._cli import main
from tests.remote.s3_support import S3Server


def write_masked(url: str, server: S3Server | None, cache: Path | None = None) -> TokenStorage:
    """A masked storage at ``url`` (on ``server``, or local when it is None)."""
    options = None if server is None else server.options
    storage = TokenStorage(url, "uint16", loss_mask=True, storage_options=options, cache_dir=cache)
    with storage.sync_writer() as writer:
        for shard in range(3):
            for length in (5, 17, 0, 40):
                tokens = np.arange(length) + 1000 * shard + 1
                writer.append(shard, tokens, loss_mask=tokens % 3 == 0)
    return storage


def test_a_masked_storage_reads_and_loads_as_its_local_copy(s3_url: str, s3_server: S3Server, tmp_path: Path) -> None:
    write_masked(s3_url, s3_server, tmp_path / "cache")
    local = write_masked(str(tmp_path / "local"), None)
    remote = TokenStorage(s3_url, storage_options=s3_server.options, cache_dir=tmp_path / "fresh")
    assert remote.loss_mask is True  # as recorded in the header
    with remote.sync_reader() as reader, local.sync_reader() as local_reader:
        assert [reader.loss_mask(i).tolist() for i in range(len(reader))] == [
            local_reader.loss_mask(i).tolist() for i in range(len(local_reader))
        ]
    batches = []
    for storage in (remote, local):
        with StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=4, sequence_length=9, pack_documents=True, shuffle=True
        ) as loader:
            batches.append([{key: value.tolist() if isinstance(value, torch.Tensor) else value
                             for key, value in batch.items()} for batch in loader])  # fmt: skip
    assert batches[0] == batches[1]


def test_verify_names_a_remote_shard_whose_mask_bit_flipped(
    s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path
) -> None:
    storage = write_masked(s3_url, s3_server, tmp_path / "cache")
    assert storage.verify() == []
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    key = "corpus/shards/000000000001.shard"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    mask_start = 64 * 2 + 8 * 5  # 62 uint16 tokens padded to 128 bytes, then 5 offsets
    data[mask_start] ^= 1
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    problems = storage.verify()
    assert len(problems) == 1 and "shard 1" in problems[0]


def test_inspect_says_a_remote_storage_is_masked_without_downloading(
    s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path, capsys: object
) -> None:
    write_masked(s3_url, s3_server, tmp_path / "cache")
    before = len(s3_server.gets(bucket, "/shards/"))
    options = json.dumps(s3_server.options)
    assert main(["inspect", s3_url, "--storage-options", options]) == 0
    assert "loss mask:  yes" in capsys.readouterr().out  # type: ignore[attr-defined]
    assert len(s3_server.gets(bucket, "/shards/")) == before
