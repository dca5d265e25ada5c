"""Record lengths: a document's cost (tokens, or any unit its format counts) stored per record beside its offsets.

A format that defines ``length(data)`` has the writer record that number for every record; such a
storage's header says ``"record_lengths": true`` and each of its shards holds, right after the record
offsets, ``record_count`` little-endian int64 lengths (footer flag 2). The data checksum covers them
after the data, so ``verify`` catches a changed length and the storage's fingerprint changes with one.
Planners read them mapped, without decoding a record. Shards without them (every token storage, a
document storage whose format has no ``length``, storages of guideloom 0.3) give each record's size in
elements instead: bytes for documents, tokens for token storages.
"""

from __future__ import annotations

import numpy as np

RECORD_LENGTHS_FLAG = 2  # the footer flag of a shard that holds a length per record
MAX_LENGTH = 2**63 - 1


def defines_length(document_format: object) -> bool:
    """Whether a format measures its records: it has a callable ``length``."""
    return callable(getattr(document_format, "length", None))


def checked_length(value: object, what: str) -> int:
    """A length a format returned for ``what`` (a record, named in errors): a non-negative int, or an error."""
    if type(value) is int and 0 <= value <= MAX_LENGTH:  # the usual case, checked first: once per record
        return value
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"length() must return an int for {what}, got {type(value).__name__}")
    length = int(value)
    if not 0 <= length <= MAX_LENGTH:
        raise ValueError(f"length() must return a length from 0 to 2**63 - 1 for {what}, got {length}")
    return length


def lengths_bytes(lengths: list[int]) -> bytes:
    """A shard's lengths section: the lengths as little-endian int64."""
    return np.asarray(lengths, dtype="<i8").tobytes()


def lengths_problem(lengths: np.ndarray) -> str | None:
    """What is wrong with a shard's stored lengths (a negative one), or None."""
    negative = np.flatnonzero(lengths < 0)
    return f"record {int(negative[0])} has a negative length" if negative.size else None


def sizes_as_lengths(offsets: np.ndarray) -> np.ndarray:
    """The lengths of records that store none: their sizes in elements (bytes or tokens), read-only int64."""
    sizes: np.ndarray = np.diff(offsets.astype(np.int64))
    sizes.flags.writeable = False
    return sizes
