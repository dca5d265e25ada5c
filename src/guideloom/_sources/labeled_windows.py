"""Plain token windows with labels: what a loader serves from a masked token storage, or from any token
storage of a mixture that holds a masked one (so that every batch of the mixture has the same keys)."""

from __future__ import annotations

from typing import Any

import numpy as np

from guideloom._sources.token_windows import TokenSource
from guideloom._windows.labels import LabeledWindows, read_window_masks, split_labeled


class LabeledWindowSource(TokenSource[LabeledWindows]):
    """Sample ``k`` is ``stream[k*S:(k+1)*S]`` with its loss mask; batches are ``{"input_ids", "labels"}``.

    Over an unmasked storage every token counts: its labels are its ids.
    """

    kind = "token windows with labels"

    def fetch(self, indices: np.ndarray, epoch: int) -> LabeledWindows:
        windows = self.read_windows(indices)
        reader = self.reader
        masks = read_window_masks(reader, indices, self.sequence_length) if reader.header.loss_mask else None
        return LabeledWindows(windows, masks)

    def default_collate(self, samples: LabeledWindows) -> dict[str, Any]:
        return samples.batch()

    def split_collated(self, batch: dict[str, Any], sizes: list[int]) -> list[Any]:
        return split_labeled(batch, sizes)
