"""The loader over a storage on each object-store service yields exactly the batches of the same storage on disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from guideloom import (
    DocumentJsonFormat,
    DocumentStorage,
    Mixture,
    StatefulDataLoader,
    StateMismatchError,
    TokenStorage,
)
from tests.remote.conftest import ServiceStorage

SEQUENCE = 13


def _fill_tokens(storage: TokenStorage) -> None:
    generator = np.random.default_rng(5)
    with storage.sync_writer() as writer:
        for shard in range(6):
            for _ in range(8):
                writer.append(shard, generator.integers(0, 50_000, int(generator.integers(1, 60)), dtype=np.uint32))


def _fill_documents(storage: DocumentStorage[Any, Any]) -> None:
    with storage.sync_writer() as writer:
        for shard in range(4):
            for i in range(9):
                writer.append(shard, {"shard": shard, "i": i, "ids": list(range(i))})


@pytest.fixture
def token_pair(service: ServiceStorage, tmp_path: Path) -> tuple[TokenStorage, TokenStorage]:
    local = TokenStorage(tmp_path / "local")
    remote = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "cache")
    _fill_tokens(local)
    _fill_tokens(remote)
    return local, remote


def _batches(loader: StatefulDataLoader, count: int | None = None) -> list[Any]:
    taken = []
    for batch in loader:
        taken.append(batch.tolist() if isinstance(batch, torch.Tensor) else batch)
        if count is not None and len(taken) == count:
            break
    return taken


def _run(storage: Any, count: int | None = None, **options: Any) -> list[Any]:
    defaults: dict[str, Any] = {"device": "cpu", "local_batch_size": 4}
    if isinstance(storage, TokenStorage):
        defaults["sequence_length"] = SEQUENCE
    with StatefulDataLoader.from_storage(storage, **{**defaults, **options}) as loader:
        return _batches(loader, count)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"shuffle": True, "seed": 3},
        {"shuffle": True, "num_workers": 2},
        {"shuffle": True, "rank": 1, "world_size": 2},
        {"shuffle": True, "rank": 0, "world_size": 2, "drop_last": True},
    ],
)
def test_token_batches_equal_the_local_run(token_pair: tuple[TokenStorage, TokenStorage], options: Any) -> None:
    local, remote = token_pair
    expected = _run(local, **options)
    assert len(expected) > 5
    assert _run(remote, **options) == expected


def test_document_batches_equal_the_local_run(service: ServiceStorage, tmp_path: Path) -> None:
    local = DocumentStorage(tmp_path / "local", DocumentJsonFormat())
    remote = DocumentStorage(
        service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path / "c"
    )
    _fill_documents(local)
    _fill_documents(remote)
    for options in ({"shuffle": True}, {"shuffle": True, "num_workers": 2}):
        assert _run(remote, **options) == _run(local, **options)


def _resumed(storage: TokenStorage, steps: int, first: dict[str, Any], second: dict[str, Any]) -> list[Any]:
    """Batches of two epochs' worth: ``steps`` from one loader, the rest from a fresh one resumed from its state."""
    make: Callable[..., StatefulDataLoader] = StatefulDataLoader.from_storage
    common = {"device": "cpu", "sequence_length": SEQUENCE, "shuffle": True, "seed": 9}
    with make(storage, **common, **first) as loader:
        head = _batches(loader, steps)
        state = loader.state_dict()
    with make(storage, **common, **second) as loader:
        loader.load_state_dict(state)
        return head + _batches(loader)


def test_resume_equals_the_local_run(token_pair: tuple[TokenStorage, TokenStorage]) -> None:
    local, remote = token_pair
    options = {"local_batch_size": 4}
    assert _resumed(remote, 3, options, options) == _resumed(local, 3, options, options)


def test_elastic_resume_equals_the_local_run(token_pair: tuple[TokenStorage, TokenStorage]) -> None:
    local, remote = token_pair
    first = {"local_batch_size": 4, "rank": 0, "world_size": 2}
    second = {"local_batch_size": 2, "rank": 0, "world_size": 1}
    assert _resumed(remote, 2, first, second) == _resumed(local, 2, first, second)


def test_a_remote_state_resumes_a_local_loader_over_the_same_data(
    token_pair: tuple[TokenStorage, TokenStorage],
) -> None:
    local, remote = token_pair
    with StatefulDataLoader.from_storage(
        remote, device="cpu", local_batch_size=4, sequence_length=SEQUENCE, shuffle=True
    ) as loader:
        _batches(loader, 2)
        state = loader.state_dict()
        rest = _batches(loader)
    with StatefulDataLoader.from_storage(
        local, device="cpu", local_batch_size=4, sequence_length=SEQUENCE, shuffle=True
    ) as loader:
        loader.load_state_dict(state)
        assert _batches(loader) == rest


def _plain(batch: Any) -> Any:
    """A batch (a tensor, or a dict of tensors and ints) as nested lists, to compare whole sequences."""
    if isinstance(batch, dict):
        return {key: _plain(value) for key, value in batch.items()}
    return batch.tolist() if isinstance(batch, torch.Tensor) else batch


@pytest.mark.parametrize("mode", [{"document_boundaries": True}, {"pack_documents": True, "pad_id": 7}])
def test_document_aware_batches_equal_the_local_run_within_a_two_shard_cache(
    service: ServiceStorage, tmp_path: Path, mode: dict[str, Any]
) -> None:
    local = TokenStorage(tmp_path / "local")
    _fill_tokens(local)
    _fill_tokens(TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "w"))
    largest = max(path.stat().st_size for path in (tmp_path / "local" / "shards").iterdir())
    remote = TokenStorage(
        service.url, storage_options=service.options, cache_dir=tmp_path / "cache", cache_limit_bytes=2 * largest
    )
    options = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True, **mode}
    runs = []
    for storage in (local, remote):
        with StatefulDataLoader.from_storage(storage, **options) as loader:
            runs.append([_plain(batch) for batch in loader])
    assert len(runs[0]) > 5 and runs[1] == runs[0]


def test_a_mixture_of_remote_storages_equals_the_local_mixture(service: ServiceStorage, tmp_path: Path) -> None:
    mixtures = []
    for where in ("local", "remote"):
        components = {}
        for name, seed in (("web", 1), ("code", 2)):
            if where == "local":
                storage = TokenStorage(tmp_path / name)
            else:
                url = service.service.url(service.bucket, name)
                storage = TokenStorage(url, storage_options=service.options, cache_dir=tmp_path / "cache")
            with storage.sync_writer() as writer:
                for tokens in np.random.default_rng(seed).integers(0, 1000, (12, 30), dtype=np.uint32):
                    writer.append(0, tokens)
            components[name] = storage
        mixtures.append(Mixture(components, {"web": 0.7, "code": 0.3}, block_size=10))
    local, remote = (_run(mixture, shuffle=True, sequence_length=SEQUENCE) for mixture in mixtures)
    assert len(local) > 5 and remote == local


def test_a_grown_remote_storage_finishes_the_epoch_on_the_checkpoints_shards(
    service: ServiceStorage, tmp_path: Path
) -> None:
    def fill(storage: TokenStorage, shards: range) -> None:
        with storage.sync_writer() as writer:
            for shard in shards:
                writer.append(shard, 1000 * shard + np.arange(40, dtype=np.uint32))

    def loader_of(storage: TokenStorage) -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=3, sequence_length=4, shuffle=True, seed=3
        )

    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "cache")
    fill(storage, range(4))
    with loader_of(storage) as loader:
        _batches(loader, 3)
        state = loader.state_dict()
        rest_of_epoch = _batches(loader)
    fill(storage, range(4, 7))
    with loader_of(storage) as loader:
        loader.load_state_dict(state)
        assert _batches(loader) == rest_of_epoch
        next_epoch = _batches(loader)
    with loader_of(storage) as fresh:
        _batches(fresh)
        assert _batches(fresh) == next_epoch  # a fresh loader's second epoch over the grown storage
    assert {window[0] // 1000 for batch in next_epoch for window in batch} == set(range(7))


def test_a_checkpoints_shard_deleted_from_the_store_is_named_at_resume(
    token_pair: tuple[TokenStorage, TokenStorage], service: ServiceStorage
) -> None:
    _, remote = token_pair
    with StatefulDataLoader.from_storage(
        remote, device="cpu", local_batch_size=4, sequence_length=SEQUENCE, shuffle=True
    ) as loader:
        _batches(loader, 2)
        state = loader.state_dict()
    service.delete_object("shards/000000000002.shard")
    with StatefulDataLoader.from_storage(
        remote, device="cpu", local_batch_size=4, sequence_length=SEQUENCE, shuffle=True
    ) as loader:
        with pytest.raises(StateMismatchError, match=r"shard 2 of the storage at \w+://.*is missing"):
            loader.load_state_dict(state)
