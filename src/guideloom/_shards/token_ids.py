"""Token ids as users give them: the token dtypes, and one document's ids checked and laid out as stored.

Lists, NumPy arrays and tensors are accepted; an id the storage's dtype cannot hold is an error,
never wrapped or truncated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from guideloom._core.checks import check_choice
from guideloom._shards.header import TOKEN_DTYPES

TokenInput = Any  # list of ints, a 1-D integer NumPy array or a 1-D integer tensor


class TokenEncoder:
    """One document's token ids as the bytes a shard stores (little-endian ``dtype``) and their count."""

    def __init__(self, dtype: object = None) -> None:
        self.dtype = token_dtype("uint32" if dtype is None else dtype).newbyteorder("=")
        self.stored_dtype = self.dtype.newbyteorder("<")
        self._limits = np.iinfo(self.dtype)

    def __call__(self, tokens: TokenInput) -> tuple[memoryview, int]:
        if type(tokens) is np.ndarray and tokens.dtype == self.stored_dtype and tokens.ndim == 1:
            if tokens.flags.c_contiguous:  # the common case, already as stored: no conversion, no copy
                return memoryview(tokens.data).cast("B"), tokens.size
        array = token_array(tokens)
        if array.size and not np.can_cast(array.dtype, self.dtype, "safe"):  # else every id fits
            low, high = int(array.min()), int(array.max())
            if low < self._limits.min or high > self._limits.max:
                bad = low if low < self._limits.min else high
                raise ValueError(f"token id {bad} does not fit the storage dtype {self.dtype}")
        stored = np.ascontiguousarray(array, dtype=self.stored_dtype)
        return memoryview(stored.data).cast("B"), stored.size


def token_dtype(dtype: object) -> np.dtype[Any]:
    """``dtype`` (a name, NumPy dtype or type) as one of the token dtypes; else an error listing them.

    As in NumPy, what is no dtype at all (a misspelt name too) is a TypeError; another dtype a ValueError.
    """
    try:
        name = np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"dtype must be one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}") from None
    return np.dtype(check_choice("dtype", name, TOKEN_DTYPES))


def token_array(tokens: TokenInput) -> np.ndarray:
    """One document's token ids as a 1-D integer array, without wrapping or truncating."""
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, np.ndarray):
        array = tokens
    elif isinstance(tokens, list | tuple | range):
        array = _list_array(tokens)
    else:
        raise TypeError(f"tokens must be a list, NumPy array or tensor of ints, got {type(tokens).__name__}")
    if array.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise TypeError(f"tokens must be integers, got dtype {array.dtype}")
    return array


def _list_array(tokens: list[Any] | tuple[Any, ...] | range) -> np.ndarray:
    """A list of Python ints as int64, or uint64 when ids need it; never float or wrapped."""
    if not len(tokens):
        return np.empty(0, np.int64)
    try:
        array = np.asarray(tokens)
    except (TypeError, ValueError, OverflowError):
        array = np.empty(0, object)
    if array.dtype.kind in "iu" and array.ndim == 1:
        return array
    if not all(isinstance(token, int | np.integer) and not isinstance(token, bool) for token in tokens):
        raise TypeError("tokens must be integers")
    low, high = min(tokens), max(tokens)
    if low < 0 or high >= 2**64:
        raise ValueError(f"token id {low if low < 0 else high} does not fit any token dtype")
    return np.asarray(tokens, dtype=np.uint64)
