"""How a loader cuts an epoch into steps of one batch per rank: a fixed number of samples, or a token budget.

`EpochSteps` is the one view iteration, ``len()``, ``explain``, ``skip`` and a state's digest take of the
rest of an epoch from a position. Fixed batches (``local_batch_size``) are `BatchPlan` arithmetic, O(1)
for any count; batches by budget (``batch_tokens``) are `TokenBudgetPlan`'s steps, which read the lengths
of the samples they cover (from the records' index, never their data), so counting them walks them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from guideloom._core.checks import check_int
from guideloom._loading.orders import epoch_order
from guideloom._loading.settings import OrderSettings
from guideloom._mixture.mixture import Mixture
from guideloom._sampling.epoch_order import BatchPlan
from guideloom._sampling.token_budget import LengthsAt, Step, TokenBudgetPlan
from guideloom._sampling.windowed_budget import StreamStep, WindowedBudgetPlan
from guideloom._sources.capabilities import MeasuredSamples
from guideloom._sources.source import SampleSource
from guideloom._storage.storages import TokenStorage

__all__ = [
    "EpochSteps",
    "OrderedRuns",
    "check_batch_sizes",
    "check_budgets_for_documents",
    "check_measured",
    "check_some_batch",
]

ORDER_CHUNK = 4096  # positions whose sample indices are computed at once when batches by budget ask for runs


class OrderedRuns:
    """The sample indices at runs of consecutive epoch positions, computed a chunk at a time (the order is
    vectorised, and batches by budget ask for one short run after another)."""

    def __init__(self, source: SampleSource, settings: OrderSettings, epoch: int) -> None:
        self._order = None if settings.kind.passes_positions else epoch_order(source, settings, epoch, 0)
        self._base = 0
        self._indices = np.empty(0, np.int64)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """``positions`` (ascending; past the end: wrapping around) as the source takes them."""
        if self._order is None or not len(positions):
            return positions
        first, count = int(positions[0]), len(positions)
        if int(positions[-1]) - first != count - 1:  # (a stream's positions in the windowed order: one at a time)
            return self._order.sample_at(positions)
        if not self._base <= first <= first + count <= self._base + len(self._indices):
            self._base = first
            self._indices = self._order.sample_at(np.arange(first, first + max(count, ORDER_CHUNK), dtype=np.int64))
        return self._indices[first - self._base : first - self._base + count]


def check_batch_sizes(local_batch_size: object, batch_tokens: object) -> tuple[int | None, int | None]:
    """``from_storage``'s batch size: exactly one of ``local_batch_size`` and ``batch_tokens``, a positive int."""
    if (local_batch_size is None) == (batch_tokens is None):
        raise TypeError("from_storage() takes exactly one of local_batch_size and batch_tokens")
    if local_batch_size is not None:
        return check_int("local_batch_size", local_batch_size, minimum=1), None
    return None, check_int("batch_tokens", batch_tokens, minimum=1)


def check_budgets_for_documents(storage: object) -> None:
    """ValueError if ``batch_tokens`` is asked of token storages, before any argument only token windows take (such as
    ``sequence_length``) is asked for: a budget batches records, and token windows have a fixed length."""
    storages = storage.components.values() if isinstance(storage, Mixture) else [storage]
    tokens = [each for each in storages if isinstance(each, TokenStorage)]
    if tokens:
        what = f"the TokenStorage at {tokens[0].location}" if storage is tokens[0] else "a mixture of TokenStorages"
        raise ValueError(
            f"batch_tokens applies to the records of a DocumentStorage (or a mixture of them), not to {what}: "
            "token windows have a fixed length (sequence_length), so batch them with local_batch_size"
        )


def check_measured(source: SampleSource) -> None:
    """ValueError unless ``source`` knows its samples' lengths, as ``batch_tokens`` needs (the source is then
    closed)."""
    if not (isinstance(source, MeasuredSamples) and source.measures_samples):
        source.close()
        raise ValueError(
            f"batch_tokens applies to the records of a DocumentStorage (or a mixture of them), not to {source}: "
            "token windows and packed rows have a fixed length, so batch them with local_batch_size"
        )


def check_some_batch(source: SampleSource, settings: OrderSettings) -> None:
    """ValueError if ``drop_last`` drops every batch of an epoch (every epoch would then be silently empty)."""
    if not (settings.drop_last and EpochSteps(source, settings, 0, 0).is_complete()):
        return
    size, world_size = settings.local_batch_size, settings.world_size
    batch = (
        f"of {size * world_size} (local_batch_size={size} × world_size={world_size})"
        if size is not None
        else f"of batch_tokens={settings.batch_tokens} on each of {world_size} ranks"
    )
    raise ValueError(
        f"drop_last=True would drop every batch: {source} gives {source.sample_count} samples per epoch, fewer "
        f"than one global batch {batch}"
    )


def lengths_in_order(source: SampleSource, settings: OrderSettings, epoch: int) -> LengthsAt:
    """The lengths of the samples at epoch positions of ``epoch``, as the budget planner asks for them."""
    indices_at = OrderedRuns(source, settings, epoch)
    assert isinstance(source, MeasuredSamples)  # (check_measured made sure)

    def lengths_at(positions: np.ndarray) -> np.ndarray:
        return np.asarray(source.sample_lengths(indices_at(positions), epoch), np.int64)

    return lengths_at


class EpochSteps:
    """The steps of epoch ``epoch`` of ``source`` from position ``start``, with the loader's ``settings``."""

    def __init__(self, source: SampleSource, settings: OrderSettings, epoch: int, start: int) -> None:
        self.source, self.settings, self.epoch, self.start = source, settings, epoch, start
        if settings.batch_tokens is None:
            assert settings.local_batch_size is not None
            self.fixed: BatchPlan | None = BatchPlan(
                source.sample_count, settings.local_batch_size, settings.world_size, settings.drop_last, start
            )
        else:
            self.fixed = None

    def budget_plan(self, start: int | None = None) -> TokenBudgetPlan | WindowedBudgetPlan:
        settings = self.settings
        assert settings.batch_tokens is not None
        plan = TokenBudgetPlan(
            self.source.sample_count,
            settings.batch_tokens,
            settings.world_size,
            settings.drop_last,
            lengths_in_order(self.source, settings, self.epoch),
            self.start if start is None else start,
        )
        if settings.kind.windowed:
            return WindowedBudgetPlan(plan, settings.streams)
        return plan

    def steps(self) -> Iterator[Step | StreamStep]:
        """The steps left, in order."""
        if self.fixed is None:
            yield from self.budget_plan().steps()
            return
        plan, world_size = self.fixed, self.settings.world_size
        for batch in range(plan.batch_count):
            first_rank = plan.rank_positions(batch, 0)  # ranks read consecutive runs of one length
            first, per_rank = int(first_rank[0]), len(first_rank)
            yield Step(tuple(first + per_rank * rank for rank in range(world_size + 1)), plan.batch_end(batch))

    def rank_indices(self, rank: int, ends: deque[int]) -> Iterator[np.ndarray]:
        """``rank``'s sample indices (positions, for a source that orders itself), step after step, the source told
        of each batch ahead; where the epoch continues after each step is appended to ``ends``."""
        indices_at, source = OrderedRuns(self.source, self.settings, self.epoch), self.source
        for step in self.steps():
            indices = indices_at(step.rank_positions(rank))
            source.prefetch(indices, self.epoch)
            ends.append(step.end)
            yield indices

    def is_complete(self) -> bool:
        """Whether no batch is left in the epoch."""
        return self.fixed.batch_count == 0 if self.fixed is not None else self.budget_plan().is_complete()

    def count(self) -> int:
        """Steps left in the epoch (a budget's are walked)."""
        return self.fixed.batch_count if self.fixed is not None else self.budget_plan().step_count()

    def epoch_count(self) -> int:
        """Steps in the whole epoch, as if it started at 0: the loader's length."""
        return self.fixed.full_epoch_batch_count if self.fixed is not None else self.budget_plan(0).step_count()

    def number_before(self) -> int:
        """Steps of the epoch before ``start`` (for a budget: those of the plan from 0 that end at or before it)."""
        if self.fixed is not None:
            return self.start // self.fixed.global_batch_size
        return sum(1 for step in self.budget_plan(0).steps() if step.end <= self.start) if self.start else 0

    def end_after(self, batches: int) -> int:
        """The position after the next ``batches`` steps (``batches`` at most `count`; 0: ``start``)."""
        if batches == 0:
            return self.start
        if self.fixed is not None:
            return self.fixed.batch_end(batches - 1)
        for done, step in enumerate(self.steps(), 1):
            if done == batches:
                return step.end
        raise IndexError(f"the epoch has fewer than {batches} batches left")
