"""State version 3 names what it reads; a digest of its next batch refuses a resume that would read other data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import guideloom._sampling.epoch_order as epoch_order
from guideloom import Mixture, StatefulDataLoader, StateMismatchError, TokenStorage
from tests.helpers.batches import take
from tests.helpers.provenance import open_loader, write_tokens


def saved(loader: StatefulDataLoader, batches: int = 2) -> dict[str, Any]:
    take(loader, batches)
    state: dict[str, Any] = json.loads(json.dumps(loader.state_dict()))
    return state


def test_a_state_names_its_storage_and_the_settings_of_its_order(tmp_path: Path) -> None:
    with open_loader("packed", tmp_path, drop_last=True) as loader:
        state = saved(loader)
    assert state["guideloom_loader_state"] == 3
    assert {key: state[key] for key in ("shuffle", "seed", "local_batch_size", "world_size", "drop_last")} == {
        "shuffle": True,
        "seed": 5,
        "local_batch_size": 3,
        "world_size": 1,
        "drop_last": True,
    }
    source = state["source"]
    assert (source["kind"], source["path"], source["sequence_length"], source["pad_id"]) == (
        "packed documents",
        str(tmp_path / "single"),
        16,
        0,
    )
    assert len(state["next_batch"]) == 16


def test_a_mixture_state_names_its_components_storages_and_exact_schedule(tmp_path: Path) -> None:
    with open_loader("mixture-windows", tmp_path) as loader:
        source = saved(loader)["source"]
    assert [entry[0] for entry in source["components"]] == ["web", "code"]
    assert source["storages"] == [str(tmp_path / "web"), str(tmp_path / "code")]
    assert source["schedule"] == [[0, [4, 2]]]  # weights 2:1 in blocks of 6


def test_every_rank_records_the_same_next_batch(tmp_path: Path) -> None:
    states = []
    for rank in range(3):
        with open_loader("windows", tmp_path, rank=rank, world_size=3, local_batch_size=2) as loader:
            states.append(saved(loader))
    assert states[0] == states[1] == states[2]


def test_a_state_at_an_epoch_s_end_records_the_next_epoch_s_first_batch(tmp_path: Path) -> None:
    with open_loader("windows", tmp_path) as loader:
        state = saved(loader, len(loader))
        loader.skip(0)
        after = saved(loader, 0)
    assert state == after and state["position"] == state["sample_count"]
    with open_loader("windows", tmp_path) as loader:
        loader.load_state_dict(state)


def test_a_resume_whose_order_differs_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_loader("windows", tmp_path) as loader:
        state = saved(loader)
    keys = epoch_order.round_keys
    monkeypatch.setattr(epoch_order, "round_keys", lambda seed, epoch: keys(seed + 1, epoch))  # another version
    with open_loader("windows", tmp_path) as loader:
        with pytest.raises(StateMismatchError, match="the state's next batch is not the one this loader would read"):
            loader.load_state_dict(state)
        assert loader.state_dict()["position"] == 0  # a refused state changes nothing


def test_an_edited_digest_is_refused(tmp_path: Path) -> None:
    with open_loader("mixture-packed", tmp_path) as loader:
        state = saved(loader)
    state["next_batch"] = "0" * 16
    with open_loader("mixture-packed", tmp_path) as loader:
        with pytest.raises(StateMismatchError, match="their digests differ"):
            loader.load_state_dict(state)


def test_a_moved_storage_still_resumes_checked(tmp_path: Path) -> None:
    write_tokens(tmp_path / "first")
    with StatefulDataLoader.from_storage(
        TokenStorage(tmp_path / "first"), device="cpu", local_batch_size=2, sequence_length=8, shuffle=True
    ) as loader:
        state = saved(loader)
        expected = take(loader, 3, lambda batch: batch.tolist())
    shutil.move(tmp_path / "first", tmp_path / "moved")
    with StatefulDataLoader.from_storage(
        TokenStorage(tmp_path / "moved"), device="cpu", local_batch_size=2, sequence_length=8, shuffle=True
    ) as loader:
        loader.load_state_dict(state)
        assert take(loader, 3, lambda batch: batch.tolist()) == expected


def as_version_2(state: dict[str, Any]) -> dict[str, Any]:
    """The state as guideloom 0.2 wrote it: no next batch, a mixture's schedule as digests and no paths."""
    import zlib

    old = {key: value for key, value in state.items() if key != "next_batch"}
    source = dict(old["source"])
    if source["kind"] == "mixture":
        del source["storages"]
        source["schedule"] = [
            [start, f"{zlib.crc32(repr(counts).encode()):08x}"] for start, counts in source["schedule"]
        ]
    return {**old, "guideloom_loader_state": 2, "source": source}


@pytest.mark.parametrize("mode", ["windows", "mixture-documents"])
def test_a_version_2_state_resumes_exactly(tmp_path: Path, mode: str) -> None:
    with open_loader(mode, tmp_path) as loader:
        state = saved(loader)
        expected = take(loader, 4, repr)
    with open_loader(mode, tmp_path) as loader:
        loader.load_state_dict(as_version_2(state))
        assert take(loader, 4, repr) == expected


def test_a_version_2_mixture_state_may_change_its_schedule_later(tmp_path: Path) -> None:
    with open_loader("mixture-windows", tmp_path, local_batch_size=6) as loader:
        state = as_version_2(saved(loader, 1))
    later = Mixture(
        {name: TokenStorage(tmp_path / name) for name in ("web", "code")},
        [(0, {"web": 2, "code": 1}), (12, {"web": 1, "code": 1})],
        block_size=6,
        samples_per_epoch=40,
    )
    with StatefulDataLoader.from_storage(
        later, device="cpu", local_batch_size=6, sequence_length=16, shuffle=True, seed=5
    ) as loader:
        loader.load_state_dict(state)


def test_one_sample_of_an_order_is_the_same_in_plain_integers() -> None:
    for count in (1, 5, 64, 65, 1_000, 2**40 + 7):
        order = epoch_order.EpochOrder(count, shuffle=True, seed=-3, epoch=2)
        positions = [0, 1, count - 1, count, 3 * count + 2, 12_345]
        assert [order.sample_at_one(position) for position in positions] == order.sample_at(positions).tolist()


def test_a_few_positions_of_component_passes_are_the_same_in_plain_integers() -> None:
    from guideloom._sampling.passes import permute_many

    rng = np.random.default_rng(1)
    for _ in range(100):
        counts = [int(rng.integers(1, 10 ** int(rng.integers(1, 7)))) for _ in range(3)]
        orders = rng.integers(0, 3, 5)
        positions = np.array([int(rng.integers(0, counts[order])) for order in orders], np.int64)
        arguments = (counts, [11, -5, 2**40], [0, 3, 7])
        vectorised = permute_many(np.tile(positions, 4), np.tile(orders, 4), *arguments)[:5]  # 20 > a handful
        assert permute_many(positions, orders, *arguments).tolist() == vectorised.tolist()
