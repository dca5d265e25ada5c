"""The source of token windows with document boundaries (``document_boundaries=True``).

Batches are a dict of ``input_ids``, ``position_ids``, ``labels``, ``cu_seqlens`` and ``max_seqlen``
(see ``_windows.boundaries``); a user ``collate`` receives the rows as a sequence of one-row dicts instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from guideloom._sources.token_windows import TokenSource
from guideloom._windows.boundaries import PieceRows, split_batch
from guideloom._windows.document_rows import stream_rows
from guideloom._windows.labels import read_window_masks


class BoundaryWindowSource(TokenSource[PieceRows]):
    """Sample ``k`` is ``stream[k*S:(k+1)*S]`` as for plain windows, with the pieces its documents make of it."""

    kind = "token windows with document boundaries"

    def fetch(self, indices: np.ndarray, epoch: int) -> PieceRows:
        windows = self.read_windows(indices)
        rows = stream_rows(self.reader, windows, np.asarray(indices, np.int64) * self.sequence_length)
        if self.reader.header.loss_mask:
            rows = dataclasses.replace(rows, loss_mask=read_window_masks(self.reader, indices, self.sequence_length))
        return rows

    def default_collate(self, samples: PieceRows) -> dict[str, Any]:
        return samples.batch()

    def split_collated(self, batch: dict[str, Any], sizes: list[int]) -> list[Any]:
        return split_batch(batch, sizes)
