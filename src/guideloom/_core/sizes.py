"""Sizes users give as text or bytes: ``"256MiB"``, ``"500MB"``, ``4096``."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    **{prefix: 1 << (10 * power) for power, prefix in enumerate("kmgt", 1)},
    **{f"{prefix}ib": 1 << (10 * power) for power, prefix in enumerate("kmgt", 1)},
    **{f"{prefix}b": 1000**power for power, prefix in enumerate("kmgt", 1)},
}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)")


def parse_shard_size(value: object, name: str) -> int:
    """A shard size in bytes: a positive int, or a string such as ``"64MiB"``, ``"1GiB"``, ``"500MB"``, ``"4096"``.

    ``K``/``M``/``G``/``T`` and ``KiB``... are powers of 1024, ``KB``/``MB``... powers of 1000.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{name} must be an int (bytes) or a string such as '256MiB', got {type(value).__name__}")
    if isinstance(value, str):
        match = _SIZE.fullmatch(value.strip().lower())
        if match is None or match.group(2) not in _UNITS:
            raise ValueError(f"{name} must be a size such as 256MiB, 1GiB, 500MB or a number of bytes, got {value!r}")
        size = int(float(match.group(1)) * _UNITS[match.group(2)])
    else:
        size = value
    if size < 1:
        raise ValueError(f"{name} must be at least 1 byte, got {value!r}")
    return size
