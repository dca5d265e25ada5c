"""Mistakes in building a loader are refused at construction, each naming its argument and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from guideloom import StatefulDataLoader
from tests.helpers.loaders import window_loader
from tests.helpers.storages import make_counted_tokens, make_document_storage


def test_sequence_length_beyond_the_whole_storage_names_both(tmp_path: Path) -> None:
    storage = make_counted_tokens(tmp_path, shards=3, tokens=7)
    with pytest.raises(ValueError) as caught:
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=100)
    assert str(caught.value) == (
        f"the storage at {tmp_path} has no samples to load: sequence_length=100 is longer than its 21 tokens"
    )


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cuda:99", "device is 'cuda:99', but CUDA is not available on this machine"),
        ("no-such-device", "device must be a torch.device or a device string"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_at_construction(tmp_path: Path, device: str, message: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        message = f"device is 'cuda:99', but this machine has {torch.cuda.device_count()} CUDA device(s)"
    storage = make_document_storage(tmp_path, count=12)
    with pytest.raises(ValueError) as caught:
        StatefulDataLoader.from_storage(storage, device=device, local_batch_size=2)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"sequence_length": 8.0}, "sequence_length must be an int, got float"),
        ({"local_batch_size": 2.0}, "local_batch_size must be an int, got float"),
        ({"window_dtype": "int32"}, "window_dtype must be torch.int64 or torch.int32, got str"),
        ({"timeout": "1"}, "timeout must be a number, got str"),
    ],
)
def test_an_argument_of_the_wrong_type_is_a_type_error_naming_it(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 2, "sequence_length": 4, **arguments}
    with pytest.raises(TypeError) as caught:
        StatefulDataLoader.from_storage(make_counted_tokens(tmp_path, shards=3, tokens=7), **options)
    assert str(caught.value) == message


def test_a_path_given_as_storage_is_named_before_window_modes(tmp_path: Path) -> None:
    make_counted_tokens(tmp_path / "a", shards=1)
    with pytest.raises(TypeError) as error:
        window_loader(str(tmp_path / "a"), document_boundaries=True)
    assert str(error.value) == "storage must be a DocumentStorage, TokenStorage or Mixture, got str"


@pytest.mark.parametrize(
    ("rank", "world_size", "said"), [("3", "2", "RANK=3 and WORLD_SIZE=2"), (None, "0", "WORLD_SIZE=0")]
)
def test_ranks_from_the_environment_are_named_as_its_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: str | None, world_size: str, said: str
) -> None:
    storage = make_counted_tokens(tmp_path / "a", shards=1)
    monkeypatch.delenv("RANK", raising=False)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", world_size)
    with pytest.raises(ValueError) as error:
        window_loader(storage)
    assert str(error.value) == (
        f"the environment says {said}: WORLD_SIZE must be 1 or more and RANK from 0 to WORLD_SIZE - 1"
    )


def test_drop_last_that_would_drop_every_batch_is_refused(tmp_path: Path) -> None:
    storage = make_counted_tokens(tmp_path / "a", shards=1)  # 40 tokens: 5 windows of 8
    with pytest.raises(ValueError) as error:
        window_loader(storage, local_batch_size=3, rank=0, world_size=2, drop_last=True)
    assert str(error.value) == (
        f"drop_last=True would drop every batch: token windows of shards 0 of the storage at {tmp_path / 'a'} gives "
        "5 samples per epoch, fewer than one global batch of 6 (local_batch_size=3 × world_size=2)"
    )


def test_drop_last_with_one_full_global_batch_is_accepted(tmp_path: Path) -> None:
    with window_loader(make_counted_tokens(tmp_path / "a", shards=1), local_batch_size=5, drop_last=True) as loader:
        assert len(loader) == 1


def test_building_the_loader_like_torch_points_to_from_storage(tmp_path: Path) -> None:
    storage = make_counted_tokens(tmp_path / "a", shards=1)
    with pytest.raises(TypeError) as error:
        StatefulDataLoader(storage, batch_size=2)  # type: ignore[call-arg]
    assert str(error.value) == (
        "a loader over a TokenStorage is built with StatefulDataLoader.from_storage(storage, device=..., "
        "local_batch_size=..., ...), not StatefulDataLoader(storage, ...)"
    )


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64, 2**70, 5 + 2**128])
def test_a_seed_outside_64_bits_is_refused(tmp_path: Path, seed: int) -> None:
    # The orders are keyed by 64 bits: 2**64 read seed 0's order, 5 + 2**128 seed 5's and -1 seed 2**64 - 1's.
    storage = make_document_storage(tmp_path, count=12)
    with pytest.raises(ValueError) as caught:
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, shuffle=True, seed=seed)
    assert str(caught.value) == f"seed must be an int in [0, 2**64), got {seed}"


def test_the_largest_seed_reads_its_own_order(tmp_path: Path) -> None:
    storage = make_document_storage(tmp_path, count=12)
    orders = []
    for seed in (0, 2**64 - 1):
        with StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=12, shuffle=True, seed=seed
        ) as loader:
            orders.append(next(iter(loader)))
    assert orders[0] != orders[1] and sorted(orders[0], key=repr) == sorted(orders[1], key=repr)
