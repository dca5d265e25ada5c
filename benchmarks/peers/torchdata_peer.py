"""torchdata's ``StatefulDataLoader`` over map-style datasets on the flat files.

Same on-disk layout as the naive baseline (one uint32 ``.bin`` for tokens; a
tokens file plus offsets for documents). Reading is the stock PyTorch recipe:
a map-style ``Dataset`` whose ``__getitem__`` slices a memmap, shuffled by the
loader's ``RandomSampler`` with a seeded generator. ``StatefulDataLoader`` is a
drop-in ``DataLoader`` that adds ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ._common import (
    Collate,
    FlatDocuments,
    FlatWindows,
    NormalizingCollate,
    write_flat_documents,
    write_flat_tokens,
)

NAME = "torchdata StatefulDataLoader"
DIST = "torchdata"
NOTES = "flat uint32 .bin + map-style Dataset over memmap windows; RandomSampler; state_dict resume"
RESUME_NOTE = None
STATE_FORMAT = "pickle"


def version() -> str:
    return importlib.metadata.version(DIST)


class WindowDataset(Dataset[torch.Tensor]):
    def __init__(self, out_dir: Path, sequence_length: int) -> None:
        self.windows = FlatWindows(out_dir, sequence_length)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.windows.window(i).astype(np.int64))


class DocumentDataset(Dataset[dict[str, Any]]):
    def __init__(self, out_dir: Path) -> None:
        self.docs = FlatDocuments(out_dir)

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.docs[i]


def _loader(dataset: Dataset[Any], batch_size: int, seed: int, num_workers: int, **kw: Any) -> StatefulDataLoader:
    return StatefulDataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
        **kw,
    )


def write_tokens(documents: Iterable[np.ndarray], out_dir: Path, *, sequence_length: int = 2048) -> None:
    write_flat_tokens(documents, out_dir)


def resumable_token_loader(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> StatefulDataLoader:
    return _loader(WindowDataset(out_dir, sequence_length), batch_size, seed, num_workers, drop_last=True)


def token_batches(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> Iterator[torch.Tensor]:
    loader = resumable_token_loader(
        out_dir, sequence_length=sequence_length, batch_size=batch_size, seed=seed, num_workers=num_workers
    )
    return iter(loader)


def write_documents(records: Iterable[dict[str, Any]], out_dir: Path) -> None:
    write_flat_documents(records, out_dir)


def document_batches(
    out_dir: Path, *, batch_size: int = 32, seed: int = 0, num_workers: int = 0, collate: Collate | None = None
) -> Iterator[Any]:
    loader = _loader(DocumentDataset(out_dir), batch_size, seed, num_workers, collate_fn=NormalizingCollate(collate))
    return iter(loader)
