"""Hand-written baseline: one flat uint32 file read through ``np.memmap``.

The token layout and batch assembly follow nanoGPT's ``get_batch`` (slice
windows out of a memmap, stack, convert), except that an epoch visits every
non-overlapping window once, in a seeded random order, instead of drawing
random offsets with replacement. Single process; ``num_workers`` is ignored.
Its "state" is simply the number of batches already produced.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._common import (
    Collate,
    FlatDocuments,
    FlatWindows,
    NormalizingCollate,
    write_flat_documents,
    write_flat_tokens,
)

NAME = "naive memmap"
DIST = None
NOTES = "flat uint32 .bin + np.memmap, seeded permutation of windows, main process only"
RESUME_NOTE = "hand-rolled: the state is (seed, batches produced)"
STATE_FORMAT = "pickle"


def version() -> str:
    return f"numpy {np.__version__}"


def write_tokens(documents: Iterable[np.ndarray], out_dir: Path, *, sequence_length: int = 2048) -> None:
    write_flat_tokens(documents, out_dir)


def _token_batches_from(
    out_dir: Path, sequence_length: int, batch_size: int, seed: int, start_batch: int
) -> Iterator[torch.Tensor]:
    windows = FlatWindows(out_dir, sequence_length)
    order = np.random.default_rng(seed).permutation(len(windows))
    n_batches = len(windows) // batch_size
    for b in range(start_batch, n_batches):
        idx = order[b * batch_size : (b + 1) * batch_size]
        x = np.stack([windows.window(i) for i in idx])
        yield torch.from_numpy(x.astype(np.int64))


def token_batches(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> Iterator[torch.Tensor]:
    return _token_batches_from(out_dir, sequence_length, batch_size, seed, 0)


class CountingLoader:
    """The baseline's loader with a hand-rolled state: the seed and the number of batches produced."""

    def __init__(self, out_dir: Path, sequence_length: int, batch_size: int, seed: int) -> None:
        self.out_dir, self.sequence_length, self.batch_size = out_dir, sequence_length, batch_size
        self.state = {"seed": seed, "batches": 0}

    def __len__(self) -> int:
        return len(FlatWindows(self.out_dir, self.sequence_length)) // self.batch_size

    def __iter__(self) -> Iterator[torch.Tensor]:
        start = self.state["batches"]
        for batch in _token_batches_from(
            self.out_dir, self.sequence_length, self.batch_size, self.state["seed"], start
        ):
            self.state["batches"] += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = dict(state)


def resumable_token_loader(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> CountingLoader:
    return CountingLoader(out_dir, sequence_length, batch_size, seed)


def write_documents(records: Iterable[dict[str, Any]], out_dir: Path) -> None:
    write_flat_documents(records, out_dir)


def document_batches(
    out_dir: Path, *, batch_size: int = 32, seed: int = 0, num_workers: int = 0, collate: Collate | None = None
) -> Iterator[Any]:
    docs = FlatDocuments(out_dir)
    collate_fn = NormalizingCollate(collate)
    order = np.random.default_rng(seed).permutation(len(docs))
    for b in range(0, len(order), batch_size):
        yield collate_fn([docs[int(i)] for i in order[b : b + batch_size]])
