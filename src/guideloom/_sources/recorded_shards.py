"""What a loader state records about a set of shards, so that it survives shards being added.

A state records shard ids as ranges (``"0-99, 105"``) and a three-number digest of the shards'
contents: ``A = Σ h``, ``B = Σ key·h``, ``C = Σ key²·h`` modulo a prime, where ``h`` hashes a shard's
record count and checksum and ``key`` identifies the shard. The digest stays a few dozen bytes however
many shards there are, and yet, when exactly one shard was rewritten, it names that shard: the
differences satisfy ``ΔB = key·ΔA`` and ``ΔC = key²·ΔA``, so ``key = ΔB / ΔA``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from guideloom._core.errors import StateMismatchError

__all__ = [
    "CONTENT_KEYS",
    "LOCATION_KEYS",
    "SHARD_KEYS",
    "ShardSetDigest",
    "cut_settings",
    "describe_shards",
    "over_recorded_shards",
    "parse_ranges",
    "recorded_shards",
]

# The keys of a source's identity (what a state records of it) that say where its storages are, and which
# shards they hold; the other keys say how samples are cut (the kind and the window mode's settings).
LOCATION_KEYS = ("path", "storages")  # a storage moved since still serves the state's batches
CONTENT_KEYS = ("fingerprint", "digest")  # what the shards hold (resuming compares them apart)
SHARD_KEYS = ("path", "shards", *CONTENT_KEYS)  # one storage's shards, and where they are


def cut_settings(identity: dict[str, Any]) -> dict[str, Any]:
    """A storage source's identity but for its kind and its shards: the settings that say how samples are cut."""
    return {key: value for key, value in identity.items() if key not in ("kind", *SHARD_KEYS)}


PRIME = (1 << 61) - 1  # a Mersenne prime: every nonzero difference has an inverse
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


_LOW32 = np.uint64(0xFFFFFFFF)
_LOW29 = np.uint64((1 << 29) - 1)
_P = np.uint64(PRIME)
_CHUNK = 8192


def _hashes(keys: np.ndarray, record_counts: np.ndarray, checksums: np.ndarray) -> np.ndarray:
    """A well-mixed nonzero number below PRIME for each shard's key, record count and checksum (uint64)."""
    with np.errstate(over="ignore"):
        x = (keys * np.uint64(0x9E3779B97F4A7C15)) ^ (record_counts * np.uint64(0xC2B2AE3D27D4EB4F)) ^ checksums
        for multiplier in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB):
            x = (x ^ (x >> np.uint64(31))) * np.uint64(multiplier)
    hashes: np.ndarray = x % np.uint64(PRIME - 1) + np.uint64(1)
    return hashes


def _reduce(x: np.ndarray) -> np.ndarray:
    """``x mod PRIME`` for ``x < 2**63`` (2**61 is 1 modulo the Mersenne prime)."""
    x = (x & _P) + (x >> np.uint64(61))
    return np.where(x >= _P, x - _P, x)


def _mulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a·b mod PRIME`` for uint64 ``a, b < PRIME``, in 32-bit halves so that nothing overflows."""
    with np.errstate(over="ignore"):
        a0, a1, b0, b1 = a & _LOW32, a >> np.uint64(32), b & _LOW32, b >> np.uint64(32)
        low, middle, high = a0 * b0, a0 * b1 + a1 * b0, a1 * b1  # a·b = high·2**64 + middle·2**32 + low
        total = (
            (high << np.uint64(3))  # 2**64 = 8 mod PRIME
            + ((middle & _LOW29) << np.uint64(32))
            + (middle >> np.uint64(29))  # its bits from 2**61 up: 2**61 = 1 mod PRIME
            + (low & _P)
            + (low >> np.uint64(61))
        )
    return _reduce(total)


def _summed(values: np.ndarray) -> int:
    """The sum of values below PRIME, modulo PRIME (in 32-bit halves: exact for up to 2**32 of them)."""
    high = int((values >> np.uint64(32)).sum(dtype=np.uint64))
    low = int((values & _LOW32).sum(dtype=np.uint64))
    return ((high << 32) + low) % PRIME


def _chunk_sums(keys: np.ndarray, record_counts: np.ndarray, checksums: np.ndarray) -> tuple[int, int, int]:
    """``Σ h``, ``Σ key·h`` and ``Σ key²·h`` modulo PRIME over one chunk of shards (uint64 arrays)."""
    h = _hashes(keys, record_counts, checksums)
    keys = _reduce(keys) if not len(keys) or int(keys.max()) < 1 << 63 else keys % _P
    keyed = _mulmod(keys, h)
    return _summed(h), _summed(keyed), _summed(_mulmod(keys, keyed))


@dataclass(frozen=True)
class ShardSetDigest:
    """The three sums over ``(key, record_count, checksum)`` of a set of shards (see the module docstring)."""

    a: int = 0
    b: int = 0
    c: int = 0

    @classmethod
    def of(cls, shards: Iterable[tuple[int, int, int]]) -> ShardSetDigest:
        entries = np.array(list(shards), np.uint64).reshape(-1, 3)
        return cls.of_arrays(entries[:, 0], entries[:, 1], entries[:, 2])

    @classmethod
    def of_arrays(cls, keys: np.ndarray, record_counts: np.ndarray, checksums: np.ndarray) -> ShardSetDigest:
        """The digest of the shards with these keys, record counts and checksums (one array each, in one pass)."""
        keys, record_counts, checksums = (np.asarray(array) for array in (keys, record_counts, checksums))
        sums = [0, 0, 0]
        for start in range(0, len(keys), _CHUNK):  # a chunk at a time: the temporaries stay in the caches
            chunk = (array[start : start + _CHUNK].astype(np.uint64) for array in (keys, record_counts, checksums))
            for position, total in enumerate(_chunk_sums(*chunk)):
                sums[position] += total
        return cls(*(total % PRIME for total in sums))

    def to_text(self) -> str:
        return f"{self.a:016x}.{self.b:016x}.{self.c:016x}"

    @classmethod
    def from_text(cls, text: object) -> ShardSetDigest:
        """The digest a state recorded; StateMismatchError if it is not one."""
        try:
            assert isinstance(text, str)
            a, b, c = (int(part, 16) for part in text.split("."))
        except (AssertionError, ValueError):
            raise StateMismatchError(f"the state's shard digest {text!r} is not one guideloom writes") from None
        return cls(a, b, c)

    def changed_key(self, now: ShardSetDigest) -> int | None:
        """The key of the one shard whose contents differ between ``self`` (then) and ``now``, if exactly one does.

        ``None`` when the digests agree, or when the differences are not those of a single shard.
        """
        da, db, dc = ((x - y) % PRIME for x, y in ((now.a, self.a), (now.b, self.b), (now.c, self.c)))
        if da == 0:
            return None
        key = db * pow(da, PRIME - 2, PRIME) % PRIME
        return key if key * key % PRIME * da % PRIME == dc else None


def describe_shards(shard_ids: list[int] | np.ndarray) -> str:
    """Shard ids (ascending, each once) as ranges, e.g. ``0-2, 5, 7-9`` (short for the contiguous ids writers
    usually make)."""
    ids = np.asarray(shard_ids, np.int64)
    if not len(ids):
        return "none"
    if int(ids[-1]) - int(ids[0]) == len(ids) - 1:  # ascending distinct ids spanning only their count: one range
        firsts, lasts = [int(ids[0])], [int(ids[-1])]
    else:
        breaks = np.flatnonzero(np.diff(ids) != 1)
        firsts = ids[np.concatenate([[0], breaks + 1])].tolist()
        lasts = ids[np.concatenate([breaks, [len(ids) - 1]])].tolist()
    return ", ".join(
        str(first) if first == last else f"{first}-{last}" for first, last in zip(firsts, lasts, strict=True)
    )


def parse_ranges(text: object) -> list[tuple[int, int]]:
    """The ``(first, last)`` ranges of a state's shard ids (``"0-2, 5"``); else StateMismatchError."""
    if not isinstance(text, str):
        raise StateMismatchError(f"the state's shard ranges must be a string, got {text!r}")
    ranges: list[tuple[int, int]] = []
    if text == "none":
        return ranges
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        match = _RANGE.match(part)
        if match is None:
            raise StateMismatchError(f"the state's shard ranges {text!r} are not ids like '0-9, 12'")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first or (ranges and first <= ranges[-1][1]):
            raise StateMismatchError(f"the state's shard ranges {text!r} are not ascending ranges")
        ranges.append((first, last))
    return ranges


def recorded_shards(ranges: list[tuple[int, int]], committed: list[int], storage: object) -> list[int]:
    """The ids of ``ranges``, all of which must be among the ``committed`` shard ids of ``storage``.

    A missing shard is a StateMismatchError naming it. Never builds more ids than are committed, so a
    crafted state cannot make it allocate much.
    """
    ids = np.asarray(committed, np.int64)
    chosen: list[int] = []
    for first, last in ranges:
        low, high = np.searchsorted(ids, [first, last + 1]).tolist()
        if high - low != last - first + 1:
            present = set(ids[low:high].tolist())
            missing = next(shard for shard in range(first, last + 1) if shard not in present)
            raise StateMismatchError(
                f"shard {missing} of {storage}, which the state read, is missing: a checkpoint survives shards "
                "being added, not removed"
            )
        chosen.extend(ids[low:high].tolist())
    return chosen


def over_recorded_shards(source: Any, recorded: dict[str, Any]) -> Any:
    """``source`` (a storage's pinned shards) over the shards a state recorded, which must all be unchanged.

    Shards committed since the state was taken are left out (they join at the next epoch); a recorded
    shard that is missing or was rewritten is a StateMismatchError that names it.
    """
    where = f"the storage at {source.storage.location}"
    ranges = parse_ranges(recorded.get("shards"))
    if recorded.get("path") != source.storage.location:  # moved, or another storage: say which, not "removed"
        try:
            recorded_shards(ranges, source.shard_ids, where)
        except StateMismatchError:
            raise StateMismatchError(
                f"the state was taken from another storage: it read shards {recorded.get('shards')} of the storage "
                f"at {recorded.get('path')}, but {where} has shards {describe_shards(source.shard_ids)}"
            ) from None
    shards = recorded_shards(ranges, source.shard_ids, where)
    then = source if shards == source.shard_ids else source.with_shards(shards)
    if "digest" in recorded:
        changed = ShardSetDigest.from_text(recorded["digest"]).changed_key(
            ShardSetDigest.of_arrays(*then.shard_entries())
        )
        if changed is not None:
            raise StateMismatchError(f"shard {changed} of {where} changed since the state was taken (rewritten)")
    if not then.has_fingerprint(recorded.get("fingerprint")):
        raise StateMismatchError(f"the state was taken from another storage: {then.difference(recorded)}")
    return then
