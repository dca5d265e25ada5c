"""MosaicML Streaming: MDS shards written by ``MDSWriter``, read by ``StreamingDataset``.

Tokens are stored the way Mosaic's LLM recipes store pre-tokenized text: one
sample per fixed ``sequence_length``-token block of the concatenated stream
(so the block length is fixed when writing). ``StreamingDataset(shuffle=True)``
shuffles the samples (default ``py1e`` algorithm) and ``StreamingDataLoader``
counts samples so that ``state_dict()`` can resume mid-epoch.

``import streaming`` imports torchvision; the torchvision that pip pairs with
the CPU torch build does not load, so this adapter puts a stub package
(``_stubs/torchvision``) first on ``sys.path``. Only Mosaic's vision datasets
use it.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

_STUBS = str(Path(__file__).resolve().parent / "_stubs")
if _STUBS not in sys.path:
    sys.path.insert(0, _STUBS)

from streaming import (  # noqa: E402
    MDSWriter,
    Stream,  # noqa: F401  (for the benchmarks that mix streams: after the stub)
    StreamingDataLoader,
    StreamingDataset,
)

from ._common import (  # noqa: E402
    Collate,
    NormalizingCollate,
    record_arrays,
    token_blocks,
)

NAME = "MosaicML Streaming"
DIST = "mosaicml-streaming"
NOTES = "MDSWriter shards of fixed 2048-token samples; StreamingDataset(shuffle=True, py1e); loader state_dict"
RESUME_NOTE = None
STATE_FORMAT = "pickle"
SHARD_BYTES = "64mb"


def version() -> str:
    return importlib.metadata.version(DIST)


def write_tokens(documents: Iterable[np.ndarray], out_dir: Path, *, sequence_length: int = 2048) -> None:
    columns = {"tokens": f"ndarray:uint32:{sequence_length}"}
    with MDSWriter(out=str(out_dir), columns=columns, size_limit=SHARD_BYTES) as writer:
        for block in token_blocks(documents, sequence_length):
            writer.write({"tokens": block})


def stack_tokens(samples: list[dict[str, np.ndarray]]) -> torch.Tensor:
    """collate_fn: stack the uint32 blocks into one int64 batch."""
    return torch.from_numpy(np.stack([s["tokens"] for s in samples]).astype(np.int64))


def _dataset(out_dir: Path, batch_size: int, seed: int, collect: bool = True) -> StreamingDataset:
    # A StreamingDataset claims its local directory in shared memory until it
    # is garbage-collected; make sure an earlier loader on the same directory
    # is really gone before building a new one.
    if collect:
        gc.collect()
    return StreamingDataset(local=str(out_dir), remote=None, shuffle=True, shuffle_seed=seed, batch_size=batch_size)


def _token_loader(
    out_dir: Path, sequence_length: int, batch_size: int, seed: int, num_workers: int, collect: bool = True
) -> StreamingDataLoader:
    dataset = _dataset(out_dir, batch_size, seed, collect)
    return StreamingDataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=stack_tokens, drop_last=True
    )


def _check_length(out_dir: Path, sequence_length: int) -> None:
    shard = json.loads((Path(out_dir) / "index.json").read_text())["shards"][0]
    written = shard["column_encodings"][shard["column_names"].index("tokens")]
    if written != f"ndarray:uint32:{sequence_length}":
        raise ValueError(f"tokens written as {written!r}, asked for sequence_length={sequence_length}")


def token_batches(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> Iterator[torch.Tensor]:
    _check_length(out_dir, sequence_length)
    yield from _token_loader(out_dir, sequence_length, batch_size, seed, num_workers)


def resumable_token_loader(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> StreamingDataLoader:
    """The resume measurement has already collected earlier loaders on the directory, outside its timing."""
    _check_length(out_dir, sequence_length)
    return _token_loader(out_dir, sequence_length, batch_size, seed, num_workers, collect=False)


def write_documents(records: Iterable[dict[str, Any]], out_dir: Path) -> None:
    columns = {"document_id": "int64", "tokens": "ndarray:uint32"}
    with MDSWriter(out=str(out_dir), columns=columns, size_limit=SHARD_BYTES) as writer:
        for doc_id, tokens in record_arrays(records):
            writer.write({"document_id": doc_id, "tokens": tokens})


def document_batches(
    out_dir: Path, *, batch_size: int = 32, seed: int = 0, num_workers: int = 0, collate: Collate | None = None
) -> Iterator[Any]:
    loader = StreamingDataLoader(
        _dataset(out_dir, batch_size, seed),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=NormalizingCollate(collate),
    )
    yield from loader
