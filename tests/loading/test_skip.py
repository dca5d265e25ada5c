"""loader.skip: past whole batches without reading them; the state and every later batch as if they were read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from guideloom import StatefulDataLoader, TokenStorage
from tests.helpers.batches import comparable, take
from tests.helpers.provenance import grown_after_one_batch, open_loader


def assert_skip_is_reading(make: Any, count: int, after: int = 4) -> None:
    with make() as reading:
        take(reading, count)
        state = reading.state_dict()
        expected = take(reading, after, comparable)
    with make() as skipping:
        skipping.skip(count)
        assert skipping.state_dict() == state
        assert take(skipping, after, comparable) == expected


@pytest.mark.parametrize("mode", ["windows", "packed", "mixture-documents", "documents"])
@pytest.mark.parametrize("whole_epochs", [0, 1, 2])
@pytest.mark.parametrize("extra", [0, 1, -1])
def test_skip_equals_reading(tmp_path: Path, mode: str, whole_epochs: int, extra: int) -> None:
    with open_loader(mode, tmp_path) as loader:
        count = max(0, whole_epochs * len(loader) + extra)
    assert_skip_is_reading(lambda: open_loader(mode, tmp_path), count)


def test_skipping_exactly_to_an_epoch_s_end_leaves_a_completed_epoch(tmp_path: Path) -> None:
    with open_loader("windows", tmp_path) as loader:
        loader.skip(len(loader))
        state = loader.state_dict()
        assert (state["epoch"], state["position"]) == (0, state["sample_count"])
        loader.skip(0)
        assert loader.state_dict() == state


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_skips_alike(tmp_path: Path, drop_last: bool) -> None:
    states = []
    for rank in range(3):
        with open_loader(
            "packed", tmp_path, rank=rank, world_size=3, local_batch_size=2, drop_last=drop_last
        ) as loader:
            count = len(loader) + 2
            loader.skip(count)
            states.append(loader.state_dict())
        assert_skip_is_reading(
            lambda rank=rank: open_loader(
                "packed", tmp_path, rank=rank, world_size=3, local_batch_size=2, drop_last=drop_last
            ),
            count,
        )
    assert states[0] == states[1] == states[2]


def test_skip_after_an_elastic_resume(tmp_path: Path) -> None:
    with open_loader("windows", tmp_path, rank=0, world_size=2, local_batch_size=3) as loader:
        take(loader, 1)
        state = loader.state_dict()

    def resumed() -> StatefulDataLoader:
        loader = open_loader("windows", tmp_path, rank=1, world_size=3, local_batch_size=2)
        loader.load_state_dict(state)
        return loader

    with resumed() as loader:
        count = len(loader) + 1
    assert_skip_is_reading(resumed, count)


def test_skip_reaches_the_grown_storage_s_next_epoch(tmp_path: Path) -> None:
    open_tokens, state, rest = grown_after_one_batch(tmp_path / "tokens")

    def resumed() -> StatefulDataLoader:
        loader = open_tokens()
        loader.load_state_dict(state)
        return loader

    assert_skip_is_reading(resumed, rest + 2, after=30)


def test_skip_supersedes_an_open_iterator(tmp_path: Path) -> None:
    with open_loader("windows", tmp_path) as loader:
        iterator = iter(loader)
        next(iterator)
        loader.skip(1)
        with pytest.raises(RuntimeError, match="superseded"):
            next(iterator)


@pytest.mark.parametrize(
    ("count", "error", "message"),
    [(-1, ValueError, "batches must be >= 0, got -1"), ("2", TypeError, "batches must be an int, got str")],
)
def test_skip_arguments_are_checked(tmp_path: Path, count: Any, error: type, message: str) -> None:
    with open_loader("windows", tmp_path) as loader:
        with pytest.raises(error) as caught:
            loader.skip(count)
    assert str(caught.value) == message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    documents=st.lists(st.integers(0, 30), min_size=1, max_size=12),
    local_batch_size=st.integers(1, 4),
    world_size=st.integers(1, 3),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    data=st.data(),
)
def test_skip_is_reading_for_any_plan(
    tmp_path_factory: pytest.TempPathFactory,
    documents: list[int],
    local_batch_size: int,
    world_size: int,
    drop_last: bool,
    shuffle: bool,
    data: st.DataObject,
) -> None:
    storage = TokenStorage(tmp_path_factory.mktemp("tokens"))
    with storage.sync_writer() as writer:
        for record, length in enumerate(documents):
            writer.append(record % 2, list(range(length)))
    windows = sum(documents) // 3
    assume(windows > 0 and not (drop_last and windows < local_batch_size * world_size))
    rank = data.draw(st.integers(0, world_size - 1))

    def make() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage,
            device="cpu",
            local_batch_size=local_batch_size,
            sequence_length=3,
            shuffle=shuffle,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
        )

    with make() as loader:
        length = len(loader)
    count = data.draw(st.integers(0, 3 * length + 1))
    assert_skip_is_reading(make, count, after=length + 1)
    with make() as loader:  # a state after skipping resumes as one after reading
        loader.skip(count)
        state = json.loads(json.dumps(loader.state_dict()))
    with make() as loader:
        loader.load_state_dict(state)
