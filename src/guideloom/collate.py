"""Ready collates for records: ``guideloom.collate.pad`` pads records of token sequences into tensors.

A document storage hands ``collate`` a list of decoded records. When those records are dicts whose
fields are token sequences (an SFT example's ``input_ids`` and ``labels``; a preference pair's
``prompt_input_ids``, ``chosen_input_ids`` and ``rejected_input_ids``), ``pad()`` is the collate::

    loader = StatefulDataLoader.from_storage(storage, pad(pad_id=tokenizer.pad_token_id), ...)

What each field of the records becomes in the batch (a dict, fields in the first record's order):

- a sequence (a list or tuple of numbers, a 1-D NumPy array or tensor): a ``(batch, longest)`` tensor,
  padded to the batch's longest sequence of that field. Integer fields are padded with ``pad_id``,
  except fields whose name contains ``label``, padded with ``label_pad_id`` (-100, which
  ``torch.nn.functional.cross_entropy`` ignores); float and bool fields (weights, masks) with 0.
  Integer fields become int64 (what embeddings and ``cross_entropy`` take); float fields keep their
  dtype (float32 from lists), bool fields stay bool.
- beside each integer field that is neither label-like nor itself a mask: its attention mask (1 on
  tokens, 0 on padding, int64) and its lengths before padding (int64, one per record). Their names
  follow the field's: ``input_ids`` gives ``attention_mask`` and ``lengths``, ``chosen_input_ids``
  gives ``chosen_attention_mask`` and ``chosen_lengths``, any other name ``NAME`` gives
  ``NAME_attention_mask`` and ``NAME_lengths``. A field the records carry themselves wins: a
  record's own ``attention_mask`` is padded (with 0) and none is made for it.
- a scalar (int, float, bool, a NumPy scalar, a 0-d array or tensor): stacked into a 1-D tensor
  (integers as int64).
- an array or tensor of two or more dimensions: stacked, when every record's has the same shape.
- decoded media (``from_storage(..., decode=True)`` with ``guideloom.fields``), as tensors: images (uint8,
  (height, width, channels)) and videos (uint8, (time, height, width, channels)) stacked, uint8 kept, when
  they all have one shape; otherwise kept as a list of tensors beside ``NAME_sizes``, an int64
  ``(batch, 2)`` of (height, width) (``(batch, 3)`` of (time, height, width) for videos). Audio (float32,
  (frames, channels)) is padded with 0 to the batch's longest clip into ``(batch, longest, channels)``,
  with ``NAME_attention_mask`` (1 on samples, 0 on padding, int64) and ``NAME_lengths`` (frames).
- anything else (strings, bytes, None, lists of strings, nested dicts): kept as a list, one per record.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

__all__ = ["PadCollate", "pad"]

LABEL_PAD_ID = -100  # what torch's cross_entropy ignores by default (ignore_index)
_TOKENS_SUFFIX = "input_ids"
_MASK_SUFFIX = "attention_mask"


def pad(
    pad_id: int = 0,
    *,
    label_pad_id: int = LABEL_PAD_ID,
    padding_side: Literal["right", "left"] = "right",
    pad_to_multiple_of: int | None = None,
    max_length: int | None = None,
) -> PadCollate:
    """A collate that pads records of token sequences into a dict of tensors (see the module's docstring).

    ``padding_side="left"`` puts the padding before the tokens (for generation from prompts).
    ``pad_to_multiple_of`` rounds each padded field's length up to a multiple (8 or 64 for tensor
    cores); ``max_length`` cuts every sequence longer than it to its first ``max_length`` items
    before padding. The collate can be pickled, so it runs in worker processes.
    """
    return PadCollate(pad_id, label_pad_id, padding_side, pad_to_multiple_of, max_length)


def _check_int(name: str, value: object, minimum: int | None = None) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"pad: {name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"pad: {name} must be at least {minimum}, got {value}")
    return int(value)


class PadCollate:
    """The collate ``pad()`` returns: call it with a list of records (dicts), get a dict of tensors."""

    def __init__(
        self,
        pad_id: int,
        label_pad_id: int,
        padding_side: str,
        pad_to_multiple_of: int | None,
        max_length: int | None,
    ) -> None:
        self.pad_id = _check_int("pad_id", pad_id)
        self.label_pad_id = _check_int("label_pad_id", label_pad_id)
        if padding_side not in ("right", "left"):
            raise ValueError(f"pad: padding_side must be 'right' or 'left', got {padding_side!r}")
        self.padding_side = padding_side
        self.pad_to_multiple_of = (
            None if pad_to_multiple_of is None else _check_int("pad_to_multiple_of", pad_to_multiple_of, 1)
        )
        self.max_length = None if max_length is None else _check_int("max_length", max_length, 1)

    def __repr__(self) -> str:
        options = [f"pad_id={self.pad_id}", f"label_pad_id={self.label_pad_id}", f"padding_side={self.padding_side!r}"]
        if self.pad_to_multiple_of is not None:
            options.append(f"pad_to_multiple_of={self.pad_to_multiple_of}")
        if self.max_length is not None:
            options.append(f"max_length={self.max_length}")
        return f"guideloom.collate.pad({', '.join(options)})"

    def __call__(self, records: Sequence[Any]) -> dict[str, Any]:
        records = list(records)
        for number, record in enumerate(records):
            if not isinstance(record, Mapping):
                raise TypeError(
                    f"pad: records must be dicts of fields, "
                    f"but record {number} of the batch is a {type(record).__name__}"
                )
        if not records:
            return {}
        names = list(records[0])
        for number, record in enumerate(records[1:], 1):
            if list(record) != names and set(record) != set(names):
                missing, extra = set(names) - set(record), set(record) - set(names)
                what = f"lacks {sorted(missing)}" if missing else f"has {sorted(extra)} that record 0 lacks"
                raise ValueError(f"pad: every record needs the same fields, but record {number} of the batch {what}")
        batch: dict[str, Any] = {}
        for name in names:
            values = [record[name] for record in records]
            batch[name], extras = self._field(name, values, names)
            batch.update(extras)
        return batch

    def _field(self, name: str, values: list[Any], names: list[str]) -> tuple[Any, dict[str, torch.Tensor]]:
        """The batch's value for field ``name``, and the masks and lengths that go with it."""
        media = _media_kind(values)
        if media is not None:
            return _media_field(name, values, media)
        arrays = [_as_array(value) for value in values]
        if any(array is None for array in arrays):
            return values, {}
        present = [array for array in arrays if array is not None]
        dimensions = {array.ndim for array in present}
        if dimensions == {0}:
            return torch.from_numpy(_widened(np.stack(present))), {}
        if dimensions == {1}:
            return self._padded(name, present, names)
        shapes = {array.shape for array in present}
        if len(shapes) == 1:
            return torch.from_numpy(_widened(np.stack(present))), {}
        raise ValueError(
            f"pad: field {name!r} holds arrays of {sorted(dimensions)} dimensions or shapes "
            f"{sorted(shapes)[:3]}: only 1-D sequences are padded; arrays of more dimensions must match to be stacked"
        )

    def _padded(self, name: str, arrays: list[np.ndarray], names: list[str]) -> tuple[torch.Tensor, dict[str, Any]]:
        if self.max_length is not None:
            arrays = [array[: self.max_length] for array in arrays]
        lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
        width = int(lengths.max(initial=0))
        if self.pad_to_multiple_of is not None:
            width = math.ceil(width / self.pad_to_multiple_of) * self.pad_to_multiple_of
        dtype = np.result_type(*arrays)
        integers = dtype.kind in "iu"
        label_like = "label" in name
        value = (self.label_pad_id if label_like else self.pad_id) if integers else 0
        out = np.full((len(arrays), width), value, np.int64 if integers else dtype)
        left = self.padding_side == "left"
        for row, (array, length) in enumerate(zip(arrays, lengths.tolist(), strict=True)):
            if left:
                out[row, width - length :] = array
            else:
                out[row, :length] = array
        extras: dict[str, Any] = {}
        if integers and not label_like and not name.endswith(_MASK_SUFFIX):
            mask_name, lengths_name = _companions(name)
            if mask_name not in names:
                columns = np.arange(width)
                starts = width - lengths if left else np.zeros_like(lengths)
                mask = (columns >= starts[:, None]) & (columns < (starts + lengths)[:, None])
                extras[mask_name] = torch.from_numpy(mask.astype(np.int64))
            if lengths_name not in names:
                extras[lengths_name] = torch.from_numpy(lengths)
        return torch.from_numpy(out), extras


def _media_kind(values: list[Any]) -> str | None:
    """ "pixels" (decoded images or videos), "sound" (decoded audio), or None: what a field of decoded media holds."""
    if not values or not all(isinstance(value, torch.Tensor) for value in values):
        return None
    kinds = {(value.dtype, value.ndim) for value in values}
    if kinds <= {(torch.uint8, 3)} or kinds <= {(torch.uint8, 4)}:
        return "pixels"
    if kinds == {(torch.float32, 2)}:
        return "sound"
    return None


def _media_field(name: str, values: list[torch.Tensor], media: str) -> tuple[Any, dict[str, Any]]:
    """Decoded images or videos stacked (one shape) or listed with their sizes; audio padded with a mask."""
    if media == "pixels":
        if len({value.shape for value in values}) == 1:  # NumPy stacks uint8 pixels 5-20x as fast as torch.stack
            return torch.from_numpy(np.stack([value.numpy(force=True) for value in values])), {}
        sizes = torch.tensor([list(value.shape[:-1]) for value in values], dtype=torch.int64)
        return values, {f"{name}_sizes": sizes}
    channels = {value.shape[1] for value in values}
    if len(channels) != 1:
        raise ValueError(
            f"pad: field {name!r} holds audio of {sorted(channels)} channels: they must match to be padded"
        )
    # In NumPy: torch's indexed copies and comparisons cost 10-50x as much on clips of this size.
    lengths = np.fromiter((value.shape[0] for value in values), np.int64, len(values))
    longest = int(lengths.max())
    out = np.empty((len(values), longest, channels.pop()), np.float32)
    mask = np.empty((len(values), longest), np.int64)
    for row, (value, length) in enumerate(zip(values, lengths.tolist(), strict=True)):
        out[row, :length] = value.numpy(force=True)
        out[row, length:] = 0
        mask[row, :length] = 1
        mask[row, length:] = 0
    return torch.from_numpy(out), {
        f"{name}_{_MASK_SUFFIX}": torch.from_numpy(mask),
        f"{name}_lengths": torch.from_numpy(lengths),
    }


def _widened(array: np.ndarray) -> np.ndarray:
    """Integers as int64; other dtypes as they are."""
    return array.astype(np.int64) if array.dtype.kind in "iu" and array.dtype != np.int64 else array


def _companions(name: str) -> tuple[str, str]:
    """The names of a token field's attention mask and lengths: input_ids -> attention_mask, lengths."""
    if name.endswith(_TOKENS_SUFFIX):
        prefix = name[: -len(_TOKENS_SUFFIX)]
        return prefix + _MASK_SUFFIX, prefix + "lengths"
    return f"{name}_{_MASK_SUFFIX}", f"{name}_lengths"


def _as_array(value: Any) -> np.ndarray | None:
    """``value`` as a NumPy array of numbers or bools, or None when it is not one (strings, None, records)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.numpy()
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
    elif isinstance(value, bool | numbers.Real):
        array = np.asarray(value, np.float32 if isinstance(value, float) else None)
    elif isinstance(value, list | tuple):
        if not value:
            return np.empty(0, np.int64)
        if not all(isinstance(item, bool | numbers.Real) for item in value):
            return None
        array = np.asarray(value)
        if array.dtype.kind == "f":
            array = array.astype(np.float32)
    else:
        return None
    return array if array.dtype.kind in "biuf" else None
