"""guideloom behind the peers' adapter interface (``peers.interface.Adapter``), one variant per format.

Token batches come from a ``TokenStorage`` (uint32) through ``StatefulDataLoader``; documents from a
``DocumentStorage`` in the format the variant names: pickle, MessagePack (tokens as typed arrays,
``numpy_arrays=True``) or the spec's struct/NumPy format, which decodes a batch at once
(``unpack_many``). Records are written in shards of 10,000, tokens in shards of about 12.5M tokens.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from guideloom import (
    DocumentMsgpackFormat,
    DocumentPickleFormat,
    DocumentStorage,
    StatefulDataLoader,
    TokenStorage,
)
from guideloom.types import DocumentStorageFormat

NAME = "guideloom"
DIST = "guideloom"
NOTES = "TokenStorage / DocumentStorage shards + StatefulDataLoader; JSON state_dict resume"
RESUME_NOTE = "the state is JSON (a few counters)"
STATE_FORMAT = "json"
TOKENS_PER_SHARD = 12_500_000
RECORDS_PER_SHARD = 10_000


class TokenDocumentFormat(DocumentStorageFormat[dict[str, Any], dict[str, Any]]):
    """The spec's custom format: a 4-byte document id, then little-endian int32 tokens."""

    prefix = struct.Struct("<I")

    def pack(self, data: dict[str, Any]) -> bytes:
        return self.prefix.pack(data["document_id"]) + np.asarray(data["tokens"], dtype="<i4").tobytes()

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        (document_id,) = self.prefix.unpack_from(encoded_data)
        tokens = np.frombuffer(encoded_data, dtype="<i4", offset=self.prefix.size)
        return {"document_id": document_id, "tokens": tokens, "shard": shard}

    def unpack_many(self, encoded_data: list[memoryview], shards: list[int]) -> list[dict[str, Any]]:
        """A batch at once: one copy of its bytes, ids gathered and tokens widened to int64 by NumPy."""
        if not encoded_data:
            return []
        words = np.frombuffer(b"".join(encoded_data), "<i4")
        ends = np.cumsum(np.fromiter(map(len, encoded_data), np.int64, len(encoded_data))) // 4
        starts = np.empty_like(ends)
        starts[0], starts[1:] = 0, ends[:-1]
        document_ids = words[starts].view("<u4").tolist()
        tokens = words.astype(np.int64)
        return [
            {"document_id": document_id, "tokens": tokens[start + 1 : end], "shard": shard}
            for document_id, start, end, shard in zip(document_ids, starts.tolist(), ends.tolist(), shards, strict=True)
        ]


class PickleRecords(DocumentPickleFormat):
    """Pickle with the tokens stored as a NumPy array (the fast way to pickle token lists)."""

    def pack(self, data: Any) -> bytes:
        return super().pack({"document_id": data["document_id"], "tokens": np.asarray(data["tokens"], np.int32)})


FORMATS: dict[str, Callable[[], DocumentStorageFormat[Any, Any]]] = {
    "pickle": PickleRecords,
    "msgpack": lambda: DocumentMsgpackFormat(numpy_arrays=True),
    "struct": TokenDocumentFormat,
}


def version() -> str:
    import guideloom

    return guideloom.__version__


def write_tokens(documents: Iterable[np.ndarray], out_dir: Path, *, sequence_length: int = 2048) -> None:
    storage = TokenStorage(out_dir, dtype="uint32")
    written = 0
    with storage.sync_writer() as writer:
        for document in documents:
            writer.append(written // TOKENS_PER_SHARD, document)
            written += len(document)


def resumable_token_loader(
    out_dir: Path,
    *,
    sequence_length: int = 2048,
    batch_size: int = 8,
    seed: int = 0,
    num_workers: int = 0,
    window_dtype: torch.dtype = torch.int64,
) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(
        TokenStorage(out_dir),
        device="cpu",
        local_batch_size=batch_size,
        sequence_length=sequence_length,
        window_dtype=window_dtype,
        shuffle=True,
        seed=seed,
        drop_last=True,
        num_workers=num_workers,
    )


def token_batches(
    out_dir: Path,
    *,
    sequence_length: int = 2048,
    batch_size: int = 8,
    seed: int = 0,
    num_workers: int = 0,
    window_dtype: torch.dtype = torch.int64,
) -> Iterator[torch.Tensor]:
    """int64 batches as every peer gives; ``window_dtype=torch.int32`` is guideloom's option, reported apart."""
    options = {"sequence_length": sequence_length, "batch_size": batch_size, "seed": seed, "num_workers": num_workers}
    with resumable_token_loader(out_dir, **options, window_dtype=window_dtype) as loader:
        yield from loader


def write_documents(records: Iterable[dict[str, Any]], out_dir: Path, *, format: str = "pickle") -> None:
    storage = DocumentStorage(out_dir, FORMATS[format]())
    with storage.sync_writer() as writer:
        for index, record in enumerate(records):
            if format == "msgpack":  # tokens as a typed array, like the pickle variant's
                record = {"document_id": record["document_id"], "tokens": np.asarray(record["tokens"], np.int32)}
            writer.append(index // RECORDS_PER_SHARD, record)


def document_batches(
    out_dir: Path,
    *,
    batch_size: int = 32,
    seed: int = 0,
    num_workers: int = 0,
    collate: Any = None,
    format: str = "pickle",
) -> Iterator[Any]:
    from benchmarks.peers._common import NormalizingCollate

    storage = DocumentStorage(out_dir, FORMATS[format]())
    with StatefulDataLoader.from_storage(
        storage,
        NormalizingCollate(collate),
        device="cpu",
        local_batch_size=batch_size,
        shuffle=True,
        seed=seed,
        num_workers=num_workers,
    ) as loader:
        yield from loader
