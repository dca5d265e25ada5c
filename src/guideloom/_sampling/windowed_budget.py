"""Batches by token budget in the windowed order: each machine's ranks cut their batches from their own share.

The positions of a windowed epoch read by budget are dealt out over its ``streams`` (machine shares) in turn:
position ``t`` is sample ``t // streams`` of stream ``t % streams``. So a position ``P`` alone says how far every
stream went (`taken_from_stream`), the state stays one integer, and any step that ends at a position reads each
stream's next samples, none skipped, none twice, however the ranks were arranged before.

The rule for a step from ``P``, a pure function of ``P`` and the lengths of the samples in each stream's order:

- When the ranks divide evenly over the streams (``world_size = R x streams``: the machine's ranks when the
  configuration is the state's), stream ``s`` is read by ranks ``s x R .. s x R + R - 1``. Each stream's ``R``
  greedy batches within the budget reach some sample of it; the step ends at the furthest position at which no
  stream gives more than its batches reach (and never past the epoch's end). Every stream then gives at least
  ``R`` samples but at the epoch's end, and its ranks cut them greedily, each leaving one sample to every rank
  after it. So every batch keeps the budget (a sample longer than it alone) and every stream advances as far.
- Otherwise (e.g. an elastic resume onto fewer machines than the epoch's shares), the ranks cut the positions
  from ``P`` in turn, as the global order's `TokenBudgetPlan` does, reading from several streams each.

At the epoch's end a rank left without a sample gets one padding sample (a position past the end, which wraps to
the epoch's start: its stream's first sample). With ``drop_last`` the step that reaches the end is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from guideloom._core.checks import check_int
from guideloom._sampling.token_budget import Lengths, LengthsAt, Step, StepWalk, TokenBudgetPlan, batch_end
from guideloom._sampling.windowed_order import taken_from_stream

__all__ = ["StreamStep", "WindowedBudgetPlan"]

STREAM_CHUNK = 256  # a stream's lengths read at a time: no further ahead than its window (their shards are its)


@dataclass(frozen=True)
class StreamStep:
    """One step of all ranks: rank ``r`` reads positions ``firsts[r], firsts[r] + stride, ..`` below ``stops[r]``
    (each in one stream; those at or past the epoch's end are padding); the epoch continues at ``end``."""

    firsts: tuple[int, ...]
    stops: tuple[int, ...]
    stride: int
    end: int

    def rank_positions(self, rank: int) -> npt.NDArray[np.int64]:
        return np.arange(self.firsts[rank], self.stops[rank], self.stride, dtype=np.int64)


class WindowedBudgetPlan(StepWalk):
    """How the positions ``[start, sample_count)`` of ``plan`` (its budget, ranks and lengths), a windowed epoch read
    in ``streams`` shares, are cut into steps of ``world_size`` batches within ``batch_tokens`` (see the module's
    rule); ``plan.lengths_at(positions)`` gives the lengths at any positions below ``sample_count``.
    """

    def __init__(self, plan: TokenBudgetPlan, streams: int) -> None:
        self.plan = plan
        self.sample_count, self.batch_tokens, self.world_size = plan.sample_count, plan.batch_tokens, plan.world_size
        self.drop_last, self.start = plan.drop_last, plan.start
        self.streams = check_int("streams", streams, 1)

    def steps(self) -> Iterator[Step | StreamStep]:
        """The steps left in the epoch, in order."""
        if self.world_size % self.streams:
            yield from self.plan.steps()
            return
        streams = np.arange(self.streams, dtype=np.int64)
        stream_sizes = taken_from_stream(self.sample_count, streams, self.streams).tolist()
        taken = taken_from_stream(self.start, streams, self.streams).tolist()
        readers = [
            Lengths(self._stream_lengths(stream), max(size, 1), first, STREAM_CHUNK)
            for stream, (size, first) in enumerate(zip(stream_sizes, taken, strict=True))
        ]
        position = self.start
        while position < self.sample_count:
            step = self._step(readers, stream_sizes, position)
            if self.drop_last and step.end >= self.sample_count:
                return
            yield step
            position = step.end
            for stream, reader in enumerate(readers):
                reader.forget_before(int(taken_from_stream(position, stream, self.streams)))

    def _stream_lengths(self, stream: int) -> LengthsAt:
        """The lengths of a stream's samples at these offsets in it."""
        return lambda offsets: self.plan.lengths_at(stream + self.streams * np.asarray(offsets, np.int64))

    def _step(self, readers: list[Lengths], stream_sizes: list[int], position: int) -> StreamStep:
        per_stream, count = self.world_size // self.streams, self.streams
        taken = taken_from_stream(position, np.arange(count), count).tolist()
        end = self.sample_count
        for stream, (reader, first, size) in enumerate(zip(readers, taken, stream_sizes, strict=True)):
            reach = first
            for _ in range(per_stream):
                if reach >= size:
                    break
                reach = batch_end(reader, reach, self.batch_tokens, size)
            end = min(end, stream + count * reach)  # the furthest position whose samples of this stream reach no more
        firsts: list[int] = []
        stops: list[int] = []
        for stream, (reader, first) in enumerate(zip(readers, taken, strict=True)):
            stop = int(taken_from_stream(end, stream, count))
            for rank in range(per_stream):
                if first >= stop:  # the epoch's end: a padding sample
                    firsts.append(self.sample_count + stream)
                    stops.append(self.sample_count + stream + 1)
                    continue
                last = min(batch_end(reader, first, self.batch_tokens, stop), stop - (per_stream - 1 - rank))
                last = max(last, first + 1)
                firsts.append(stream + count * first)
                stops.append(stream + count * last)
                first = last
        return StreamStep(tuple(firsts), tuple(stops), count, end)
