"""A windowed mixture's draws: every machine reads its own share of each pass of each component, exactly once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom._mixture.machine_draws import MachineDraws
from guideloom._mixture.mixture_order import MixtureOrder
from guideloom._mixture.schedule import parse_schedule
from guideloom._sampling.windowed_order import taken_from_stream

shard_counts = st.lists(st.integers(0, 7), min_size=1, max_size=6).filter(lambda counts: sum(counts) >= 4)


def machine_sequences(draws: MachineDraws, epochs: int, samples: int) -> list[list[tuple[int, int]]]:
    """Each machine's (component, sample) in the order it reads them: its slots in turn, epoch after epoch."""
    sequences: list[list[tuple[int, int]]] = [[] for _ in range(draws.machines)]
    slots = np.arange(samples, dtype=np.int64)
    for epoch in range(epochs):
        components, found = draws.locate(slots, epoch)
        for slot, component, sample in zip(slots.tolist(), components.tolist(), found.tolist(), strict=True):
            sequences[slot % draws.machines].append((component, sample))
    return sequences


@settings(max_examples=40, deadline=None)
@given(
    counts=st.tuples(shard_counts, shard_counts),
    weights=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    machines=st.integers(1, 4),
    window=st.integers(1, 3),
    block_size=st.integers(4, 8),
    seed=st.integers(-(2**63), 2**63 - 1),
)
def test_each_pass_of_a_component_is_read_once_over_the_machines(
    counts: tuple[list[int], list[int]],
    weights: tuple[int, int],
    machines: int,
    window: int,
    block_size: int,
    seed: int,
) -> None:
    sizes = [sum(component) for component in counts]
    schedule = parse_schedule(("a", "b"), {"a": weights[0], "b": weights[1]}, None, block_size)
    order = MixtureOrder(schedule, sizes, shuffle=True, seed=seed)
    samples = 8 * sum(sizes) + 2 * block_size * machines
    draws = MachineDraws(
        order, [np.array(c, np.int64) for c in counts], [None, None], samples, window=window, machines=machines
    )
    sequences = machine_sequences(draws, 2, samples)
    for component, size in enumerate(sizes):
        shares = taken_from_stream(size, np.arange(machines), machines).tolist()
        mine = [[sample for k, sample in sequence if k == component] for sequence in sequences]
        passes = min(len(read) // share for read, share in zip(mine, shares, strict=True))
        assert passes >= 1
        for number in range(passes):
            read = [
                sample for m, share in enumerate(shares) for sample in mine[m][number * share : (number + 1) * share]
            ]
            assert sorted(read) == list(range(size))


def test_a_component_smaller_than_the_machines_is_refused() -> None:
    schedule = parse_schedule(("a", "b"), {"a": 1, "b": 1}, None, 4)
    order = MixtureOrder(schedule, [10, 2], shuffle=True, seed=0)
    with pytest.raises(ValueError, match="component 'b' has 2 samples, fewer than the 3 machines"):
        MachineDraws(order, [np.array([10]), np.array([2])], [None, None], 40, window=2, machines=3)
