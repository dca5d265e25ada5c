"""A property of the loader by budget: stopping at any step and resuming with any ranks and budget reads each
record of the epoch exactly once (then, at most, the last step's padding)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guideloom import DocumentStorage, StatefulDataLoader
from tests.documents.records import ids, make_sized_records, record_lengths

LENGTHS = record_lengths(41, seed=9)


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> DocumentStorage[Any, Any]:
    return make_sized_records(tmp_path_factory.mktemp("records") / "records", LENGTHS)


def epoch_by_steps(
    storage: Any, world_size: int, state: Any = None, steps: int = -1, **options: Any
) -> tuple[list[int], Any]:
    """The records all ranks read, step after step (each step: rank 0's batch, rank 1's, ...), and the state."""
    per_rank = []
    for rank in range(world_size):
        with StatefulDataLoader.from_storage(
            storage, ids, device="cpu", shuffle=True, seed=4, rank=rank, world_size=world_size, **options
        ) as loader:
            if state is not None:
                loader.load_state_dict(state)
            batches = []
            for batch in loader:
                batches.append(batch)
                if len(batches) == steps:
                    break
            per_rank.append(batches)
            after = loader.state_dict()
    assert len({len(batches) for batches in per_rank}) == 1
    return [i for step in zip(*per_rank, strict=True) for batch in step for i in batch], after


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    budget=st.integers(10, 200),
    world_size=st.integers(1, 3),
    steps=st.integers(0, 8),
    budget_after=st.one_of(st.none(), st.integers(10, 200)),
    world_after=st.integers(1, 3),
)
def test_any_stop_and_any_resume_read_each_record_once(
    storage: DocumentStorage[Any, Any],
    budget: int,
    world_size: int,
    steps: int,
    budget_after: int | None,
    world_after: int,
) -> None:
    before, state = epoch_by_steps(storage, world_size, steps=steps, batch_tokens=budget)
    resumed = {"batch_tokens": budget_after} if budget_after else {"local_batch_size": 4}  # or fixed batches
    after, _ = (
        epoch_by_steps(storage, world_after, state, **resumed) if state["position"] < len(LENGTHS) else ([], None)
    )
    read = before[: len(LENGTHS)] + after
    assert sorted(read[: len(LENGTHS)]) == list(range(len(LENGTHS)))
