"""The windowed budget planner, checked position by position against what every step must hold."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom._sampling.token_budget import TokenBudgetPlan
from guideloom._sampling.windowed_budget import WindowedBudgetPlan


def plan(
    lengths: list[int], streams: int, world_size: int, budget: int, start: int = 0, drop_last: bool = False
) -> WindowedBudgetPlan:
    table = np.asarray(lengths, np.int64)
    return WindowedBudgetPlan(
        TokenBudgetPlan(len(lengths), budget, world_size, drop_last, lambda at: table[at], start), streams
    )


def check_steps(lengths: list[int], streams: int, world_size: int, budget: int, start: int) -> list[list[list[int]]]:
    """The steps' positions per rank, each step checked: budgets, no empty batch, streams advanced as its end says."""
    count, position = len(lengths), start
    steps: list[list[list[int]]] = []
    for step in plan(lengths, streams, world_size, budget, start).steps():
        batches = [step.rank_positions(rank).tolist() for rank in range(world_size)]
        assert all(batches), f"an empty batch in {batches}"
        for batch in batches:
            assert len(batch) == 1 or sum(lengths[p % count] for p in batch) <= budget
        assert step.end == count or all(p < count for batch in batches for p in batch), "padding before the end"
        read = sorted(p for batch in batches for p in batch if p < count)
        assert read == list(range(position, step.end)), "a step reads exactly the positions up to its end"
        if world_size % streams == 0:  # each stream's ranks read that stream alone
            per_stream = world_size // streams
            for rank, batch in enumerate(batches):
                assert {p % streams for p in batch if p < count} <= {rank // per_stream}
        steps.append(batches)
        position = step.end
    assert position == count
    return steps


lengths_strategy = st.lists(st.integers(1, 40), min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(lengths_strategy, st.integers(1, 4), st.integers(1, 6), st.integers(1, 80), st.data())
def test_every_position_once_within_budgets_from_any_start(
    lengths: list[int], streams: int, world_size: int, budget: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, len(lengths) - 1))
    check_steps(lengths, streams, world_size, budget, start)


@settings(max_examples=100, deadline=None)
@given(lengths_strategy, st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.integers(1, 80), st.data())
def test_resuming_at_a_step_end_continues_bit_for_bit_or_elastically_exactly_once(
    lengths: list[int], streams: int, ranks_per_stream: int, other_world: int, budget: int, data: st.DataObject
) -> None:
    world_size = streams * ranks_per_stream
    steps = list(plan(lengths, streams, world_size, budget).steps())
    cut = data.draw(st.integers(0, len(steps) - 1))
    start = steps[cut - 1].end if cut else 0
    rest = list(plan(lengths, streams, world_size, budget, start).steps())

    def laid_out(some: list[Any]) -> list[Any]:
        return [([s.rank_positions(rank).tolist() for rank in range(world_size)], s.end) for s in some]

    assert laid_out(rest) == laid_out(steps[cut:])
    check_steps(lengths, streams, other_world, data.draw(st.integers(1, 80)), start)


def test_padding_at_the_epoch_end_is_one_sample_of_the_stream_start() -> None:
    steps = list(plan([5] * 5, 2, 4, 100).steps())  # 3 samples in stream 0, 2 in stream 1, 2 ranks each
    last = steps[-1]
    assert [last.rank_positions(rank).tolist() for rank in range(4)] == [[0, 2], [4], [1], [3]]
    steps = list(plan([5] * 3, 2, 4, 100).steps())  # stream 1 has one sample for its two ranks
    assert [steps[-1].rank_positions(rank).tolist() for rank in range(4)] == [[0], [2], [1], [4]]


def test_drop_last_drops_the_step_that_reaches_the_end() -> None:
    lengths = [4] * 20
    kept = list(plan(lengths, 2, 2, 8, drop_last=True).steps())
    every = list(plan(lengths, 2, 2, 8).steps())
    assert [s.end for s in kept] == [s.end for s in every if s.end < 20]
