"""Which component, and which of its samples, a mixture serves at any global sample index.

Global sample ``g`` lies in block ``b = g // block_size`` at offset ``g % block_size``. The block's
slots hold exactly the stage's counts of each component (see ``schedule``), laid out in a seeded
order of the block; the sample is its component's ``j``-th draw, where ``j`` is the closed-form count
of that component's draws before the block plus those earlier in the block. Draw ``j`` of component
``k`` is position ``j % size_k`` of the component's pass ``j // size_k``, a seeded permutation of its
samples per pass (``_sampling.passes``), so a component smaller than its share cycles and reshuffles. Nothing
here grows with the number of samples: any index costs O(1) plus one block's layout (cached).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from guideloom._mixture.schedule import Schedule
from guideloom._sampling.epoch_order import MASK64, ROUNDS, mix_array, mix_int, round_keys
from guideloom._sampling.passes import permute_many

__all__ = ["MixtureOrder"]

_SLOT_SALT = 0x6D69787475726573  # keys the slot order of blocks apart from the components' passes
_CACHED_BLOCKS = 64

_BlockLayout = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]


class MixtureOrder:
    """The mixture sequence as a pure function of (schedule, component sizes, shuffle, seed, index).

    ``shuffle`` makes each component's passes seeded permutations (else storage order); the slot order
    within a block is always seeded, so components interleave either way.
    """

    def __init__(self, schedule: Schedule, component_sizes: Sequence[int], *, shuffle: bool, seed: int) -> None:
        if len(component_sizes) != len(schedule.names):
            raise ValueError(f"component_sizes must give {len(schedule.names)} sizes, got {len(component_sizes)}")
        used_by_name = [bool(schedule.counts[:, k].any()) for k in range(len(schedule.names))]
        for name, size, used in zip(schedule.names, component_sizes, used_by_name, strict=True):
            if size < 0:
                raise ValueError(f"component {name!r} has a negative size {size}")
            if used and size == 0:
                raise ValueError(f"component {name!r} has no samples, but its weight gives it a share of the mixture")
        self.schedule = schedule
        self.sizes = np.array(component_sizes, np.int64)
        self.shuffle = shuffle
        self.seed = seed
        self._slot_seed = mix_int((seed & MASK64) ^ _SLOT_SALT)
        self.component_seeds = [mix_int((seed & MASK64) ^ mix_int(k + 1)) for k in range(len(component_sizes))]
        self._blocks: OrderedDict[int, _BlockLayout] = OrderedDict()

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_blocks": OrderedDict()}

    @property
    def block_size(self) -> int:
        return self.schedule.block_size

    def layout(self, block: int, counts: npt.NDArray[np.int64]) -> _BlockLayout:
        """For each offset of ``block`` laid out with ``counts``: its component, and its rank among that
        component's samples in the block (0, 1, ... in order of appearance)."""
        components, ranks = self._layouts(np.array([block], np.int64), counts[None, :])
        return components[0], ranks[0]

    def _layouts(self, blocks: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> _BlockLayout:
        """`layout` of each of ``blocks`` (rows) with its row of ``counts``, all evaluated together."""
        size, count = self.block_size, counts.shape[1]
        rows = np.arange(len(blocks), dtype=np.int64)[:, None]
        slots = _slot_orders(self._slot_seed, blocks, size)
        ends = np.cumsum(counts, axis=1)
        if bool((ends[:, -1] == size).all()):  # (as a schedule's counts do) a table of each slot's key, read at once
            owners = np.repeat(np.arange(len(blocks) * count, dtype=np.int64), counts.reshape(-1))
            keys = owners.take((slots + rows * size).reshape(-1))  # row × K + component
        else:  # one search for every row: row r's slots and ends are shifted by r × size (its ends stay sorted)
            shifted_ends = (ends + rows * size).reshape(-1)
            keys = np.searchsorted(shifted_ends, slots + rows * size, side="right").reshape(-1)
        components = keys.reshape(len(blocks), size) - rows * count
        small = len(blocks) * count <= 2**16  # then the stable sort is a radix sort
        order = np.argsort(keys.astype(np.uint16) if small else keys, kind="stable")
        firsts = ((ends - counts) + rows * size).reshape(-1)  # where each (row, component) starts in `order`
        ranks = np.empty(keys.size, np.int64)
        ranks[order] = np.arange(keys.size, dtype=np.int64) - firsts[keys[order]]
        return components, ranks.reshape(len(blocks), size)

    def _layouts_of(self, blocks: npt.NDArray[np.int64]) -> _BlockLayout:
        """`layout` of each of the (unique) ``blocks`` with the counts of the stage in force there; recently
        used blocks are cached, the others evaluated together."""
        missing = [block for block in blocks.tolist() if block not in self._blocks]
        if missing:
            wanted = np.array(missing, np.int64)
            counts = self.schedule.counts[self.schedule.stage_of_blocks(wanted)]
            components, ranks = self._layouts(wanted, counts)
            for row, block in enumerate(missing):
                self._blocks[block] = (components[row], ranks[row])
        layouts = [self._blocks[block] for block in blocks.tolist()]
        for block in blocks.tolist():
            self._blocks.move_to_end(block)
        while len(self._blocks) > max(_CACHED_BLOCKS, len(blocks)):
            self._blocks.popitem(last=False)
        if len(layouts) == 1:
            return layouts[0][0][None, :], layouts[0][1][None, :]
        return np.stack([layout[0] for layout in layouts]), np.stack([layout[1] for layout in layouts])

    def draws(self, global_indices: npt.ArrayLike) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The component of each global index and which of its draws (0, 1, ... since global sample 0) it is."""
        indices = np.asarray(global_indices, np.int64).reshape(-1)
        if not indices.size:
            return indices.copy(), indices.copy()
        if int(indices.min()) < 0:
            raise IndexError(f"global indices must be >= 0, got {indices.min()}")
        blocks, offsets = np.divmod(indices, self.block_size)
        unique_blocks, which = _unique(blocks)
        block_components, block_ranks = self._layouts_of(unique_blocks)
        flat = which * self.block_size + offsets
        components = block_components.reshape(-1)[flat]
        before = self.schedule.draws_before_blocks(unique_blocks)
        return components, before.reshape(-1)[which * before.shape[1] + components] + block_ranks.reshape(-1)[flat]

    def locate(self, global_indices: npt.ArrayLike) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The component of each global index and the index of its sample within that component."""
        components, draws = self.draws(global_indices)
        sizes = self.sizes[components]
        passes, within = np.divmod(draws, np.maximum(sizes, 1))
        if not self.shuffle or within.size == 0:
            return components, within
        count = len(self.sizes)
        keys, which = _unique(passes * count + components)  # one per (pass, component)
        pass_numbers, pass_components = np.divmod(keys, count)
        samples = permute_many(
            within,
            which,
            [int(self.sizes[k]) for k in pass_components.tolist()],
            [self.component_seeds[k] for k in pass_components.tolist()],
            pass_numbers.tolist(),
        )
        return components, samples

    def default_samples_per_epoch(self) -> int:
        """Global samples after which the first component, at the first stage's weights, has served each of
        its samples once: ``len(loader)`` and the epoch counter of a mixture unless the user sets them."""
        share, size = int(self.schedule.counts[0, 0]), int(self.sizes[0])
        if share == 0:
            name = self.schedule.names[0]
            raise ValueError(
                f"samples_per_epoch is required: the first component {name!r} has no share at the first weights"
            )
        full_blocks, last_draw = divmod(size - 1, share)
        components, ranks = self.layout(full_blocks, self.schedule.counts[0])
        offset = int(np.flatnonzero((components == 0) & (ranks == last_draw))[0])
        return full_blocks * self.block_size + offset + 1


def _unique(values: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``np.unique(values, return_inverse=True)`` (inverse flat), by counting when the values span a short range
    (the blocks or passes of a batch of nearby positions), which is cheaper than sorting them."""
    if not values.size:
        return values.copy(), values.copy()
    low = int(values.min())
    span = int(values.max()) - low + 1
    if span > 4 * values.size:
        unique, inverse = np.unique(values, return_inverse=True)
        return unique, inverse.reshape(-1)
    shifted = values - low
    present = np.bincount(shifted, minlength=span) > 0
    return np.flatnonzero(present) + low, (np.cumsum(present) - 1)[shifted]


def _slot_orders(seed: int, blocks: npt.NDArray[np.int64], size: int) -> npt.NDArray[np.int64]:
    """Row ``r``: ``EpochOrder(size, shuffle=True, seed=seed, epoch=blocks[r]).indices(np.arange(size))``, the
    seeded slot order of block ``blocks[r]``, for all rows in one vectorised pass.

    The same Feistel network as `EpochOrder`, but each round's function of the right half is tabulated
    first for every value that half can take (a block's halves are a few bits wide), so a round is a
    look-up and an xor instead of a hash of every slot.
    """
    bits = max(2, (size - 1).bit_length())
    half_bits = (bits + 1) // 2
    shift, mask, half = np.uint64(half_bits), np.uint64((1 << half_bits) - 1), 1 << half_bits
    keys = np.array([round_keys(seed, block) for block in blocks.tolist()], np.uint64).reshape(len(blocks), ROUNDS)
    with np.errstate(over="ignore"):
        tables = mix_array(np.arange(half, dtype=np.uint64)[None, None, :] ^ keys[:, :, None]) & mask
    tables = tables.transpose(1, 0, 2).reshape(ROUNDS, len(blocks) * half)  # round r: block row b's table at b·half
    bases = np.arange(len(blocks), dtype=np.uint64)[:, None] * np.uint64(half)
    x = np.broadcast_to(np.arange(size, dtype=np.uint64), (len(blocks), size))
    result = _tabulated_feistel(x, shift, mask, tables, bases).reshape(-1)
    limit = np.uint64(size)
    pending = np.flatnonzero(result >= limit)  # cycle walking, as EpochOrder does
    while pending.size:
        walked = _tabulated_feistel(result[pending], shift, mask, tables, (pending // size).astype(np.uint64) * half)
        result[pending] = walked
        pending = pending[walked >= limit]
    return result.astype(np.int64).reshape(len(blocks), size)


def _tabulated_feistel(
    x: npt.NDArray[np.uint64],
    shift: np.uint64,
    mask: np.uint64,
    tables: npt.NDArray[np.uint64],
    bases: npt.NDArray[np.uint64],
) -> npt.NDArray[np.uint64]:
    """`feistel` with each round's function read from ``tables[round]`` at ``bases`` + the right half."""
    left, right = x >> shift, x & mask
    for table in tables:
        left, right = right, left ^ table.take((right + bases).view(np.int64))  # (int64 indices: no cast)
    result: npt.NDArray[np.uint64] = (left << shift) | right
    return result
