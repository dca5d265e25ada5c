"""The seeded passes of a mixture's components: many permutations evaluated at once.

A mixture looks up samples of several components, each in its own seeded pass, in one batch, so this
evaluates all of them together, with per-position keys and domains. Each pass of ``count`` samples is
a Feistel network over a mixed-radix domain ``rows × columns`` just above ``count`` (``rows`` near
``sqrt(count)``, see `pass_domain`): a sample index is a (row, column) pair, and each round adds a keyed
hash of one half to the other modulo that half's radix, then swaps them. The domain exceeds ``count``
by less than ``rows`` (often by nothing), so cycle walking (re-applying the network to results past the
end, which keeps the mapping a bijection of ``[0, count)``) is rare, unlike over a power-of-four domain,
which can be nearly four times a component's size."""

from __future__ import annotations

from functools import lru_cache
from math import isqrt

import numpy as np
import numpy.typing as npt

from guideloom._sampling.epoch_order import ROUNDS, fmix_int, mix_array, round_keys

__all__ = ["pass_domain", "permute_many"]

_HIGH = np.uint64(32)
_CANDIDATES = 256  # row counts tried for the tightest domain of a pass
_RADIX_LIMIT = 2**32 - 1  # the round function scales 32-bit hashes, so both radixes stay below 2**32
_SCALAR_WALKS = 8  # positions still walking after the first walk are finished in plain Python
assert ROUNDS % 2 == 0, "an even number of rounds brings the halves back to (row, column)"


@lru_cache(maxsize=256)
def pass_domain(count: int) -> tuple[int, int]:
    """The radixes ``(rows, columns)`` of the Feistel domain of a pass over ``count`` samples: their product
    covers ``count`` with the least excess among up to ``_CANDIDATES`` row counts from ``ceil(sqrt(count))``
    down to ``sqrt(count / 2)`` (often none: cycle walking is then never needed); both stay below 2**32."""
    count = max(count, 1)
    best = isqrt(count - 1) + 1
    best_excess = best * -(-count // best) - count
    lowest = max(2, isqrt(count // 2), -(-count // _RADIX_LIMIT), best - _CANDIDATES)  # columns <= ~2 × rows
    for rows in range(best - 1, lowest - 1, -1):
        if best_excess == 0:
            break
        excess = rows * -(-count // rows) - count
        if excess < best_excess:
            best, best_excess = rows, excess
    return best, -(-count // best)


def permute_many(
    positions: npt.NDArray[np.int64],
    orders: npt.NDArray[np.int64],
    counts: list[int],
    seeds: list[int],
    epochs: list[int],
) -> npt.NDArray[np.int64]:
    """The sample at each position of its order ``o`` (from ``orders``): pass ``epochs[o]`` of a component
    of ``counts[o]`` samples keyed by ``seeds[o]``, a bijection of ``[0, counts[o])``, in one vectorised pass."""
    if len(positions) <= _SCALAR_WALKS:  # a handful (a state's digest): cheaper in plain Python than vectorised
        found = []
        for position, order in zip(positions.tolist(), orders.tolist(), strict=True):
            rows, columns = pass_domain(counts[order])
            order_keys = round_keys(seeds[order], epochs[order])
            value = _scalar_feistel(position, rows, columns, order_keys)
            while value >= counts[order]:
                value = _scalar_feistel(value, rows, columns, order_keys)
            found.append(value)
        return np.array(found, np.int64)
    domains = np.array([pass_domain(count) for count in counts], np.uint64).reshape(len(counts), 2)
    rows, columns = domains[orders, 0], domains[orders, 1]
    keys = np.array([round_keys(seed, epoch) for seed, epoch in zip(seeds, epochs, strict=True)], np.uint64)
    keys = keys.reshape(len(counts), ROUNDS)
    limit = np.array(counts, np.uint64)[orders]
    with np.errstate(over="ignore"):
        if ROUNDS // 2 * int(domains.sum()) <= len(positions):  # the tables are smaller than the work they save
            rounds = _Rounds.tabulated(domains, keys, orders)
        else:
            rounds = _Rounds(keys.T[:, orders], None, None)
        result = _mixed_feistel(positions.astype(np.uint64), rows, columns, rounds)
        pending = np.flatnonzero(result >= limit)  # cycle walking
        while pending.size > _SCALAR_WALKS:
            walked = _mixed_feistel(result[pending], rows[pending], columns[pending], rounds.of(pending))
            result[pending] = walked
            pending = pending[walked >= limit[pending]]
    for where in pending.tolist():  # a few stragglers: cheaper one by one than another vectorised round trip
        value, order = int(result[where]), int(orders[where])
        order_keys = [int(key) for key in keys[order].tolist()]
        while value >= counts[order]:
            value = _scalar_feistel(value, int(rows[where]), int(columns[where]), order_keys)
        result[where] = value
    return result.astype(np.int64)


_U64 = npt.NDArray[np.uint64]


class _Rounds:
    """The round functions of each element's pass: round ``r`` maps the right half ``b`` to the high 32 bits
    of a keyed hash of ``b``, scaled into the left half's radix. Either hashed per element (``keys``, one row
    per round), or read from ``tables`` (one per round, every order's values for each ``b`` it can take, from
    the element's offset in ``bases``, one row per parity of ``r``): the same values, at lower cost when the
    halves are narrow and the elements many."""

    def __init__(self, keys: _U64 | None, tables: list[_U64] | None, bases: _U64 | None) -> None:
        self.keys, self.tables, self.bases = keys, tables, bases

    @classmethod
    def tabulated(cls, domains: _U64, keys: _U64, orders: npt.NDArray[np.int64]) -> _Rounds:
        """Tables of every order's round functions (``domains``: its rows and columns; ``keys``: its round keys)."""
        tables: list[_U64] = [np.empty(0, np.uint64)] * ROUNDS
        bases = np.empty((2, len(orders)), np.uint64)
        for parity in (0, 1):  # even rounds read the column (add to the row), odd ones the reverse
            inputs, outputs = domains[:, 1 - parity], domains[:, parity]
            starts = np.cumsum(inputs) - inputs
            owners = np.repeat(np.arange(len(domains)), inputs.astype(np.int64))
            values = np.arange(len(owners), dtype=np.uint64) - starts[owners]
            hashed = mix_array(values[None, :] ^ keys[owners, parity::2].T)
            scaled = ((hashed >> _HIGH) * outputs[owners]) >> _HIGH
            tables[parity::2] = list(scaled)
            bases[parity] = starts[orders]
        return cls(None, tables, bases)

    def of(self, where: npt.NDArray[np.int64]) -> _Rounds:
        """These round functions for the elements at ``where`` only."""
        if self.keys is not None:
            return _Rounds(self.keys[:, where], None, None)
        assert self.bases is not None
        return _Rounds(None, self.tables, self.bases[:, where])

    def value(self, round_number: int, right: _U64, radix: _U64) -> _U64:
        """Round ``round_number``'s function of each element's right half, in ``[0, radix)``."""
        if self.tables is not None and self.bases is not None:
            where = (right + self.bases[round_number % 2]).view(np.int64)  # int64 indices: no cast
            looked_up: _U64 = self.tables[round_number].take(where)
            return looked_up
        assert self.keys is not None
        hashed = mix_array(right ^ self.keys[round_number])
        scaled: _U64 = ((hashed >> _HIGH) * radix) >> _HIGH
        return scaled


def _mixed_feistel(x: _U64, rows: _U64, columns: _U64, rounds: _Rounds) -> _U64:
    """The keyed Feistel bijection of ``[0, rows × columns)`` on each element (wrapping arithmetic): each
    round maps ``(a, b)`` in ``Z_m × Z_n`` to ``(b, (a + F(b)) mod m)`` in ``Z_n × Z_m``, where ``F`` (see
    `_Rounds`) scales the high 32 bits of a keyed hash of ``b`` into ``[0, m)`` (a multiply and a shift)."""
    left, right = np.divmod(x, columns)
    left_radix, right_radix = rows, columns
    for round_number in range(ROUNDS):
        summed = left + rounds.value(round_number, right, left_radix)
        left, right = right, np.minimum(summed, summed - left_radix)  # mod: past the radix, the wrap is larger
        left_radix, right_radix = right_radix, left_radix
    result: _U64 = left * columns + right
    return result


def _scalar_feistel(x: int, rows: int, columns: int, keys: list[int]) -> int:
    """`_mixed_feistel` of one value, on Python ints."""
    left, right = divmod(x, columns)
    left_radix, right_radix = rows, columns
    for key in keys:
        hashed = fmix_int(right ^ key)
        left, right = right, (left + (((hashed >> 32) * left_radix) >> 32)) % left_radix
        left_radix, right_radix = right_radix, left_radix
    return left * columns + right
