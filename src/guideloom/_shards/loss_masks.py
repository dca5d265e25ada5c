"""Loss masks of token storages: one bit per token, stored in each shard beside its tokens.

A masked shard holds, after its record offsets, the mask of its tokens packed eight to a byte in
little bit order (token ``k`` is bit ``k % 8`` of byte ``k // 8``; 1: the token counts toward the
loss), padded to 8 bytes. Its footer's data checksum covers the tokens and then these bytes, so a
flipped mask bit fails ``verify`` and changes the storage's fingerprint as a changed token does.
Readers unpack the bits of the range they need (a copy of one byte per token, made from an eighth
of that); nothing is unpacked ahead.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

LOSS_MASK_FLAG = 1  # the footer flag of a shard that holds a loss mask
_POPCOUNT = np.array([bin(byte).count("1") for byte in range(256)], np.int64)


def mask_size(token_count: int) -> int:
    """Bytes of the packed mask of ``token_count`` tokens (before the padding to 8 bytes)."""
    return (token_count + 7) // 8


def padded_mask_size(token_count: int) -> int:
    """Bytes the mask of ``token_count`` tokens takes in a shard, with its padding to 8 bytes."""
    return (mask_size(token_count) + 7) // 8 * 8


def loss_mask_array(mask: object, length: int) -> np.ndarray:
    """A user's mask for ``length`` tokens as a 1-D bool array: bools or 0/1 integers, same length, or an error.

    The message names ``loss_mask``: a wrong type is a TypeError, a wrong length or value a ValueError.
    """
    if hasattr(mask, "detach") and hasattr(mask, "cpu"):
        mask = mask.detach().cpu().numpy()
    if isinstance(mask, list | tuple | range):
        if not all(isinstance(value, bool | int | np.bool_ | np.integer) for value in mask):
            raise TypeError("loss_mask must hold bools or 0/1 integers")
        mask = np.asarray(mask, dtype=np.int64) if len(mask) else np.empty(0, bool)
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"loss_mask must be a list, NumPy array or tensor of bools or 0/1, got {type(mask).__name__}")
    if mask.ndim != 1:
        raise ValueError(f"loss_mask must be one-dimensional, got shape {mask.shape}")
    if len(mask) != length:
        raise ValueError(f"loss_mask has {len(mask)} values, but the document has {length} tokens: give one per token")
    if mask.dtype == np.bool_:
        return mask
    if mask.dtype.kind not in "iu":
        raise TypeError(f"loss_mask must hold bools or 0/1 integers, got dtype {mask.dtype}")
    if len(mask) and (int(mask.min()) < 0 or int(mask.max()) > 1):
        bad = int(mask.min()) if int(mask.min()) < 0 else int(mask.max())
        raise ValueError(f"loss_mask must hold only 0 and 1 (or bools), got {bad}")
    return mask.astype(np.bool_)


class MaskBits:
    """The packed mask of a shard being written, grown one document at a time (an eighth of a byte per token)."""

    def __init__(self) -> None:
        self._packed = bytearray()
        self._tail = np.empty(0, np.bool_)  # the last < 8 values, not yet a whole byte

    def append(self, mask: np.ndarray) -> None:
        if len(self._tail):
            mask = np.concatenate([self._tail, mask])
        whole = len(mask) - len(mask) % 8
        self._packed += np.packbits(mask[:whole], bitorder="little").tobytes()
        self._tail = mask[whole:].copy()

    def finish(self) -> bytes:
        """The packed bytes; the unused bits of the last byte are zero."""
        return bytes(self._packed) + np.packbits(self._tail, bitorder="little").tobytes()


def unpack_bits(bits: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Mask values ``[start, stop)`` of the packed ``bits`` (uint8, little bit order) as a bool array."""
    skip = start & 7
    unpacked = np.unpackbits(bits[start >> 3 : (stop + 7) >> 3], count=skip + stop - start, bitorder="little")
    return unpacked[skip:].view(np.bool_)


def counted_tokens(bits: np.ndarray, chunk: int = 1 << 20) -> int:
    """How many values of the packed ``bits`` are 1 (the padding bits are 0), counted ``chunk`` bytes at a time."""
    return sum(int(_POPCOUNT[bits[start : start + chunk]].sum()) for start in range(0, len(bits), chunk))


class MaskedStream(Protocol):
    """What a reader of a masked token storage offers: its stream's shards and their mask bits."""

    token_starts: np.ndarray

    def shard_mask_bits(self, position: int) -> np.ndarray: ...


def stream_mask(reader: MaskedStream, start: int, stop: int, out: np.ndarray) -> np.ndarray:
    """Mask values ``stream[start:stop]`` of a reader's whole stream, across shards, into ``out`` (bool)."""
    starts = reader.token_starts
    first = int(np.searchsorted(starts, start, side="right")) - 1
    for position in range(first, int(np.searchsorted(starts, stop, side="left"))):
        base = int(starts[position])
        low, high = max(start, base), min(stop, int(starts[position + 1]))
        if low < high:
            out[low - start : high - start] = unpack_bits(reader.shard_mask_bits(position), low - base, high - base)
    return out


def window_masks(reader: MaskedStream, indices: np.ndarray, length: int, out: np.ndarray) -> np.ndarray:
    """The masks of windows ``stream[k*S:(k+1)*S]`` for each ``k`` in ``indices``, into the rows of ``out``."""
    starts = reader.token_starts
    window_starts = np.asarray(indices, np.int64) * length
    positions = np.searchsorted(starts, window_starts, side="right") - 1
    offsets = (window_starts - starts[positions]).tolist()
    inside = (window_starts + length <= starts[positions + 1]).tolist()
    shard_bits: dict[int, np.ndarray] = {}
    unpack = np.unpackbits
    for row, (position, offset, within) in enumerate(zip(positions.tolist(), offsets, inside, strict=True)):
        if within:
            bits = shard_bits.get(position)
            if bits is None:
                bits = shard_bits[position] = reader.shard_mask_bits(position)
            skip = offset & 7
            out[row] = unpack(bits[offset >> 3 : (offset + length + 7) >> 3], count=skip + length, bitorder="little")[
                skip:
            ]
        else:  # the window crosses into the next shard(s)
            start = int(window_starts[row])
            stream_mask(reader, start, start + length, out[row])
    return out


def describe_counted(counted: int, tokens: int) -> str:
    """``counted`` of ``tokens`` tokens count toward the loss, in words."""
    share = 100.0 * counted / tokens if tokens else 0.0
    return f"{counted:,} of {tokens:,} tokens count toward the loss ({share:.1f}%)"
