"""Batches by token budget: an epoch's order cut into steps of one batch per rank, each within a budget.

The rule, a pure function of the start position and the lengths of the samples in epoch order:
a step starts where the previous one ended; rank 0's batch takes the sample there and then the
following ones while their lengths sum to at most ``batch_tokens`` (a sample longer than the budget
is a batch alone), rank 1's batch continues after it, and so on to the last rank. A batch never
crosses the epoch's end: once the order is used up, the step's remaining ranks get padding batches
cut the same way from the start of the order again (as fixed batches wrap around), and the epoch is
complete. With ``drop_last`` the step that reaches the epoch's end is dropped instead.

So every rank yields the same number of batches, and where a step ends is the only state: resuming
(with any world size or budget) continues at that position, and planning a step reads the lengths
of its own samples only, never those before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from guideloom._core.checks import check_bool, check_int

__all__ = ["Lengths", "Step", "TokenBudgetPlan", "batch_end"]

LengthsAt = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]]
FIRST_CHUNK = 256  # positions whose lengths are read first; later reads double up to MAX_CHUNK
MAX_CHUNK = 1 << 16


@dataclass(frozen=True)
class Step:
    """One step of all ranks: rank ``r`` reads positions ``bounds[r]:bounds[r + 1]`` (those at or past
    ``sample_count`` are padding, wrapping around); the epoch continues at ``end``."""

    bounds: tuple[int, ...]
    end: int

    def rank_positions(self, rank: int) -> npt.NDArray[np.int64]:
        return np.arange(self.bounds[rank], self.bounds[rank + 1], dtype=np.int64)


class Lengths:
    """The lengths of a run of positions, read ahead in growing chunks as the planner walks forward."""

    def __init__(self, lengths_at: LengthsAt, sample_count: int, start: int, max_chunk: int = MAX_CHUNK) -> None:
        self._lengths_at = lengths_at
        self._sample_count = sample_count
        self.base = start
        self.sums = np.zeros(1, np.int64)  # running sums from base: sums[i] is the total of base .. base + i - 1
        self._chunk = min(FIRST_CHUNK, max_chunk)
        self._max_chunk = max_chunk

    @property
    def stop(self) -> int:
        return self.base + len(self.sums) - 1

    def read_to(self, limit: int) -> bool:
        """Read the next chunk of lengths, never past ``limit``; False if there is nothing left before it."""
        if self.stop >= limit:
            return False
        positions = np.arange(self.stop, min(limit, self.stop + self._chunk), dtype=np.int64)
        lengths = np.asarray(self._lengths_at(positions % self._sample_count), np.int64)
        self.sums = np.concatenate([self.sums, self.sums[-1] + np.cumsum(lengths)])
        self._chunk = min(2 * self._chunk, self._max_chunk)
        return True

    def forget_before(self, position: int) -> None:
        """Drop what lies before ``position`` (the planner never looks back)."""
        drop = position - self.base
        if drop > len(self.sums) // 2:
            self.sums = self.sums[drop:] - self.sums[drop]
            self.base = position


class StepWalk:
    """What every budget planner answers by walking its steps: whether any is left, and how many."""

    sample_count: int
    drop_last: bool
    start: int

    def steps(self) -> Iterator[Any]:
        raise NotImplementedError

    def is_complete(self) -> bool:
        """Whether no step is left from ``start``."""
        if not self.drop_last:  # (without reading a length)
            return self.start >= self.sample_count
        return next(iter(self.steps()), None) is None

    def step_count(self) -> int:
        """Steps left from ``start`` (walks them: reads the lengths of the rest of the epoch)."""
        return sum(1 for _ in self.steps())


class TokenBudgetPlan(StepWalk):
    """How the positions ``[start, sample_count)`` of an epoch are cut into steps of ``world_size`` batches,
    each batch's lengths summing to at most ``batch_tokens`` (see the module's rule).

    ``lengths_at(positions)`` gives the lengths of the samples at these epoch positions (each in
    ``[0, sample_count)``); it is asked for consecutive runs of positions, from ``start`` on, only.
    """

    def __init__(
        self,
        sample_count: int,
        batch_tokens: int,
        world_size: int,
        drop_last: bool,
        lengths_at: LengthsAt,
        start: int = 0,
    ) -> None:
        self.sample_count = check_int("sample_count", sample_count, 1)
        self.batch_tokens = check_int("batch_tokens", batch_tokens, 1)
        self.world_size = check_int("world_size", world_size, 1)
        self.drop_last = check_bool("drop_last", drop_last)
        self.start = check_int("start", start, 0)
        if self.start > self.sample_count:
            raise ValueError(f"start must be <= sample_count ({self.sample_count}), got {start}")
        self.lengths_at = lengths_at

    def steps(self) -> Iterator[Step]:
        """The steps left in the epoch, in order."""
        lengths = Lengths(self.lengths_at, self.sample_count, self.start)
        position = self.start
        while position < self.sample_count:
            step = self._step(lengths, position)
            if self.drop_last and step.end >= self.sample_count:
                return
            yield step
            position = step.end
            lengths.forget_before(position)

    def _step(self, lengths: Lengths, position: int) -> Step:
        bounds = [position]
        for _ in range(self.world_size):
            position = self._batch_end(lengths, position)
            bounds.append(position)
        return Step(tuple(bounds), min(position, self.sample_count))

    def _batch_end(self, lengths: Lengths, first: int) -> int:
        """Where the batch starting at ``first`` ends, never crossing the end of an epoch's order (a multiple of
        ``sample_count``)."""
        return batch_end(lengths, first, self.batch_tokens, (first // self.sample_count + 1) * self.sample_count)


def batch_end(lengths: Lengths, first: int, batch_tokens: int, limit: int) -> int:
    """Where the batch starting at ``first`` ends: the greedy run of samples whose lengths sum to at most
    ``batch_tokens`` (at least the first sample), never past ``limit``."""
    while True:
        if lengths.stop <= first:  # (the first batch of a plan, or of padding)
            lengths.read_to(limit)
        offset = first - lengths.base
        sums = lengths.sums
        cap = sums[offset] + batch_tokens
        # the last position whose running sum stays within the budget; at least the first sample
        end = int(np.searchsorted(sums, cap, side="right")) - 1 + lengths.base
        end = max(end, first + 1)
        if end < lengths.stop or lengths.stop >= limit or not lengths.read_to(limit):
            return min(end, limit)
