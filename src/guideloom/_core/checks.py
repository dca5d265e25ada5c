"""Argument checks with one rule: a wrong type is a ``TypeError``, a wrong value a ``ValueError``.

Every message names the argument, so a user sees at once which one to fix.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int; a bool, float or anything else is a TypeError, one out of range a ValueError."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_seed(value: object) -> int:
    """``seed`` as an int in [0, 2**64): the orders are keyed by 64 bits, so a larger or negative seed would silently
    read the order of another one (2**64 that of 0, -1 that of 2**64 - 1)."""
    seed = check_int("seed", value)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed}")
    return seed


def check_bool(name: str, value: object) -> bool:
    """``value`` as a bool; anything else (even 0 or 1) is a TypeError."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_number(name: str, value: object, minimum: float | None = None, finite: bool = False) -> float:
    """``value`` as a float (an int or float, not a bool); one below ``minimum`` is a ValueError, as is NaN
    (and an infinity when ``finite``)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if value != value or (finite and value in (math.inf, -math.inf)):
        raise ValueError(f"{name} must be a {'finite ' if finite else ''}number, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return float(value)


def check_callable(name: str, value: Any, optional: bool = False) -> Any:
    """``value`` if it is callable (or None when ``optional``); anything else is a TypeError."""
    if value is None and optional:
        return None
    if not callable(value):
        expected = "callable or None" if optional else "callable"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    return value


def check_path(name: str, value: object) -> Path:
    """``value`` as a Path; anything but a str or os.PathLike is a TypeError, an empty path a ValueError.

    An empty string would otherwise become ``Path(".")``: the current directory, which nobody meant.
    """
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(value).__name__}")
    if os.fspath(value) in ("", b""):
        raise ValueError(f"{name} must not be empty")
    return Path(value)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``: another str is a ValueError, another type a TypeError (both list them)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_sequence_length(value: object) -> int:
    """A token window's length: an int >= 1."""
    return check_int("sequence_length", value, minimum=1)
