"""The data of ``bench_documents``: its record formats and the storages (and flat files) each part reads."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from guideloom import DocumentJsonFormat, DocumentStorage
from guideloom.types import DocumentStorageFormat

BATCH = 32
RECORDS_PER_SHARD = 10_000
FIELDS = ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")
FEATURES = 25_600  # float32: 100 KB a record
LARGE_PER_SHARD = 1_000
TRANSPORT_RECORDS = 20_000


class PreferenceFormat(DocumentStorageFormat[dict[str, Any], dict[str, Any]]):
    """An id and three lengths (uint32), then the three fields' int32 tokens; decoded a batch at a time."""

    name = "bench-preference-v1"
    head = struct.Struct("<4I")

    def pack(self, data: dict[str, Any]) -> bytes:
        fields = [np.asarray(data[name], "<i4") for name in FIELDS]
        return self.head.pack(data["id"], *map(len, fields)) + b"".join(field.tobytes() for field in fields)

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        return self.unpack_many([encoded_data], [shard])[0]

    def unpack_many(self, encoded_data: list[memoryview], shards: list[int]) -> list[dict[str, Any]]:
        """A batch decoded at once: its records copied into one buffer, every head read with one NumPy index.

        The copy is what the padding collate reads next (from the cache, not from the mapped shards), and
        the fields are views of it, so a batch keeps no shard's mapping alive."""
        words = np.frombuffer(b"".join(encoded_data), "<i4")
        sizes = np.fromiter(map(len, encoded_data), np.int64, len(encoded_data)) // 4
        starts = np.zeros(len(sizes), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        heads = words[starts[:, None] + np.arange(4)].tolist()
        records = []
        for (record_id, first, second, _), start, stop in zip(
            heads, (starts + 4).tolist(), (starts + sizes).tolist(), strict=True
        ):
            middle = start + first
            records.append(
                {
                    "id": record_id,
                    FIELDS[0]: words[start:middle],
                    FIELDS[1]: words[middle : middle + second],
                    FIELDS[2]: words[middle + second : stop],
                }
            )
        return records

    def length(self, data: dict[str, Any]) -> int:
        """The tokens the record takes in a DPO batch: the prompt twice, then each completion."""
        return preference_tokens(data)


def preference_tokens(record: dict[str, Any]) -> int:
    """A preference record's length in the DPO layout: ``2 × prompt + chosen + rejected`` tokens."""
    prompt, chosen, rejected = (len(record[name]) for name in FIELDS)
    return 2 * prompt + chosen + rejected


class FeatureFormat(DocumentStorageFormat[tuple[int, np.ndarray], tuple[int, np.ndarray]]):
    """An id (uint32), then float32 features; decoded as a NumPy view of the mapped shard."""

    name = "bench-features-v1"

    def pack(self, data: tuple[int, np.ndarray]) -> bytes:
        return struct.pack("<I", data[0]) + np.asarray(data[1], "<f4").tobytes()

    def unpack(self, encoded_data: memoryview, shard: int) -> tuple[int, np.ndarray]:
        return struct.unpack_from("<I", encoded_data)[0], np.frombuffer(encoded_data, "<f4", offset=4)


def stack_features(records: list[tuple[int, np.ndarray]]) -> dict[str, torch.Tensor]:
    """The large records' collate: ids and a (32, 25,600) float32 tensor."""
    return {
        "id": torch.tensor([record_id for record_id, _ in records]),
        "features": torch.from_numpy(np.stack([features for _, features in records])),
    }


def write_records(root: Path, count: int, per_shard: int = RECORDS_PER_SHARD) -> DocumentStorage[Any, Any]:
    """``count`` preference records of 20-600 tokens a field, as a guideloom storage (with each record's
    length, ``per_shard`` records a shard) and as the flat files of the baseline (one token file, each
    field's bounds)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 601, (count, 3))
    tokens = rng.integers(0, 32_000, int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths.reshape(-1))
    starts = ends - lengths.reshape(-1)
    storage = DocumentStorage(root / "guideloom-records", PreferenceFormat())
    with storage.sync_writer() as writer:
        for index in range(count):
            fields = [tokens[starts[3 * index + k] : ends[3 * index + k]] for k in range(3)]
            writer.append(index // per_shard, {"id": index, **dict(zip(FIELDS, fields, strict=True))})
    flat = root / "flat-records"
    flat.mkdir()
    tokens.tofile(flat / "tokens.bin")
    np.save(flat / "bounds.npy", np.stack([starts, ends], 1).reshape(count, 3, 2))
    return storage


def write_large(root: Path, count: int) -> None:
    """``count`` records of 100 KB as a guideloom storage and as one plain file per record."""
    rng = np.random.default_rng(1)
    storage = DocumentStorage(root / "guideloom-large", FeatureFormat())
    files = root / "files-large"
    files.mkdir()
    with storage.sync_writer() as writer:
        for index in range(count):
            features = rng.standard_normal(FEATURES, dtype=np.float32)
            writer.append(index // LARGE_PER_SHARD, (index, features))
            features.tofile(files / f"{index:07d}.bin")


def write_transport(root: Path) -> None:
    """Small JSON records (their ids): the transport part's batches are built from the ids alone."""
    with DocumentStorage(root / "transport", DocumentJsonFormat()).sync_writer() as writer:
        for index in range(TRANSPORT_RECORDS):
            writer.append(index // RECORDS_PER_SHARD, index)
