"""Record lengths from an object store without the shards' data: one ranged read of each shard object's tail,
kept in the machine's cache directory, the server counting what every reader asked for."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from guideloom import CorruptStorageError, DocumentStorage, StatefulDataLoader
from guideloom._shards.checkpoints import CHECKPOINT_BYTES, checkpoints_size
from guideloom._shards.footer import decode_footer
from tests.documents.records import identifier, record, record_lengths
from tests.helpers.storages import RawFormat
from tests.remote.conftest import ServiceStorage

SHARDS, PER_SHARD = 6, 50
LENGTHS = record_lengths(SHARDS * PER_SHARD, seed=4, longest=200)


class CountedFormat(RawFormat):
    """Raw records whose length is what follows their 4-byte id: recorded per record, unlike a byte size."""

    name = "counted-raw-bytes"

    def length(self, data: bytes) -> int:
        return len(data) - 4


def remote(
    url: str, service: ServiceStorage, cache: Path, measured: bool = True, **options: Any
) -> DocumentStorage[Any, Any]:
    document_format = CountedFormat() if measured else RawFormat()
    return DocumentStorage(url, document_format, storage_options=service.options, cache_dir=cache, **options)


def write(storage: DocumentStorage[Any, Any], lengths: list[int] = LENGTHS) -> None:
    with storage.sync_writer() as writer:
        for index, length in enumerate(lengths):
            writer.append(index // PER_SHARD, record(index, length))


def expected(measured: bool = True) -> list[int]:
    return [length - 4 if measured else length for length in LENGTHS]


def all_lengths(storage: DocumentStorage[Any, Any]) -> list[int]:
    with storage.sync_reader() as reader:
        return [length for position in range(len(reader.infos)) for length in reader.shard_lengths(position).tolist()]


@pytest.mark.parametrize("measured", [True, False], ids=["recorded", "record-sizes"])
def test_lengths_are_read_from_each_shards_tail_without_its_data(
    service: ServiceStorage, tmp_path: Path, measured: bool
) -> None:
    write(remote(service.url, service, tmp_path / "writer", measured))
    storage = remote(service.url, service, tmp_path / "reader", measured)
    before = len(service.requests())
    assert all_lengths(storage) == expected(measured)  # recorded ones, or record sizes from the offsets
    tails = service.ranged_gets(".shard")
    assert service.gets(".shard") == []
    assert len(tails) == SHARDS and len(set(tails)) == SHARDS
    requests = len(service.requests()) - before
    # a tail: the footer, 8 bytes a record for the offsets and 8 for the lengths; the records are far larger
    rows = storage.snapshot().rows
    tails_bytes = rows["size"] - (rows["element_count"] + 7) // 8 * 8
    assert int(tails_bytes.sum()) < 0.25 * int(rows["size"].sum())
    assert requests <= SHARDS + 3, service.requests()[before:]  # the header, index, listing, tails


def test_one_records_length_is_read_from_its_shards_tail(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    with remote(service.url, service, tmp_path / "reader").sync_reader() as reader:
        indices = [0, 2 * PER_SHARD + 7]
        assert [reader.length(index) for index in indices] == [expected()[index] for index in indices]
    assert service.gets(".shard") == []  # no shard's data downloaded
    assert len(service.ranged_gets(".shard")) == 2


def test_a_shard_position_out_of_range_is_an_index_error(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    with remote(service.url, service, tmp_path / "reader").sync_reader() as reader:
        for position in (-1, SHARDS):
            with pytest.raises(IndexError, match=f"shard position {position} is out of range for {SHARDS} shards"):
                reader.shard_lengths(position)


def test_a_machine_reads_each_tail_once_ever(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    assert all_lengths(remote(service.url, service, tmp_path / "machine")) == expected()
    before = len(service.reads(".shard"))
    assert all_lengths(remote(service.url, service, tmp_path / "machine")) == expected()  # another reader, same cache
    assert service.reads(".shard")[before:] == []
    assert len(list((tmp_path / "machine").rglob("*.lengths"))) == SHARDS  # a small side file per shard


def read_lengths_in_a_process(url: str, options: dict[str, Any], cache: str, out: Any) -> None:
    storage = DocumentStorage(url, CountedFormat(), storage_options=options, cache_dir=cache)
    out.put(all_lengths(storage))


def test_processes_of_a_machine_read_each_tail_once_between_them(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    processes = [
        context.Process(
            target=read_lengths_in_a_process, args=(service.url, service.options, str(tmp_path / "machine"), out)
        )
        for _ in range(3)
    ]
    for process in processes:
        process.start()
    results = [out.get(timeout=120) for _ in processes]
    for process in processes:
        process.join()
    assert results == [expected()] * 3
    tails = service.ranged_gets(".shard")
    assert sorted(tails) == sorted(set(tails)) and len(tails) == SHARDS  # each tail read by one process


def test_a_cached_shard_gives_its_lengths_without_a_request(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    storage = remote(service.url, service, tmp_path / "machine")
    with storage.sync_reader() as reader:
        first_shard = [identifier(reader.read(index)) for index in range(PER_SHARD)]  # downloads shard 0
    assert first_shard == list(range(PER_SHARD))
    assert all_lengths(storage) == expected()
    tails = service.ranged_gets(".shard")
    assert len(tails) == SHARDS - 1 and not any(name.endswith("000000000000.shard") for name in tails)


def overwrite_object(service: ServiceStorage, url: str, name: str, change: Any) -> None:
    """Replace a shard object's bytes in place on the store (its listing marker stays: the same facts)."""
    assert url == service.url
    raw = bytearray(service.object_bytes(f"shards/{name}"))
    change(raw)
    service.put_object(f"shards/{name}", bytes(raw))


@pytest.mark.parametrize(
    ("before_checkpoints", "message"),
    [(8 * PER_SHARD + 8, "its record index is damaged"), (8, "its record lengths are damaged")],
    ids=["offsets", "lengths"],
)
def test_a_damaged_tail_is_named(
    service: ServiceStorage, tmp_path: Path, before_checkpoints: int, message: str
) -> None:
    write(remote(service.url, service, tmp_path / "writer"))

    def damage(raw: bytearray) -> None:
        footer = decode_footer(bytes(raw[-64:]))
        assert footer is not None
        # The number ``before_checkpoints`` bytes before the checkpoints (the last section before the footer).
        where = len(raw) - 64 - checkpoints_size(footer.data_size, CHECKPOINT_BYTES) - before_checkpoints
        raw[where + 7] = 0xFF  # the last byte of a little-endian number: an offset out of order, a negative length

    overwrite_object(service, service.url, "000000000002.shard", damage)
    with remote(service.url, service, tmp_path / "reader").sync_reader() as reader:
        assert reader.shard_lengths(1).tolist() == expected()[PER_SHARD : 2 * PER_SHARD]
        with pytest.raises(
            CorruptStorageError, match=rf"shard 2 has a damaged tail \(\w+://.*000000000002\.shard.*{message}"
        ):
            reader.shard_lengths(2)
    assert not list((tmp_path / "reader").rglob("000000000002.*.lengths"))  # nothing kept of it


def test_a_shard_cut_short_after_the_listing_is_named(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    with remote(service.url, service, tmp_path / "reader").sync_reader() as reader:
        overwrite_object(service, service.url, "000000000001.shard", lambda raw: raw.__delitem__(slice(100, None)))
        # gcp-storage-emulator answers a range past an object's end with no bytes, where GCS answers 416
        ends = "its tail is 0 bytes" if service.name == "gcs" else "the object ends before its tail"
        with pytest.raises(CorruptStorageError, match=rf"shard 1 has a damaged tail .*{ends}"):
            reader.shard_lengths(1)


def test_a_replaced_shard_is_not_served_stale_lengths(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    assert all_lengths(remote(service.url, service, tmp_path / "machine")) == expected()
    for name in service.object_names():
        if name.startswith("shards/000000000000"):
            service.delete_object(name)  # the shard and its marker
    with remote(service.url, service, tmp_path / "writer").sync_writer() as writer:
        for index in range(PER_SHARD):
            writer.append(0, record(index, 10 + index))  # shard 0 again, other records
    lengths = all_lengths(remote(service.url, service, tmp_path / "machine"))
    assert lengths == list(range(6, 6 + PER_SHARD)) + expected()[PER_SHARD:]


def test_a_compressed_storage_reads_lengths_from_its_shards(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer", compression="zstd"))
    assert all_lengths(remote(service.url, service, tmp_path / "reader")) == expected()
    assert service.ranged_gets(".shard") == []  # a compressed object cannot be read by range
    assert len(service.gets(".shard")) == SHARDS


def rows(samples: list[Any]) -> list[list[int]]:
    return [[identifier(data) for data in row] for row in samples]


def test_packed_records_are_packed_without_downloading_shards(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    storage = remote(service.url, service, tmp_path / "machine")
    options: dict[str, Any] = {"device": "cpu", "pack_documents": True, "sequence_length": 400, "local_batch_size": 2}
    with StatefulDataLoader.from_storage(storage, rows, shuffle=True, seed=1, **options) as loader:
        assert service.gets(".shard") == []
        assert len(service.ranged_gets(".shard")) == SHARDS
        read = [index for batch in loader for row in batch for index in row]
    assert sorted(read) == list(range(SHARDS * PER_SHARD))
    with StatefulDataLoader.from_storage(storage, rows, shuffle=True, seed=1, **options) as loader:
        assert len(service.ranged_gets(".shard")) == SHARDS  # the machine kept the tails
        assert [index for batch in loader for row in batch for index in row] == read


def test_clean_removes_lengths_a_dead_process_left_half_written(service: ServiceStorage, tmp_path: Path) -> None:
    write(remote(service.url, service, tmp_path / "writer"))
    storage = remote(service.url, service, tmp_path / "machine")
    assert all_lengths(storage) == expected()
    (kept,) = list((tmp_path / "machine").rglob("000000000000.*.lengths"))
    left = kept.with_name(f"{kept.name}.4242.deadbeef.part")
    left.write_bytes(b"half")
    assert str(left) in storage.clean_leftovers(older_than=0)
    assert not left.exists() and kept.exists()
