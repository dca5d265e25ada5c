"""The seeded passes of a mixture's components: many permutations evaluated at once.

A mixture looks up samples of several components, each in its own seeded pass, in one batch, so this
evaluates all of them together, with per-position keys and domains. Each pass of ``count`` samples is
a Feistel network over the mixed-radix domain ``rows × columns`` (``rows = ceil(sqrt(count))``,
``columns = ceil(count / rows)``): a sample index is a (row, column) pair, and each round adds a keyed
hash of one half to the other modulo that half's radix, then swaps them. The domain exceeds ``count``
by less than ``rows``, so cycle walking (re-applying the network to results past the end, which keeps
the mapping a bijection of ``[0, count)``) almost never takes a second step, unlike a power-of-four
domain, which can be nearly four times a component's size.
"""

from __future__ import annotations

from math import isqrt

import numpy as np
import numpy.typing as npt

from guideloom._order import ROUNDS, _mix_array, round_keys

__all__ = ["pass_domain", "permute_many"]

_HIGH = np.uint64(32)
assert ROUNDS % 2 == 0, "an even number of rounds brings the halves back to (row, column)"


def pass_domain(count: int) -> tuple[int, int]:
    """The radixes ``(rows, columns)`` of the Feistel domain of a pass over ``count`` samples: their
    product covers ``count`` and exceeds it by less than ``rows``; both stay below 2**32 for int64 counts."""
    rows = isqrt(max(count, 1) - 1) + 1
    return rows, -(-max(count, 1) // rows)


def permute_many(
    positions: npt.NDArray[np.int64],
    orders: npt.NDArray[np.int64],
    counts: list[int],
    seeds: list[int],
    epochs: list[int],
) -> npt.NDArray[np.int64]:
    """The sample at each position of its order ``o`` (from ``orders``): pass ``epochs[o]`` of a component
    of ``counts[o]`` samples keyed by ``seeds[o]``, a bijection of ``[0, counts[o])``, in one vectorised pass."""
    domains = np.array([pass_domain(count) for count in counts], np.uint64).reshape(len(counts), 2)
    rows, columns = domains[orders, 0], domains[orders, 1]
    keys = np.array([round_keys(seed, epoch) for seed, epoch in zip(seeds, epochs, strict=True)], np.uint64)
    keys = keys.reshape(len(counts), ROUNDS).T[:, orders]
    limit = np.array(counts, np.uint64)[orders]
    with np.errstate(over="ignore"):
        result = _mixed_feistel(positions.astype(np.uint64), rows, columns, keys)
        pending = np.flatnonzero(result >= limit)  # cycle walking
        while pending.size:
            walked = _mixed_feistel(result[pending], rows[pending], columns[pending], keys[:, pending])
            result[pending] = walked
            pending = pending[walked >= limit[pending]]
    return result.astype(np.int64)


_U64 = npt.NDArray[np.uint64]


def _mixed_feistel(x: _U64, rows: _U64, columns: _U64, keys: _U64) -> _U64:
    """The keyed Feistel bijection of ``[0, rows × columns)`` on each element (wrapping arithmetic): each
    round maps ``(a, b)`` in ``Z_m × Z_n`` to ``(b, (a + F(b)) mod m)`` in ``Z_n × Z_m``, where ``F`` scales
    the high 32 bits of a keyed hash of ``b`` into ``[0, m)`` (a multiply and a shift, no division)."""
    left, right = np.divmod(x, columns)
    left_radix, right_radix = rows, columns
    for key in keys:
        hashed = _mix_array(right ^ key)
        summed = left + (((hashed >> _HIGH) * left_radix) >> _HIGH)
        left, right = right, np.minimum(summed, summed - left_radix)  # mod: past the radix, the wrap is larger
        left_radix, right_radix = right_radix, left_radix
    result: _U64 = left * columns + right
    return result
