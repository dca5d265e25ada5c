"""Grain: ArrayRecord files read through Grain's ``MapDataset`` API.

ArrayRecord is Grain's native random-access format; records are written with
``group_size:1`` (the setting its docs give for random access). Tokens are
stored as one record per fixed ``sequence_length``-token block (raw uint32
bytes), so the block length is fixed when writing; documents as one record
each (int64 id, then uint32 tokens).

Reading: ``MapDataset.source(ArrayRecordDataSource).shuffle(seed).map(decode)
.batch(...)``, then ``to_iter_dataset()`` (Grain's default read threads) and,
with ``num_workers > 0``, ``mp_prefetch`` worker processes. The iterator's
``get_state()`` / ``set_state()`` give the resume measurement.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

logging.getLogger("absl").setLevel(logging.ERROR)  # "Failed to load jax profiler" on import

import grain  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from array_record.python.array_record_module import ArrayRecordWriter  # noqa: E402

from ._common import Collate, NormalizingCollate, record_arrays, token_blocks  # noqa: E402

NAME = "Grain"
DIST = "grain"
NOTES = "ArrayRecord (group_size:1) of 2048-token blocks; MapDataset shuffle/map/batch; iterator get/set_state"
RESUME_NOTE = None
STATE_FORMAT = "pickle"

TOKENS_FILE = "tokens.array_record"
DOCS_FILE = "documents.array_record"
WRITER_OPTIONS = "group_size:1"


def version() -> str:
    return importlib.metadata.version(DIST)


def write_tokens(documents: Iterable[np.ndarray], out_dir: Path, *, sequence_length: int = 2048) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = ArrayRecordWriter(str(out_dir / TOKENS_FILE), WRITER_OPTIONS)
    for block in token_blocks(documents, sequence_length):
        writer.write(block.tobytes())
    writer.close()
    (out_dir / "meta.json").write_text(json.dumps({"sequence_length": sequence_length}))


def decode_block(record: bytes) -> np.ndarray:
    return np.frombuffer(record, dtype=np.uint32)


def decode_document(record: bytes) -> dict[str, Any]:
    return {
        "document_id": int(np.frombuffer(record[:8], dtype=np.int64)[0]),
        "tokens": np.frombuffer(record[8:], dtype=np.uint32),
    }


def _iter_dataset(ds: grain.MapDataset, num_workers: int) -> grain.IterDataset:
    it = ds.to_iter_dataset()
    if num_workers > 0:
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
    return it


def _token_dataset(out_dir: Path, sequence_length: int, batch_size: int, seed: int, num_workers: int):
    written = json.loads((Path(out_dir) / "meta.json").read_text())["sequence_length"]
    if written != sequence_length:
        raise ValueError(f"written with sequence_length={written}, asked for {sequence_length}")
    source = grain.sources.ArrayRecordDataSource(str(Path(out_dir) / TOKENS_FILE))
    ds = grain.MapDataset.source(source).shuffle(seed=seed).map(decode_block).batch(batch_size, drop_remainder=True)
    return len(ds), _iter_dataset(ds, num_workers)


def _as_torch(it: Iterator[np.ndarray]) -> Iterator[torch.Tensor]:
    for batch in it:
        yield torch.from_numpy(batch.astype(np.int64))


def token_batches(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> Iterator[torch.Tensor]:
    _, ds = _token_dataset(out_dir, sequence_length, batch_size, seed, num_workers)
    return _as_torch(iter(ds))


class StatefulIterator:
    """Grain's dataset iterator behind ``state_dict`` / ``load_state_dict`` (its ``get_state`` / ``set_state``)."""

    def __init__(self, batches: int, dataset: grain.IterDataset) -> None:
        self.batches = batches
        self.iterator = iter(dataset)

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[Any]:
        return self.iterator

    def state_dict(self) -> Any:
        return self.iterator.get_state()

    def load_state_dict(self, state: Any) -> None:
        self.iterator.set_state(state)


def resumable_token_loader(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> StatefulIterator:
    return StatefulIterator(*_token_dataset(out_dir, sequence_length, batch_size, seed, num_workers))


def write_documents(records: Iterable[dict[str, Any]], out_dir: Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = ArrayRecordWriter(str(out_dir / DOCS_FILE), WRITER_OPTIONS)
    for doc_id, tokens in record_arrays(records):
        writer.write(np.int64(doc_id).tobytes() + tokens.tobytes())
    writer.close()


def document_batches(
    out_dir: Path, *, batch_size: int = 32, seed: int = 0, num_workers: int = 0, collate: Collate | None = None
) -> Iterator[Any]:
    source = grain.sources.ArrayRecordDataSource(str(Path(out_dir) / DOCS_FILE))
    ds = (
        grain.MapDataset.source(source)
        .shuffle(seed=seed)
        .map(decode_document)
        .batch(batch_size, batch_fn=NormalizingCollate(collate))
    )
    return iter(_iter_dataset(ds, num_workers))
