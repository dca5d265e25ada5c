"""LitData (Lightning AI): ``optimize`` into chunks, read with ``StreamingDataset``.

Tokens follow LitData's language-model recipe: ``optimize(...,
item_loader=TokensLoader())`` stores the documents as one token stream cut
into chunks of ``chunk_size`` tokens; ``StreamingDataset(item_loader=
TokensLoader(block_size=L), shuffle=True)`` serves it as ``L``-token blocks
(blocks never cross a chunk, so each chunk's tail is skipped) and
``StreamingDataLoader`` batches them and keeps a resumable state.
Documents are plain dict samples written with the default item loader.

``optimize`` runs its writer in a worker process started with ``spawn``: the
documents are staged to a flat file first and the inputs are document ranges,
so the data is not pickled to the worker; the worker's start-up (a fresh
interpreter importing torch and litdata, a few seconds) is part of the write
time. The calling script needs an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import importlib.metadata
import json
import multiprocessing
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

from ._common import (
    Collate,
    FlatDocuments,
    NormalizingCollate,
    write_flat_documents,
)

NAME = "LitData"
DIST = "litdata"
NOTES = "optimize() + TokensLoader chunks; StreamingDataset(shuffle=True) + StreamingDataLoader state_dict"
RESUME_NOTE = None
STATE_FORMAT = "pickle"

# Blocks per chunk. LitData's examples size token chunks as a multiple of the
# block length; doing the same keeps every block aligned with the stream.
CHUNK_BLOCKS = 8192
DOCS_PER_INPUT = 1024


def version() -> str:
    return importlib.metadata.version(DIST)


class _StagedDocuments:
    """optimize() ``fn``: yields the documents of one input range from a staging file.

    LitData's inputs are meant to be cheap references (file names, ranges)
    that ``fn`` turns into samples inside the worker; the documents are staged
    in a flat file so that workers never receive the data itself.
    """

    def __init__(self, stage: Path, as_records: bool) -> None:
        self.stage = stage
        self.as_records = as_records
        self.docs: FlatDocuments | None = None

    def __call__(self, span: tuple[int, int]) -> Iterator[Any]:
        if self.docs is None:
            self.docs = FlatDocuments(self.stage)
        for i in range(*span):
            doc = self.docs[i]
            yield doc if self.as_records else doc["tokens"]


def _optimize(records: Iterable[dict[str, Any]], out_dir: Path, as_records: bool, **kwargs: Any) -> None:
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # optimize() switches the process-wide multiprocessing start method to
    # "spawn" (force=True); put it back so later loaders are unaffected.
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".litdata-stage-") as stage:
            n = write_flat_documents(records, Path(stage))
            spans = [(a, min(a + DOCS_PER_INPUT, n)) for a in range(0, n, DOCS_PER_INPUT)]
            # One worker keeps the stream in input order.
            optimize(
                fn=_StagedDocuments(Path(stage), as_records),
                inputs=spans,
                output_dir=str(out_dir),
                num_workers=1,
                mode="overwrite",
                verbose=False,
                **kwargs,
            )
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    # A failing worker leaves an index without chunks instead of raising.
    if not json.loads((out_dir / "index.json").read_text()).get("chunks"):
        raise RuntimeError(
            "litdata.optimize wrote no chunks (its worker failed; under the default 'spawn' start "
            "method the calling script needs an `if __name__ == '__main__':` guard)"
        )


def write_tokens(documents: Iterable[np.ndarray], out_dir: Path, *, sequence_length: int = 2048) -> None:
    records = ({"document_id": i, "tokens": d} for i, d in enumerate(documents))
    _optimize(records, out_dir, False, chunk_size=sequence_length * CHUNK_BLOCKS, item_loader=TokensLoader())


def resumable_token_loader(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> StreamingDataLoader:
    dataset = StreamingDataset(
        input_dir=str(out_dir),
        item_loader=TokensLoader(block_size=sequence_length),
        shuffle=True,
        drop_last=True,
        seed=seed,
    )
    return StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers, drop_last=True)


def _as_int64(batch: Any) -> torch.Tensor:
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch)
    return batch.to(torch.int64)


def token_batches(
    out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
) -> Iterator[torch.Tensor]:
    loader = resumable_token_loader(
        out_dir, sequence_length=sequence_length, batch_size=batch_size, seed=seed, num_workers=num_workers
    )
    for batch in loader:
        yield _as_int64(batch)


def write_documents(records: Iterable[dict[str, Any]], out_dir: Path) -> None:
    _optimize(records, out_dir, True, chunk_bytes="64MB")


def document_batches(
    out_dir: Path, *, batch_size: int = 32, seed: int = 0, num_workers: int = 0, collate: Collate | None = None
) -> Iterator[Any]:
    dataset = StreamingDataset(input_dir=str(out_dir), shuffle=True, seed=seed)
    loader = StreamingDataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=NormalizingCollate(collate)
    )
    return iter(loader)
