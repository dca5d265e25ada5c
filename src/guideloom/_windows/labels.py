"""Labels from loss masks: a token's id where its mask is 1, -100 where it is 0 (the Hugging Face convention).

Plain windows of a masked storage become :class:`LabeledWindows` (``input_ids`` and ``labels``);
document-aware rows carry their mask in :class:`PieceRows`, whose labels are -100 on the mask's zeros
as well as at piece starts and on padding. A window or row of an unmasked storage in the same mixture
has no mask: all its tokens count.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import torch

from guideloom._shards.loss_masks import MaskedStream, unpack_bits, window_masks
from guideloom._windows.boundaries import IGNORE_INDEX, RowDicts, concatenate_masks


def masked_labels(input_ids: np.ndarray, loss_mask: np.ndarray | None) -> np.ndarray:
    """int64 labels: ``input_ids`` where ``loss_mask`` is True (everywhere when it is None), else -100."""
    ids = input_ids.astype(np.int64, copy=False)
    return ids.copy() if loss_mask is None else np.where(loss_mask, ids, IGNORE_INDEX)


def read_window_masks(reader: MaskedStream, indices: np.ndarray, length: int) -> np.ndarray:
    """The loss masks of stream windows ``k`` in ``indices`` of ``length`` tokens, one bool row each."""
    return window_masks(reader, indices, length, np.empty((len(indices), length), np.bool_))


def fill_piece_masks(
    flat_mask: np.ndarray,
    reader: MaskedStream,
    positions: list[int],
    starts: list[int],
    stops: list[int],
    destinations: list[int],
) -> None:
    """Copy the mask of each piece (tokens ``starts[i]:stops[i]`` of the reader's shard ``positions[i]``) to
    ``flat_mask[destinations[i]:]``; what no piece covers (padding) stays as it is."""
    shard_bits: dict[int, np.ndarray] = {}
    for position, start, stop, destination in zip(positions, starts, stops, destinations, strict=True):
        bits = shard_bits.get(position)
        if bits is None:
            bits = shard_bits[position] = reader.shard_mask_bits(position)
        flat_mask[destination : destination + stop - start] = unpack_bits(bits, start, stop)


@dataclass(frozen=True)
class LabeledWindows(RowDicts):
    """Stream windows with their loss masks (None: every token counts); a sequence of one-row dicts."""

    input_ids: np.ndarray
    loss_mask: np.ndarray | None

    def take(self, rows: np.ndarray) -> LabeledWindows:
        return LabeledWindows(self.input_ids[rows], None if self.loss_mask is None else self.loss_mask[rows])

    def split(self, sizes: list[int]) -> list[LabeledWindows]:
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        return [self.take(np.arange(start, stop)) for start, stop in pairwise(bounds)]

    @staticmethod
    def concatenate(parts: list[LabeledWindows]) -> LabeledWindows:
        return LabeledWindows(np.concatenate([part.input_ids for part in parts]), concatenate_masks(parts))

    def batch(self) -> dict[str, Any]:
        return {
            "input_ids": torch.from_numpy(self.input_ids),
            "labels": torch.from_numpy(masked_labels(self.input_ids, self.loss_mask)),
        }


def split_labeled(batch: dict[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    """A batch dict of ``input_ids`` and ``labels`` cut back into batches of ``sizes`` rows."""
    columns = [torch.split(batch[key], sizes) for key in ("input_ids", "labels")]
    return [{"input_ids": ids, "labels": labels} for ids, labels in zip(*columns, strict=True)]
