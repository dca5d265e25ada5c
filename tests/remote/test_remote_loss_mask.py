"""Masked token storages on each object-store service: written, listed, cached, verified and loaded as local ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._cli import main
from tests.remote.conftest import ServiceStorage


def write_masked(url: str, service: ServiceStorage | None, cache: Path | None = None) -> TokenStorage:
    """A masked storage at ``url`` (on ``server``, or local when it is None)."""
    options = None if service is None else service.options
    storage = TokenStorage(url, "uint16", loss_mask=True, storage_options=options, cache_dir=cache)
    with storage.sync_writer() as writer:
        for shard in range(3):
            for length in (5, 17, 0, 40):
                tokens = np.arange(length) + 1000 * shard + 1
                writer.append(shard, tokens, loss_mask=tokens % 3 == 0)
    return storage


def test_a_masked_storage_reads_and_loads_as_its_local_copy(service: ServiceStorage, tmp_path: Path) -> None:
    write_masked(service.url, service, tmp_path / "cache")
    local = write_masked(str(tmp_path / "local"), None)
    remote = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "fresh")
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


def test_verify_names_a_remote_shard_whose_mask_bit_flipped(service: ServiceStorage, tmp_path: Path) -> None:
    storage = write_masked(service.url, service, tmp_path / "cache")
    assert storage.verify() == []
    key = "shards/000000000001.shard"
    data = bytearray(service.object_bytes(key))
    mask_start = 64 * 2 + 8 * 5  # 62 uint16 tokens padded to 128 bytes, then 5 offsets
    data[mask_start] ^= 1
    service.put_object(key, bytes(data))
    problems = storage.verify()
    assert len(problems) == 1 and "shard 1" in problems[0]


def test_inspect_says_a_remote_storage_is_masked_without_downloading(
    service: ServiceStorage, tmp_path: Path, capsys: object
) -> None:
    write_masked(service.url, service, tmp_path / "cache")
    before = len(service.reads("/shards/"))
    options = json.dumps(service.options)
    assert main(["inspect", service.url, "--storage-options", options]) == 0
    assert "loss mask:  yes" in capsys.readouterr().out  # type: ignore[attr-defined]
    assert len(service.reads("/shards/")) == before
