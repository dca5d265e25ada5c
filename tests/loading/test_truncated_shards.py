"""A shard truncated under a loader's worker processes is a CorruptStorageError naming it, even when it kills one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from guideloom import CorruptStorageError, DocumentStorage, StatefulDataLoader
from tests.helpers.storages import RawFormat

SHARDS = 3


class TruncatingFormat(RawFormat):
    """Raw records; once the file ``truncate-now`` exists beside the storage, decoding a batch first truncates
    every shard file (as a damaged disk or a stray tool would, while the batch's records are mapped) and then
    reads the records: the reading worker process is killed by SIGBUS, as it would be by a truncation a moment
    later than its size check."""

    name = "truncating-raw"

    def unpack_many(self, encoded_data: list[memoryview], shards: list[int]) -> list[bytes]:
        storage = Path(os.environ["TRUNCATED_STORAGE"])
        if (storage.parent / "truncate-now").exists():
            for file in (storage / "shards").iterdir():
                os.truncate(file, 0)
        return [bytes(view) for view in encoded_data]


@pytest.fixture
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DocumentStorage[bytes, bytes]:
    monkeypatch.setenv("TRUNCATED_STORAGE", str(tmp_path / "documents"))
    storage = DocumentStorage(tmp_path / "documents", TruncatingFormat())
    with storage.sync_writer() as writer:
        for record in range(30):
            writer.append(record % SHARDS, b"record %d " % record * 50)
    return storage


def _loader(storage: DocumentStorage[bytes, bytes]) -> StatefulDataLoader:
    # One worker: after an epoch it has every shard mapped, and the next epoch's first batch is its next batch.
    return StatefulDataLoader.from_storage(storage, list, device="cpu", local_batch_size=4, num_workers=1)


def test_a_shard_truncated_between_batches_is_named_by_its_size_check(
    storage: DocumentStorage[bytes, bytes], tmp_path: Path
) -> None:
    with _loader(storage) as loader:
        assert len(list(loader)) == 8  # every shard is mapped in the worker now
        shard = tmp_path / "documents" / "shards" / "000000000001.shard"
        size = shard.stat().st_size
        os.truncate(shard, size // 2)
        with pytest.raises(CorruptStorageError, match=rf"shard 1 \({shard}: {size // 2} of its {size} bytes\)"):
            next(iter(loader))


def test_a_worker_killed_by_a_bus_error_is_reported_with_its_mapped_shards(
    storage: DocumentStorage[bytes, bytes], tmp_path: Path
) -> None:
    shards = tmp_path / "documents" / "shards"
    sizes = {shard: (shards / f"{shard:012d}.shard").stat().st_size for shard in range(SHARDS)}
    with _loader(storage) as loader:
        assert len(list(loader)) == 8
        (tmp_path / "truncate-now").touch()
        with pytest.raises(CorruptStorageError) as raised:
            next(iter(loader))
    message = str(raised.value)
    assert "was killed by a bus error (SIGBUS) while it had 3 shards mapped" in message
    for shard, size in sizes.items():
        assert f"shard {shard} ({shards / f'{shard:012d}.shard'}, truncated to 0 of its {size} bytes)" in message
    assert "DataLoader worker" in str(raised.value.__cause__)  # torch's own report, kept as the cause


def test_workers_that_read_sound_shards_report_nothing(storage: DocumentStorage[bytes, bytes]) -> None:
    with _loader(storage) as loader:
        first = list(loader)
        assert list(loader) == first and len(first) == 8
