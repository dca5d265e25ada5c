"""Hugging Face ``datasets``: Arrow files from ``save_to_disk``, read with ``load_from_disk``.

Tokens are stored as HF's causal-LM recipe leaves them after its
``group_texts`` step: one row per fixed ``sequence_length``-token block
(``input_ids``), so the block length is fixed when writing. Reading is what
``transformers.Trainer`` does with a map-style dataset: ``with_format("torch")``
and a ``torch.utils.data.DataLoader`` with a shuffling sampler (batches are
fetched with one ``__getitems__`` call each).

The map-style ``Dataset`` + ``DataLoader`` pipeline keeps no iteration state,
so there is no resume measurement for this peer.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.metadata
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from datasets import Dataset, Features, List, Value, load_from_disk
from torch.utils.data import DataLoader

from ._common import Collate, NormalizingCollate, record_arrays, token_blocks
from .interface import NotResumable

NAME = "HF datasets"
DIST = "datasets"
NOTES = "save_to_disk Arrow rows of 2048-token blocks; load_from_disk().with_format('torch') + DataLoader(shuffle)"
RESUME_NOTE = None
STATE_FORMAT = "pickle"

datasets.disable_progress_bars()


def version() -> str:
    return importlib.metadata.version(DIST)


def _save(generator: Callable[[], Iterator[dict[str, Any]]], features: Features, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # from_generator streams rows into Arrow files in cache_dir; a fixed
    # fingerprint stops it from hashing the generator (and the data it closes
    # over). save_to_disk then writes the dataset's own directory.
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".hf-build-") as cache:
        ds = Dataset.from_generator(generator, features=features, cache_dir=cache, fingerprint=uuid.uuid4().hex)
        ds.save_to_disk(str(out_dir))
        del ds


def write_tokens(documents: Iterable[np.ndarray], out_dir: Path, *, sequence_length: int = 2048) -> None:
    features = Features({"input_ids": List(Value("uint32"), length=sequence_length)})

    def rows() -> Iterator[dict[str, Any]]:
        for block in token_blocks(documents, sequence_length):
            yield {"input_ids": block}

    _save(rows, features, out_dir)


def stack_input_ids(rows: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """collate_fn: stack the rows' ``input_ids`` (already int64 tensors)."""
    return torch.stack([r["input_ids"] for r in rows])


def token_batches(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> Iterator[torch.Tensor]:
    ds = load_from_disk(str(out_dir))
    written = ds.features["input_ids"].length
    if written != sequence_length:
        raise ValueError(f"written with sequence_length={written}, asked for {sequence_length}")
    loader = DataLoader(
        ds.with_format("torch"),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        drop_last=True,
        num_workers=num_workers,
        collate_fn=stack_input_ids,
    )
    return iter(loader)


def write_documents(records: Iterable[dict[str, Any]], out_dir: Path) -> None:
    features = Features({"document_id": Value("int64"), "tokens": List(Value("uint32"))})

    def rows() -> Iterator[dict[str, Any]]:
        for doc_id, tokens in record_arrays(records):
            yield {"document_id": doc_id, "tokens": tokens}

    _save(rows, features, out_dir)


def document_batches(
    out_dir: Path, *, batch_size: int = 32, seed: int = 0, num_workers: int = 0, collate: Collate | None = None
) -> Iterator[Any]:
    loader = DataLoader(
        load_from_disk(str(out_dir)).with_format("torch"),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
        collate_fn=NormalizingCollate(collate),
    )
    return iter(loader)


def resumable_token_loader(out_dir: Path, **_: Any) -> Any:
    raise NotResumable(
        "a map-style datasets.Dataset read through torch's DataLoader keeps no iteration state "
        "(datasets' own state_dict() exists only on IterableDataset pipelines)"
    )
