"""The token budget planner against a record-by-record reference of its rule."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom._sampling.token_budget import TokenBudgetPlan


def reference_steps(
    lengths: list[int], budget: int, world_size: int, drop_last: bool, start: int
) -> list[list[list[int]]]:
    """The rule, one record at a time: each step is one list of positions per rank."""
    count, position, steps = len(lengths), start, []
    while position < count:
        step = []
        for _ in range(world_size):
            limit = (position // count + 1) * count
            batch, total = [position], lengths[position % count]
            position += 1
            while position < limit and total + lengths[position % count] <= budget:
                total += lengths[position % count]
                batch.append(position)
                position += 1
            step.append(batch)
        if drop_last and position >= count:
            break
        steps.append(step)
        position = min(position, count)
    return steps


def planned_steps(
    lengths: list[int], budget: int, world_size: int, drop_last: bool, start: int
) -> list[list[list[int]]]:
    array = np.array(lengths, np.int64)
    asked: list[int] = []

    def lengths_at(positions: np.ndarray) -> np.ndarray:
        asked.extend(positions.tolist())
        return array[positions]

    plan = TokenBudgetPlan(len(lengths), budget, world_size, drop_last, lengths_at, start)
    steps = [[step.rank_positions(rank).tolist() for rank in range(world_size)] for step in plan.steps()]
    assert all(0 <= p < len(lengths) for p in asked)
    return steps


budget_cases = st.tuples(
    st.lists(st.integers(0, 40), min_size=1, max_size=300),
    st.integers(1, 60),
    st.integers(1, 5),
    st.booleans(),
    st.integers(0, 300),
)


@settings(max_examples=300, deadline=None)
@given(budget_cases)
def test_the_plan_follows_the_rule_record_by_record(case: tuple[list[int], int, int, bool, int]) -> None:
    lengths, budget, world_size, drop_last, start = case
    start = min(start, len(lengths))
    assert planned_steps(lengths, budget, world_size, drop_last, start) == reference_steps(
        lengths, budget, world_size, drop_last, start
    )


@settings(max_examples=200, deadline=None)
@given(budget_cases)
def test_every_record_once_and_every_batch_within_budget(case: tuple[list[int], int, int, bool, int]) -> None:
    lengths, budget, world_size, _, _ = case
    steps = planned_steps(lengths, budget, world_size, False, 0)
    real = [p for step in steps for batch in step for p in batch if p < len(lengths)]
    assert real == list(range(len(lengths)))  # each record once, in the order, ranks after one another
    for step in steps:
        assert len(step) == world_size  # one batch per rank: every rank the same number
        for batch in step:
            assert batch and (len(batch) == 1 or sum(lengths[p % len(lengths)] for p in batch) <= budget)


@settings(max_examples=200, deadline=None)
@given(budget_cases, st.integers(1, 60), st.integers(1, 5), st.data())
def test_resuming_at_any_step_with_other_settings_loses_and_repeats_nothing(
    case: tuple[list[int], int, int, bool, int], budget_after: int, world_after: int, data: st.DataObject
) -> None:
    lengths, budget, world_size, _, _ = case
    before = planned_steps(lengths, budget, world_size, False, 0)
    cut = data.draw(st.integers(0, len(before)))
    read = [p for step in before[:cut] for batch in step for p in batch if p < len(lengths)]
    after = planned_steps(lengths, budget_after, world_after, False, len(read))
    read += [p for step in after for batch in step for p in batch if p < len(lengths)]
    assert read == list(range(len(lengths)))


def test_a_record_longer_than_the_budget_is_a_batch_alone_and_the_end_pads_from_the_start() -> None:
    # positions 5 and 6 are padding: records 0 and 1 again
    assert planned_steps([3, 9, 2, 2, 1], 4, 3, False, 0) == [[[0], [1], [2, 3]], [[4], [5], [6]]]
    assert planned_steps([3, 9, 2, 2, 1], 4, 3, True, 0) == [[[0], [1], [2, 3]]]
