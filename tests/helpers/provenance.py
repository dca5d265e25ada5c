"""Storages whose every token says where it lives, and the check that an explained batch is the batch read.

Token ``offset`` of record ``record`` of shard ``shard`` is ``shard·10⁶ + record·10³ + offset + 1`` (0 is
never a token, so it can be the padding); a document record is ``{"shard": s, "record": r}``. Shard ids
are not contiguous, so a shard's id and its position among the shards differ.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from guideloom import DocumentJsonFormat, DocumentStorage, Mixture, StatefulDataLoader, TokenStorage

SHARDS = (0, 2, 5)


def token(shard: int, record: int, offset: int | np.ndarray) -> Any:
    return shard * 1_000_000 + record * 1_000 + offset + 1


def write_tokens(
    path: Path, seed: int = 0, shards: tuple[int, ...] = SHARDS, records: int = 9, masked: bool = False
) -> TokenStorage:
    """Documents of 0 to 40 tokens (some empty, some longer than a row of 16), ``records`` per shard.

    ``masked``: a loss-masked storage, every third token of each document masked out.
    """
    rng = np.random.default_rng(seed)
    storage = TokenStorage(path, loss_mask=masked)
    with storage.sync_writer() as writer:
        for shard in shards:
            for record in range(records):
                offsets = np.arange(int(rng.integers(0, 41)))
                mask = {"loss_mask": offsets % 3 != 0} if masked else {}
                writer.append(shard, token(shard, record, offsets), **mask)
    return storage


def write_documents(path: Path, shards: tuple[int, ...] = SHARDS, records: int = 7) -> DocumentStorage[Any, Any]:
    storage: DocumentStorage[Any, Any] = DocumentStorage(path, DocumentJsonFormat())
    with storage.sync_writer() as writer:
        for shard in shards:
            for record in range(records):
                writer.append(shard, {"shard": shard, "record": record, "path": str(path.name)})
    return storage


MODES: dict[str, dict[str, Any]] = {
    "documents": {},
    "windows": {"sequence_length": 16},
    "boundaries": {"sequence_length": 16, "document_boundaries": True},
    "packed": {"sequence_length": 16, "pack_documents": True},
    "mixture-windows": {"sequence_length": 16},
    "mixture-packed": {"sequence_length": 16, "pack_documents": True},
    "mixture-documents": {},
}


def storage_of(mode: str, path: Path) -> Any:
    """The storage (or mixture) a mode reads, written under ``path`` the first time."""
    documents = mode.endswith("documents") and mode != "mixture-packed"
    write = write_documents if documents else write_tokens
    if not mode.startswith("mixture"):
        return write(path / "single") if not (path / "single").exists() else reopen(path / "single", documents)
    parts = {}
    for number, name in enumerate(("web", "code")):
        where = path / name
        if where.exists():
            parts[name] = reopen(where, documents)
        elif documents:
            parts[name] = write_documents(where, shards=(1, 4) if number else SHARDS)
        else:
            parts[name] = write_tokens(where, seed=number + 1, shards=(1, 4) if number else SHARDS)
    return Mixture(parts, {"web": 2, "code": 1}, block_size=6, samples_per_epoch=40)


def reopen(path: Path, documents: bool) -> Any:
    return DocumentStorage(path, DocumentJsonFormat()) if documents else TokenStorage(path)


def open_loader(mode: str, path: Path, **options: Any) -> StatefulDataLoader:
    settings = {"device": "cpu", "local_batch_size": 3, "shuffle": True, "seed": 5, **MODES[mode], **options}
    return StatefulDataLoader.from_storage(storage_of(mode, path), **settings)


def readers_of(mode: str, path: Path) -> dict[str | None, Any]:
    """A reader of each storage the mode reads, by component name (None: the storage alone)."""
    storage = storage_of(mode, path)
    if isinstance(storage, Mixture):
        return {name: part.sync_reader() for name, part in storage.components.items()}
    return {None: storage.sync_reader()}


def global_index(reader: Any, shard: int, record: int) -> int:
    """The reader's global index of a shard's record (shards in ascending id)."""
    before = 0
    with_ids = sorted({int(info.id): int(info.record_count) for info in reader.infos}.items())
    for shard_id, count in with_ids:
        if shard_id == shard:
            assert 0 <= record < count, (shard, record, count)
            return before + record
        before += count
    raise AssertionError(f"shard {shard} is not in the storage")


def rebuilt(sample: dict[str, Any], readers: dict[str | None, Any]) -> Any:
    """A sample built again from its explained pieces, through ``reader.read``: tokens, or decoded records."""
    reader = readers[sample["component"]]
    parts = []
    for piece in sample["pieces"]:
        index = global_index(reader, piece["shard"], piece["record"])
        assert piece["index"] == index  # the index reader.read() takes, as explain gives it
        record = reader.read(index)
        if isinstance(record, np.ndarray):
            parts.append(record[piece["start"] : piece["stop"]])
        else:
            assert (piece["start"], piece["stop"]) == (0, None)
            parts.append(record)
    return np.concatenate(parts) if parts and isinstance(parts[0], np.ndarray) else parts


def assert_explains(explained: dict[str, Any], batch: Any, readers: dict[str | None, Any]) -> None:
    """Every row of ``batch`` is what its explained pieces hold (padding after the pieces of a packed row)."""
    samples = explained["samples"]
    if isinstance(batch, list):  # documents: the decoded records
        assert len(samples) == len(batch)
        for sample, record in zip(samples, batch, strict=True):
            assert rebuilt(sample, readers) == [record]
            (piece,) = sample["pieces"]
            assert (record["shard"], record["record"]) == (piece["shard"], piece["record"])
        return
    rows = batch["input_ids"] if isinstance(batch, dict) else batch
    assert isinstance(rows, torch.Tensor) and len(samples) == len(rows)
    for sample, row in zip(samples, rows.tolist(), strict=True):
        tokens = rebuilt(sample, readers).tolist()
        assert row[: len(tokens)] == tokens
        assert row[len(tokens) :] == [0] * (len(row) - len(tokens))  # the padding of a packed row
        expected = [token(p["shard"], p["record"], o) for p in sample["pieces"] for o in range(p["start"], p["stop"])]
        assert tokens == expected  # the ids themselves say where they live


def grown_after_one_batch(path: Path) -> tuple[Callable[[], StatefulDataLoader], dict[str, Any], int]:
    """A storage read for one batch, its state, and then a shard added: a loader maker, the state and the
    batches left in the state's epoch."""
    storage = write_tokens(path, shards=(0, 1))

    def open_tokens() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=16)

    with open_tokens() as loader:
        next(iter(loader))
        state, rest = loader.state_dict(), len(loader) - 1
    with storage.sync_writer() as writer:
        writer.append(9, token(9, 0, np.arange(40)))
    return open_tokens, state, rest
