"""Mixture schedules: weights per stage, rounded to exact counts per block of global samples.

A schedule is a list of stages ``(start, weights)``. Within every aligned block of ``block_size``
global samples, component ``k`` of the stage in force contributes exactly ``counts[stage, k]``
samples: its normalised weight × ``block_size`` rounded by largest remainder (floor for all, then +1
to the largest remainders, ties to the earlier component). Everything here is integer arithmetic on
a few small arrays, so the number of times a component was drawn before any block is a closed form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from guideloom._core.checks import check_int, check_number

__all__ = ["Schedule", "largest_remainder", "parse_schedule"]


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """``total`` split in proportion to ``weights``: floors, then +1 to the largest remainders (ties: earlier).

    The arithmetic is exact (each float weight is taken as the binary fraction it is, all brought to one
    power-of-two denominator), so equal weights always tie and the result never depends on summation order.
    """
    ratios = [Fraction(weight).as_integer_ratio() for weight in weights]
    denominator = max(den for _, den in ratios)  # every float's denominator is a power of two
    numerators = [num * (denominator // den) for num, den in ratios]
    whole = sum(numerators)
    if whole <= 0:
        raise ValueError("weights must not all be zero")
    counts, remainders = zip(*(divmod(num * total, whole) for num in numerators), strict=True)
    result = list(counts)
    by_remainder = sorted(range(len(result)), key=lambda k: (-remainders[k], k))
    for k in by_remainder[: total - sum(result)]:
        result[k] += 1
    return result


@dataclass(frozen=True)
class Schedule:
    """Exact per-block counts of each component, stage by stage.

    ``starts[s]`` is the first global sample of stage ``s`` (a multiple of ``block_size``, the first 0);
    ``counts[s, k]`` is how many samples component ``k`` contributes to each block of stage ``s``.
    """

    names: tuple[str, ...]
    block_size: int
    starts: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]

    @property
    def first_blocks(self) -> npt.NDArray[np.int64]:
        """The first block of each stage."""
        return self.starts // self.block_size

    def stage_of_blocks(self, blocks: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The stage in force in each block."""
        return np.searchsorted(self.first_blocks, blocks, side="right").astype(np.int64) - 1

    def draws_before_blocks(self, blocks: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """How many samples each component contributed before each block: shape ``(len(blocks), K)``.

        Closed form: for every stage, its count per block × the number of its blocks before ``block``.
        """
        firsts = self.first_blocks
        lengths = np.append(np.diff(firsts), np.iinfo(np.int64).max // 2)  # the last stage never ends
        covered = np.clip(blocks[:, None] - firsts[None, :], 0, lengths[None, :])
        draws: npt.NDArray[np.int64] = covered @ self.counts
        return draws

    def restarted_at(self, starts: npt.NDArray[np.int64]) -> Schedule:
        """This schedule with stage ``s`` starting at the first block at or after ``starts[s]`` (non-decreasing; a
        stage that would start where a later one does is dropped): a machine's own schedule in a windowed mixture."""
        rounded = -(-np.asarray(starts, np.int64) // self.block_size) * self.block_size
        keep = np.append(rounded[1:] != rounded[:-1], True)
        return Schedule(self.names, self.block_size, rounded[keep], self.counts[keep])

    def to_json(self) -> list[list[Any]]:
        """The stages as ``[[start, [count, ...]], ...]``: what a loader state records (small, exact)."""
        return [[int(start), [int(c) for c in row]] for start, row in zip(self.starts, self.counts, strict=True)]

    def first_difference(self, other: Schedule, before: int) -> str | None:
        """Where this schedule and ``other`` give different counts to a block that starts before ``before``.

        ``None`` if they agree on every such block; otherwise a sentence a user can act on.
        """
        if self.names != other.names or self.block_size != other.block_size:
            return "the components or block_size differ"
        last_block = -(-before // self.block_size)  # blocks 0 .. last_block - 1 hold samples before `before`
        boundaries = np.union1d(self.first_blocks, other.first_blocks)
        boundaries = boundaries[boundaries < last_block]
        mine = self.counts[self.stage_of_blocks(boundaries)]
        theirs = other.counts[other.stage_of_blocks(boundaries)]
        differing = np.flatnonzero((mine != theirs).any(axis=1))
        if differing.size == 0:
            return None
        block = int(boundaries[differing[0]])
        return f"the weights in force at global sample {block * self.block_size} differ"


def _check_weights(names: Sequence[str], weights: object, where: str) -> list[float]:
    """The weights of ``names`` in order, or a ValueError/TypeError that says what is wrong with them."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"{where} must be a dict of component name -> weight, got {type(weights).__name__}")
    missing = [name for name in names if name not in weights]
    extra = [key for key in weights if key not in names]
    if missing or extra:
        problems = ([f"misses {missing}"] if missing else []) + ([f"names unknown components {extra}"] if extra else [])
        raise ValueError(f"{where} must name exactly the components {list(names)}: it {' and '.join(problems)}")
    values: list[float] = []
    for name in names:
        value = check_number(f"{where}[{name!r}]", weights[name], finite=True)
        if value < 0:
            raise ValueError(f"{where}[{name!r}] must be a finite number >= 0, got {value!r}")
        values.append(float(value))
    if not any(values):
        raise ValueError(f"{where} must not all be zero")
    return values


def _check_start(value: object, index: int, block_size: int, previous: int | None) -> int:
    """Stage ``index``'s start, checked: an int, 0 for the first, increasing, a multiple of ``block_size``."""
    where = f"schedule[{index}] start"
    start = check_int(where, value)
    if previous is None and start != 0:
        raise ValueError(f"schedule[0] start must be 0, got {start}")
    if previous is not None and start <= previous:
        raise ValueError(f"schedule starts must increase: {where} is {start}, after {previous}")
    if start % block_size:
        raise ValueError(f"{where} must be a multiple of block_size ({block_size}), got {start}")
    return start


def parse_schedule(names: Sequence[str], weights: object, schedule: object, block_size: object) -> Schedule:
    """A `Schedule` from either ``weights`` (one stage) or ``schedule`` (a list of ``(start, weights)``)."""
    block = check_int("block_size", block_size, minimum=1)
    if (weights is None) == (schedule is None):
        raise ValueError("give exactly one of weights= and schedule=")
    if weights is not None:
        stages: list[Any] = [(0, weights)]
        label = "weights"
    else:
        if not isinstance(schedule, list | tuple) or not schedule:
            raise TypeError("schedule must be a non-empty list of (start, weights) pairs")
        stages, label = list(schedule), "schedule"
    starts: list[int] = []
    counts: list[list[int]] = []
    for index, stage in enumerate(stages):
        if not isinstance(stage, list | tuple) or len(stage) != 2:
            raise TypeError(f"schedule[{index}] must be a (start, weights) pair, got {stage!r}")
        start, stage_weights = stage
        starts.append(_check_start(start, index, block, starts[-1] if starts else None))
        where = label if label == "weights" else f"schedule[{index}] weights"
        counts.append(largest_remainder(_check_weights(names, stage_weights, where), block))
    table = np.array(counts, np.int64).reshape(len(starts), len(names))
    return Schedule(tuple(names), block, np.array(starts, np.int64), table)
