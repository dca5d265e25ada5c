"""The one shard-name pattern: a committed shard is the file (or object) ``<12-digit id>.shard`` in ``shards/``."""

from __future__ import annotations

import re

import numpy as np

from guideloom._core.checks import check_int

SHARD_SUFFIX = ".shard"
MAX_SHARD_ID = 10**12 - 1
SHARD_NAME_LENGTH = 12 + len(SHARD_SUFFIX)
# fullmatch, ASCII digits only: "\d" would take other scripts' digits and "$" a trailing newline,
# so one shard could be listed twice under two names.
SHARD_NAME = re.compile(r"([0-9]{12})\.shard")
_UNFINISHED = re.compile(SHARD_NAME.pattern + r"\..+")  # a writer's file of a shard being built
_DIGITS = 10 ** np.arange(11, -1, -1, dtype=np.int64)


def shard_file_name(shard: int) -> str:
    return f"{shard:012d}{SHARD_SUFFIX}"


def check_shard_id(shard: object) -> int:
    """Validate a caller's shard id: a non-negative int below 10**12."""
    return check_int("shard", shard, minimum=0, maximum=MAX_SHARD_ID)


def shard_id_of(name: str) -> int | None:
    """The id of the shard named ``name``; None for a name that is no shard's."""
    match = SHARD_NAME.fullmatch(name)
    return None if match is None else int(match.group(1))


def unfinished_shard_id(name: str) -> int | None:
    """The id of the shard whose unfinished file (``<shard name>.<anything>``) is ``name``; None for other names."""
    match = _UNFINISHED.fullmatch(name)
    return None if match is None else int(match.group(1))


def shard_ids_among(names: list[str]) -> np.ndarray:
    """Ids of the shard names among ``names``, ascending (int64), parsed as whole arrays."""
    joined = "".join(names)
    width = SHARD_NAME_LENGTH
    candidates = names if len(joined) == width * len(names) else [name for name in names if len(name) == width]
    encoded = (joined if candidates is names else "".join(candidates)).encode("utf-8", "surrogateescape")
    if len(encoded) != width * len(candidates):  # a name with non-ASCII characters: the careful way
        return np.asarray(sorted(int(name[:12]) for name in candidates if SHARD_NAME.fullmatch(name)), np.int64)
    characters = np.frombuffer(encoded, np.uint8).reshape(-1, width)
    digits = characters[:, :12]
    valid = ((digits >= ord("0")) & (digits <= ord("9"))).all(axis=1)
    valid &= (characters[:, 12:] == np.frombuffer(SHARD_SUFFIX.encode(), np.uint8)).all(axis=1)
    ids: np.ndarray = (digits[valid].astype(np.int64) - ord("0")) @ _DIGITS
    ids.sort()
    return ids
