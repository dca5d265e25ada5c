"""`EpochOrder.indices` for many orders at once: each position with its own sample count, seed and epoch.

A mixture looks up samples of several components, each in its own seeded pass, in one batch. Running
one `EpochOrder` per (component, pass) costs a round of NumPy calls per order (and a small component
may be in dozens of passes within one batch); this evaluates the same Feistel network for all of them
together, with per-position keys, half widths and limits. The result equals `EpochOrder.indices`
element by element (the tests check it).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from guideloom._order import ROUNDS, feistel, round_keys

__all__ = ["permute_many"]


def permute_many(
    positions: npt.NDArray[np.int64],
    orders: npt.NDArray[np.int64],
    counts: list[int],
    seeds: list[int],
    epochs: list[int],
) -> npt.NDArray[np.int64]:
    """``EpochOrder(counts[o], shuffle=True, seed=seeds[o], epoch=epochs[o]).indices(position)`` for each
    position and its order number ``o`` (from ``orders``), in one vectorised pass."""
    sizes = np.array(counts, np.uint64)
    bits = np.array([max(2, (count - 1).bit_length()) for count in counts], np.uint64)
    half_bits = ((bits + np.uint64(1)) // np.uint64(2))[orders]
    half_mask = (np.uint64(1) << half_bits) - np.uint64(1)
    keys = np.array([round_keys(seed, epoch) for seed, epoch in zip(seeds, epochs, strict=True)], np.uint64)
    keys = keys.reshape(len(counts), ROUNDS).T[:, orders]
    limit = sizes[orders]
    with np.errstate(over="ignore"):
        result = feistel(positions.astype(np.uint64), half_bits, half_mask, keys)
        pending = np.flatnonzero(result >= limit)  # cycle walking, as EpochOrder does
        while pending.size:
            walked = feistel(result[pending], half_bits[pending], half_mask[pending], keys[:, pending])
            result[pending] = walked
            pending = pending[walked >= limit[pending]]
    return result.astype(np.int64)
