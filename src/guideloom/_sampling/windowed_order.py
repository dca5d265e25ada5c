"""The windowed shuffle: each machine reads its own share of the shards, about K of them at a time.

An epoch's shards are put in a seeded order and their samples, in that order, cut into ``streams`` equal
shares, one per machine (a share's first and last shard may be shared with the neighbouring share). A
stream walks its shards in *blocks*: shard ``j`` of the stream is spread over the blocks ``j - K + 1 .. j``
(clipped to the stream's blocks) in near-equal pieces, and the samples of a block are shuffled together.
So every block mixes K shards, one shard starts and one finishes per block, and a machine holds about
K + 1 shards at a time, however many it reads in the epoch.

A global batch takes about ``global_batch_size / streams`` consecutive samples of every stream, stream after
stream, so stream ``s`` goes to the ranks of machine ``s``. The last, short batch gives each of the ``ranks``
the same number of positions (as `BatchPlan` cuts it); a machine's ranks take its own stream's leftover there,
and where their positions outnumber it they repeat it (padding), so that no machine reads another's shards.
Like `EpochOrder` everything is a pure function of a few integers (and the per-shard sample counts): a
position's sample costs O(K + log shards), and how far an epoch went is its position alone: a global batch
brings every stream to the count `taken_from_stream` gives for its end, whatever the batch sizes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from guideloom._core.checks import check_int
from guideloom._sampling.epoch_order import MASK64, EpochOrder, mix_int

__all__ = ["WindowedOrder", "taken_from_stream"]

_STREAM_KEY = 0x5851F42D4C957F2D  # separates a stream's block keys from the epoch's own order


def taken_from_stream(total: npt.ArrayLike, stream: npt.ArrayLike, streams: int) -> npt.NDArray[np.int64]:
    """Samples of stream ``stream`` among the first ``total`` of the epoch: the positions below ``total`` that are
    ``stream`` modulo ``streams``. Every global batch brings each stream to exactly this count, whatever its size,
    so the position alone says how far every stream went, under any batch sizes."""
    total, stream = np.asarray(total, np.int64), np.asarray(stream, np.int64)
    taken: npt.NDArray[np.int64] = np.maximum(total - stream + streams - 1, 0) // streams
    return taken


@dataclass(frozen=True)
class _Stream:
    """One machine's share: its shard parts in order, how they spread over blocks, and the blocks' sizes."""

    shard_positions: npt.NDArray[np.int64]  # the shard (position in the storage) of each part
    part_starts: npt.NDArray[np.int64]  # the part's first sample, counted within its shard
    part_sizes: npt.NDArray[np.int64]
    first_block: npt.NDArray[np.int64]  # the part's pieces lie in blocks first_block .. first_block + span - 1
    span: npt.NDArray[np.int64]
    block_starts: npt.NDArray[np.int64]  # where each block starts in the stream, and the stream's length last
    window: int

    @property
    def length(self) -> int:
        return int(self.block_starts[-1])

    def block_parts(self, block: int) -> tuple[int, int]:
        """The parts with a piece in ``block``: ``first .. stop - 1``."""
        return block, min(block + self.window, len(self.part_sizes))

    def piece_bounds(self, parts: slice, block: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Where the pieces of these parts in ``block`` start and stop, counted within each part."""
        piece = block - self.first_block[parts]
        sizes, span = self.part_sizes[parts], self.span[parts]
        return piece * sizes // span, (piece + 1) * sizes // span


def _stream(
    counts: npt.NDArray[np.int64], shard_order: npt.NDArray[np.int64], begin: int, end: int, window: int
) -> _Stream:
    """The stream of the samples ``begin .. end - 1`` of the epoch's shard sequence (shards in ``shard_order``)."""
    ordered = counts[shard_order]
    starts = np.zeros(len(ordered) + 1, np.int64)
    np.cumsum(ordered, out=starts[1:])
    first = int(np.searchsorted(starts, begin, side="right")) - 1
    stop = int(np.searchsorted(starts, end, side="left"))
    sequence = np.arange(max(first, 0), stop, dtype=np.int64)
    low = np.maximum(starts[sequence], begin)
    high = np.minimum(starts[sequence + 1], end)
    keep = high > low  # shards without a sample here (empty ones, or the boundary) take no place in a window
    sequence, low, high = sequence[keep], low[keep], high[keep]
    parts = len(sequence)
    blocks = max(1, parts - window + 1)
    index = np.arange(parts, dtype=np.int64)
    first_block = np.maximum(index - window + 1, 0)
    span = np.minimum(index, blocks - 1) - first_block + 1
    sizes = high - low
    # Every part's i-th piece added into its block, one i at a time: memory per part, not per piece.
    block_sizes = np.zeros(blocks, np.int64)
    for piece in range(int(span.max()) if parts else 0):
        has = span > piece
        piece_sizes = (piece + 1) * sizes[has] // span[has] - piece * sizes[has] // span[has]
        block_sizes += np.bincount(first_block[has] + piece, weights=piece_sizes, minlength=blocks).astype(np.int64)
    block_starts = np.zeros(blocks + 1, np.int64)
    np.cumsum(block_sizes, out=block_starts[1:])
    return _Stream(
        shard_positions=shard_order[sequence],
        part_starts=low - starts[sequence],
        part_sizes=sizes,
        first_block=first_block,
        span=span,
        block_starts=block_starts,
        window=window,
    )


class WindowedOrder:
    """The order of one epoch's samples read in ``streams`` machine shares, windows of ``window`` shards each.

    ``shard_sample_counts`` are the samples of each shard in storage order (sample indices are numbered
    shard after shard; see `shard_order` for ``clean_cuts``). Positions from ``start`` on are cut into
    global batches of ``global_batch_size``; ``start`` must be where a global batch began, and the same mapping
    results from any such start of a run with these settings, so a resumed run continues bit for bit.
    ``ranks`` (by default one a stream) read the batches, machine after machine; the last batch, short, is
    padded to the same number of positions for each (see `padded_end`).
    """

    def __init__(
        self,
        shard_sample_counts: npt.ArrayLike,
        *,
        seed: int,
        epoch: int,
        window: int,
        streams: int,
        global_batch_size: int,
        start: int = 0,
        clean_cuts: npt.ArrayLike | None = None,
        ranks: int | None = None,
    ) -> None:
        counts = np.asarray(shard_sample_counts, dtype=np.int64)
        if counts.ndim != 1 or (counts.size and int(counts.min()) < 0):
            raise ValueError("shard_sample_counts must be a 1-D array of non-negative counts")
        self.counts = counts
        self.shard_firsts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.sample_count = int(self.shard_firsts[-1])
        self.seed = check_int("seed", seed, None)
        self.epoch = check_int("epoch", epoch, 0)
        self.window = check_int("window", window, 1)
        self.streams = check_int("streams", streams, 1)
        self.global_batch_size = check_int("global_batch_size", global_batch_size, 1)
        self.start = check_int("start", start, 0)
        self.clean_cuts = None if clean_cuts is None else np.asarray(clean_cuts, np.int64)
        self.ranks = self._checked_ranks(ranks)
        self._streams: dict[int, _Stream] = {}
        self.full_batches = self.full_batches_from(self.start)

    def _checked_ranks(self, ranks: int | None) -> int:
        return check_int("ranks", self.streams if ranks is None else ranks, 1)

    def full_batches_from(self, start: int) -> int:
        """The full global batches from ``start`` to the epoch's end (how global batches take from the streams)."""
        if start > self.sample_count:
            raise ValueError(f"start must be at most the epoch's {self.sample_count} samples, got {start}")
        return (self.sample_count - start) // self.global_batch_size

    def __len__(self) -> int:
        return self.sample_count

    def at(self, start: int, global_batch_size: int, ranks: int | None = None) -> WindowedOrder:
        """This epoch's order from another ``start``, global batch size or number of ranks, reusing its shares and
        windows."""
        moved = copy.copy(self)
        moved.__dict__.pop("_taken_before_tail", None)
        moved.ranks = self._checked_ranks(self.ranks if ranks is None else ranks)
        moved.global_batch_size = check_int("global_batch_size", global_batch_size, 1)
        moved.start = check_int("start", start, 0)
        moved.full_batches = moved.full_batches_from(moved.start)
        return moved

    @cached_property
    def shard_order(self) -> npt.NDArray[np.int64]:
        """The epoch's seeded order of the shards (storage positions), cut into the streams.

        With ``clean_cuts`` (the shards that no sample of the shard before runs into, shard 0 among them) it is
        the storage order from a seeded one of them on, so that a sample running on into the next shard (a token
        window) finds that shard in its own window, and no shard is needed at both ends of the sequence.
        """
        shards = len(self.counts)
        if self.clean_cuts is not None:
            cuts = self.clean_cuts if len(self.clean_cuts) else np.zeros(1, np.int64)
            first = int(cuts[EpochOrder(len(cuts), shuffle=True, seed=self.seed, epoch=self.epoch).sample_at_one(0)])
            return np.roll(np.arange(shards, dtype=np.int64), -first)
        order = EpochOrder(shards, shuffle=True, seed=self.seed, epoch=self.epoch)
        return order.indices(np.arange(shards, dtype=np.int64))

    @cached_property
    def _share_starts(self) -> npt.NDArray[np.int64]:
        lengths = taken_from_stream(self.sample_count, np.arange(self.streams), self.streams)
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def stream_bounds(self, stream: int) -> tuple[int, int]:
        """The samples of the epoch's shard sequence that stream ``stream`` reads: ``begin .. end - 1``."""
        return int(self._share_starts[stream]), int(self._share_starts[stream + 1])

    def stream(self, stream: int) -> _Stream:
        found = self._streams.get(stream)
        if found is None:
            begin, end = self.stream_bounds(stream)
            found = self._streams[stream] = _stream(self.counts, self.shard_order, begin, end, self.window)
        return found

    def end_parts(self, stream: int) -> tuple[list[tuple[int, int]], npt.NDArray[np.int64]]:
        """The samples (index ranges ``first .. stop - 1``) of stream ``stream`` that may read shards the neighbouring
        streams read too, and the shards (positions) the stream reads whole.

        Those samples are its first part and its last part, and the sample before the last part: a sample may run
        on into the shards after its own (a token window), so into the last part's shard.
        """
        share = self.stream(stream)
        parts = len(share.part_sizes)
        if not parts:
            return [], np.empty(0, np.int64)
        whole = share.shard_positions[share.part_sizes == self.counts[share.shard_positions]]
        firsts = self.shard_firsts[share.shard_positions] + share.part_starts
        ranges = [(int(firsts[part]), int(firsts[part] + share.part_sizes[part])) for part in sorted({0, parts - 1})]
        if parts > 2:
            before_last = int(firsts[parts - 2] + share.part_sizes[parts - 2])
            ranges.append((before_last - 1, before_last))
        return ranges, whole

    @property
    def tail_start(self) -> int:
        """Where the last, short global batch starts (``sample_count`` when there is none)."""
        return self.start + self.full_batches * self.global_batch_size

    @property
    def _rank_tail(self) -> int:
        """Positions each rank reads in the last batch (the batch's positions rounded up to a multiple of ranks)."""
        return -(-(self.sample_count - self.tail_start) // self.ranks)

    @property
    def padded_end(self) -> int:
        """The end of the last batch's positions, padding included: positions up to here have a sample."""
        return self.tail_start + self._rank_tail * self.ranks

    @cached_property
    def _taken_before_tail(self) -> npt.NDArray[np.int64]:
        """Each stream's samples in the whole global batches."""
        return taken_from_stream(self.tail_start, np.arange(self.streams), self.streams)

    @property
    def _leftovers(self) -> npt.NDArray[np.int64]:
        """Each stream's samples after the last whole global batch."""
        leftovers: npt.NDArray[np.int64] = np.diff(self._share_starts) - self._taken_before_tail
        return leftovers

    def stream_offsets(self, positions: npt.ArrayLike) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The stream and the offset in it that each position (in ``start .. padded_end - 1``) reads."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (int(pos.min()) < self.start or int(pos.max()) >= self.padded_end):
            raise IndexError(f"positions must lie in [{self.start}, {self.padded_end}), got {pos.min()}..{pos.max()}")
        relative = pos - self.start
        batch, within = np.divmod(relative, self.global_batch_size)
        batch_starts = self.start + batch * self.global_batch_size
        streams, offsets = np.empty_like(pos), np.empty_like(pos)
        tail = batch >= self.full_batches
        # A whole global batch takes from each stream what brings it to `taken_from_stream` of the batch's end,
        # stream after stream: q or q + 1 samples each, the extra ones to the streams the cyclic interval
        # [a, a + r) names (q, r = divmod(global batch, streams); a = the batch's start modulo streams).
        quotient, remainder = divmod(self.global_batch_size, self.streams)
        each = np.arange(self.streams + 1, dtype=np.int64)
        for phase in np.unique(batch_starts[~tail] % self.streams).tolist():
            mask = ~tail & (batch_starts % self.streams == phase)
            wrapped = max(0, phase + remainder - self.streams)
            before = each * quotient + np.clip(each - phase, 0, remainder) + np.minimum(each, wrapped)
            chosen = np.searchsorted(before, within[mask], side="right") - 1
            streams[mask] = chosen
            offsets[mask] = taken_from_stream(batch_starts[mask], chosen, self.streams) + within[mask] - before[chosen]
        if tail.any():
            streams[tail], offsets[tail] = self._tail_offsets(pos[tail] - self.tail_start)
        return streams, offsets

    def _tail_offsets(self, slots: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The last batch: stream ``s``'s leftover, then that leftover again, backwards (padding), in the slots
        of group ``s``. Where the ranks are machines of as many each (``ranks`` a multiple of ``streams``), group
        ``s`` is the slots of machine ``s``'s ranks: they outnumber any stream's leftover, so a machine reads no
        other's samples. Otherwise (an epoch resumed on other machines reads the shares it began with) each group
        is its stream's leftover, and the padding the last one's. A group whose stream has no leftover (fewer
        leftover samples than streams) repeats the stream's last sample before the tail, or, where the stream is
        empty, the last leftover there is."""
        leftovers = self._leftovers
        if self.ranks % self.streams == 0:
            sizes = np.full(self.streams, self._rank_tail * (self.ranks // self.streams), np.int64)
        else:
            sizes = leftovers.copy()
            sizes[-1] += self.padded_end - self.sample_count
        group_starts = np.concatenate([[0], np.cumsum(sizes)])
        groups = np.searchsorted(group_starts, slots, side="right") - 1
        within = slots - group_starts[groups]
        taken = self._taken_before_tail
        streams = np.where((leftovers + taken)[groups] > 0, groups, np.flatnonzero(leftovers)[-1])
        counts = leftovers[streams]
        repeated = np.maximum(counts, 1)  # a stream with none left repeats its sample before: offset taken - 1
        within = np.where(within < counts, within, counts - 1 - (within - counts) % repeated)
        return streams, taken[streams] + within

    def sample_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The sample index at each position (``start .. padded_end - 1``; see `stream_offsets`)."""
        streams, offsets = self.stream_offsets(positions)
        result = np.empty(streams.shape, np.int64)
        for stream in np.unique(streams).tolist():
            mask = streams == stream
            result[mask] = self.stream_samples(stream, offsets[mask])
        return result

    def stream_slots(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Where each position's stream and offset put it when the streams are dealt out in turn:
        ``offset × streams + stream``, a permutation of the epoch's positions (padding repeats, as in `sample_at`).

        A mixture reads its positions this way: each machine's slots are its own, numbered in the order it reads
        them, so every machine blends its components by itself (see ``_mixture.machine_draws``)."""
        streams, offsets = self.stream_offsets(positions)
        slots: npt.NDArray[np.int64] = offsets * self.streams + streams
        return slots

    def sample_at_one(self, position: int) -> int:
        return int(self.sample_at(np.array([position], np.int64))[0])

    def stream_samples(self, stream: int, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The samples at these offsets of one stream: block, shuffled place in the block, piece, shard."""
        share = self.stream(stream)
        blocks = np.searchsorted(share.block_starts, offsets, side="right") - 1
        result = np.empty(offsets.shape, np.int64)
        for block in np.unique(blocks).tolist():
            mask = blocks == block
            first_part, stop_part = share.block_parts(block)
            parts = slice(first_part, stop_part)
            piece_starts, piece_stops = share.piece_bounds(parts, block)
            piece_firsts = np.concatenate([[0], np.cumsum(piece_stops - piece_starts)])
            order = EpochOrder(int(piece_firsts[-1]), shuffle=True, seed=self._block_seed(stream), epoch=block)
            within = order.indices(offsets[mask] - share.block_starts[block])
            part = np.searchsorted(piece_firsts, within, side="right") - 1
            in_part = piece_starts[part] + within - piece_firsts[part]
            shards = share.shard_positions[first_part + part]
            result[mask] = self.shard_firsts[shards] + share.part_starts[first_part + part] + in_part
        return result

    def _block_seed(self, stream: int) -> int:
        key = mix_int((mix_int((self.seed & MASK64) ^ _STREAM_KEY) + self.epoch) & MASK64)
        return mix_int((key + stream * _STREAM_KEY) & MASK64) - (1 << 63)

    def shards_of(self, indices: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The shard (storage position) that holds each sample index."""
        return np.searchsorted(self.shard_firsts, np.asarray(indices, np.int64), side="right") - 1
