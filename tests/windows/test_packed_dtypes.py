"""Packed rows hold the same tokens whatever the stored dtype and the batch dtype (pieces are copied as
stored, then cast once)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from guideloom import StatefulDataLoader, TokenStorage


def packed_batches(path: Path, dtype: str, window_dtype: torch.dtype) -> list[dict[str, list[int]]]:
    rng = np.random.default_rng(7)
    storage = TokenStorage(path, dtype=dtype)
    with storage.sync_writer() as writer:
        for shard, count in ((0, 12), (2, 7)):
            for _ in range(count):
                writer.append(shard, rng.integers(4, 120, int(rng.integers(0, 30))))
    with StatefulDataLoader.from_storage(
        storage,
        device="cpu",
        local_batch_size=3,
        sequence_length=16,
        shuffle=True,
        seed=1,
        pack_documents=True,
        pad_id=3,
        window_dtype=window_dtype,
    ) as loader:
        return [{key: batch[key].tolist() for key in ("input_ids", "position_ids", "labels")} for batch in loader]


@pytest.mark.parametrize(
    ("dtype", "window_dtype"),
    [("uint8", torch.int64), ("uint16", torch.int32), ("int32", torch.int32), ("int64", torch.int64)],
)
def test_packed_rows_are_the_same_for_every_stored_dtype(tmp_path: Path, dtype: str, window_dtype: torch.dtype) -> None:
    expected = packed_batches(tmp_path / "reference", "uint32", torch.int64)
    assert packed_batches(tmp_path / dtype, dtype, window_dtype) == expected
