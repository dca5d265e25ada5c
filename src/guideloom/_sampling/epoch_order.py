"""Sample order within an epoch and its split into distributed batches.

Both are pure functions of their arguments, so a loader can recompute any part of an epoch from a
few integers, which is what makes resuming exact and cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from guideloom._core.checks import check_bool, check_int

__all__ = ["BatchPlan", "EpochOrder"]

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
ROUNDS = 6
_MAX_SAMPLES = (1 << 63) - 1  # positions and indices are int64
FEW = 8  # values left to cycle-walk that are walked one by one: a NumPy round costs as much as ~8 in integers
# A request of at least READ_AHEAD_FROM positions that continues the previous one is answered from a block of the
# READ_AHEAD positions from there, computed at once: cycle walking costs a dozen or more NumPy rounds per call
# whatever the count, which a loader reading 4,096 positions at a time paid four times as often.
READ_AHEAD_FROM = 1024
READ_AHEAD = 16384


def mix_int(x: int) -> int:
    """Splitmix64 finaliser on a Python int: a well-mixed 64-bit hash used to derive round keys."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


_SHIFT = np.uint64(33)
_MURMUR_1 = np.uint64(0xFF51AFD7ED558CCD)
_MURMUR_2 = np.uint64(0xC4CEB9FE1A85EC53)


def mix_array(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Murmur3 fmix64 on a uint64 array (wrapping arithmetic, in place): the Feistel round function."""
    x ^= x >> _SHIFT
    x *= _MURMUR_1
    x ^= x >> _SHIFT
    x *= _MURMUR_2
    x ^= x >> _SHIFT
    return x


def fmix_int(x: int) -> int:
    """`mix_array` (Murmur3 fmix64) of one 64-bit Python int."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
    return x ^ (x >> 33)


def round_keys(seed: int, epoch: int) -> list[int]:
    """The Feistel round keys of the order keyed by ``(seed, epoch)``."""
    base = mix_int(mix_int((seed & MASK64) ^ _GOLDEN) ^ (epoch & MASK64))
    return [mix_int((base + (r + 1) * _GOLDEN) & MASK64) for r in range(ROUNDS)]


def feistel(x: npt.NDArray[np.uint64], half_bits: Any, half_mask: Any, keys: Iterable[Any]) -> npt.NDArray[np.uint64]:
    """The balanced Feistel network on ``x`` (wrapping arithmetic): one round per key.

    ``half_bits``, ``half_mask`` and each key are uint64 scalars, or arrays shaped like ``x`` (one order
    per element, as a mixture evaluates many orders at once).
    """
    left, right = x >> half_bits, x & half_mask
    for key in keys:
        left, right = right, left ^ (mix_array(right ^ key) & half_mask)
    result: npt.NDArray[np.uint64] = (left << half_bits) | right
    return result


class EpochOrder:
    """The order in which one epoch visits samples `0 .. sample_count - 1`.

    With `shuffle` it is a pseudo-random permutation keyed by `(seed, epoch)`, evaluated lazily by a
    Feistel network with cycle walking, so any position costs O(1) time and memory however large the
    dataset is; without it the order is the identity.
    """

    def __init__(self, sample_count: int, *, shuffle: bool, seed: int, epoch: int) -> None:
        self.sample_count = check_int("sample_count", sample_count, 0)
        if self.sample_count > _MAX_SAMPLES:
            raise ValueError(f"sample_count must be <= {_MAX_SAMPLES}, got {sample_count}")
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_int("seed", seed, None)
        self.epoch = check_int("epoch", epoch, 0)
        # Balanced Feistel over the smallest even bit width >= 2 covering every index, so the
        # domain is at most four times sample_count and cycle walking needs few steps on average.
        bits = max(2, (self.sample_count - 1).bit_length())
        self._half_bits = np.uint64((bits + 1) // 2)
        self._half_mask = np.uint64((1 << int(self._half_bits)) - 1)
        self._keys = tuple(np.uint64(key) for key in round_keys(self.seed, self.epoch))
        self._ahead: tuple[int, npt.NDArray[np.int64]] = (0, np.empty(0, np.int64))  # first position, the order there
        self._next = -1  # the position after the last one asked for: where a sequential reader continues (a first
        # request never reads ahead: an order made for one request, as many are, computes no more than it asks)

    def __len__(self) -> int:
        return self.sample_count

    def __repr__(self) -> str:
        args = f"{self.sample_count}, shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}"
        return f"EpochOrder({args})"

    def indices(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Return the sample index at each position (each in `[0, sample_count)`), same shape, int64."""
        pos = _as_positions(positions)
        first, last = (int(pos.min()), int(pos.max())) if pos.size else (0, -1)
        if first < 0 or last >= self.sample_count:
            raise IndexError(f"positions must lie in [0, {self.sample_count}), got {first}..{last}")
        if not self.shuffle or pos.size == 0:
            return pos.copy()
        sequential, self._next = first == self._next, last + 1
        base, ahead = self._ahead
        if not base <= first <= last < base + len(ahead):
            if not (sequential and pos.size >= READ_AHEAD_FROM and last - first < 2 * pos.size):  # a dense run in turn
                return self._walked(pos)
            base, stop = first, min(self.sample_count, first + max(READ_AHEAD, last + 1 - first))
            ahead = self._walked(np.arange(base, stop, dtype=np.int64))
            self._ahead = (base, ahead)
        return ahead[(pos - base).reshape(-1)].reshape(pos.shape)

    def _walked(self, pos: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """`indices` of ``pos`` (in range, not empty), computed: the Feistel permutation, walked into range."""
        flat = pos.reshape(-1).astype(np.uint64)
        limit = np.uint64(self.sample_count)
        with np.errstate(over="ignore"):
            result = self._permute(flat)
            # Cycle walking: the domain is a power of two, so re-apply the permutation to whatever
            # lands outside [0, sample_count); following the cycle keeps the mapping a bijection.
            pending = np.flatnonzero(result >= limit)
            while pending.size > FEW:
                walked = self._permute(result[pending])
                result[pending] = walked
                pending = pending[walked >= limit]
            for at in pending.tolist():  # the last few walk on alone, cheaper in plain integers
                result[at] = self._walk_one(self._permute_one(int(result[at])))
        return result.astype(np.int64).reshape(pos.shape)

    def sample_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Like `indices`, but positions past the end wrap around, as padded batches need."""
        pos = _as_positions(positions)
        if pos.size and self.sample_count == 0:
            raise IndexError("positions must be empty when sample_count is 0")
        if pos.size and int(pos.min()) < 0:
            raise IndexError(f"positions must be >= 0, got {pos.min()}")
        return self.indices(pos % self.sample_count if pos.size else pos)

    def sample_at_one(self, position: int) -> int:
        """`sample_at` of a single position in plain integer arithmetic: far cheaper than NumPy for one sample."""
        position = check_int("position", position, 0) % self.sample_count
        return self._walk_one(self._permute_one(position)) if self.shuffle else position

    def _walk_one(self, x: int) -> int:
        """Cycle walking, as `indices` does, of one value of the domain in plain integers."""
        while x >= self.sample_count:
            x = self._permute_one(x)
        return x

    def _permute_one(self, x: int) -> int:
        """`_permute` of one value in plain integers."""
        half_bits, half_mask = int(self._half_bits), int(self._half_mask)
        left, right = x >> half_bits, x & half_mask
        for key in self._keys:
            right, left = left ^ (fmix_int(right ^ int(key)) & half_mask), right
        return (left << half_bits) | right

    def _permute(self, x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """Apply the keyed Feistel bijection of `[0, 2**bits)` to a uint64 array."""
        return feistel(x, self._half_bits, self._half_mask, self._keys)


def _as_positions(positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Return `positions` as an int64 array, rejecting non-integer data."""
    array: npt.NDArray[Any] = np.asarray(positions)
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"positions must be integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _batch_count(remaining: int, local_batch_size: int, world_size: int, drop_last: bool) -> int:
    """Number of global batches that cover `remaining` positions, following DistributedSampler."""
    global_batch_size = local_batch_size * world_size
    if drop_last:
        return remaining // global_batch_size
    padded = -(-remaining // world_size) * world_size
    return -(-padded // global_batch_size)


@dataclass(frozen=True)
class BatchPlan:
    """How the positions `[start, sample_count)` of an epoch are cut into per-rank batches.

    Global batch `b` covers `global_batch_size` consecutive positions and rank `r` takes its `r`-th
    slice. With `drop_last` the incomplete tail is dropped; otherwise the tail is padded by wrapping
    around to a multiple of `world_size` and the last, shorter batch is split evenly between ranks.
    """

    sample_count: int
    local_batch_size: int
    world_size: int
    drop_last: bool
    start: int = 0

    def __post_init__(self) -> None:
        for name, minimum in (("sample_count", 0), ("local_batch_size", 1), ("world_size", 1), ("start", 0)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum))
        object.__setattr__(self, "drop_last", check_bool("drop_last", self.drop_last))
        if self.start > self.sample_count:
            raise ValueError(f"start must be <= sample_count ({self.sample_count}), got {self.start}")

    @property
    def global_batch_size(self) -> int:
        """Positions consumed by one step of all ranks together."""
        return self.local_batch_size * self.world_size

    @property
    def batch_count(self) -> int:
        """Global batches (steps) left in the epoch from `start`."""
        remaining = self.sample_count - self.start
        return _batch_count(remaining, self.local_batch_size, self.world_size, self.drop_last)

    @property
    def full_epoch_batch_count(self) -> int:
        """Global batches in a whole epoch, as if `start` were 0: the loader's length."""
        return _batch_count(self.sample_count, self.local_batch_size, self.world_size, self.drop_last)

    def rank_positions(self, batch: int, rank: int) -> npt.NDArray[np.int64]:
        """Epoch positions that `rank` reads in global batch `batch`; padding lies at >= sample_count."""
        batch = self._check_batch(batch)
        rank = check_int("rank", rank, 0)
        if rank >= self.world_size:
            raise IndexError(f"rank must be < world_size ({self.world_size}), got {rank}")
        first = self.start + batch * self.global_batch_size
        if self.drop_last:
            per_rank = self.local_batch_size
        else:
            end = self.start + -(-(self.sample_count - self.start) // self.world_size) * self.world_size
            per_rank = min(self.global_batch_size, end - first) // self.world_size
        return np.arange(first + rank * per_rank, first + (rank + 1) * per_rank, dtype=np.int64)

    @property
    def full_batch_count(self) -> int:
        """Leading global batches that are full; only the last one may be short (without `drop_last`)."""
        return self.batch_count if self.drop_last else max(self.batch_count - 1, 0)

    def full_rank_positions(self, first: int, stop: int, rank: int) -> npt.NDArray[np.int64]:
        """`rank_positions` of the full batches `first .. stop - 1` at once, one row per batch (vectorised)."""
        if not 0 <= first <= stop <= self.full_batch_count:
            raise IndexError(f"batches {first}..{stop} are not full batches of this plan ({self.full_batch_count})")
        rank = check_int("rank", rank, 0)
        if rank >= self.world_size:
            raise IndexError(f"rank must be < world_size ({self.world_size}), got {rank}")
        starts = (
            self.start + rank * self.local_batch_size + np.arange(first, stop, dtype=np.int64) * self.global_batch_size
        )
        return starts[:, None] + np.arange(self.local_batch_size, dtype=np.int64)

    def batch_end(self, batch: int) -> int:
        """Resume position after global batch `batch`: `sample_count` once the epoch's last batch is done."""
        batch = self._check_batch(batch)
        if batch == self.batch_count - 1:
            return self.sample_count
        return min(self.sample_count, self.start + (batch + 1) * self.global_batch_size)

    def batch_ends(self) -> Iterator[int]:
        """`batch_end` of every batch in turn (where a loader's position is after each), without its checks."""
        last, end, size = self.batch_count - 1, self.start, self.global_batch_size
        for _ in range(last):
            end += size
            yield min(self.sample_count, end)
        if last >= 0:
            yield self.sample_count

    def _check_batch(self, batch: int) -> int:
        """Return `batch` as an int, or raise naming it if it is not a batch of this plan."""
        batch = check_int("batch", batch, 0)
        if batch >= self.batch_count:
            raise IndexError(f"batch must be < batch_count ({self.batch_count}), got {batch}")
        return batch
