"""Checkpoints: the running CRC-32 of a shard's data at the end of every piece, so a part of it verifies alone."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import guideloom._shards.shard_in_progress
from guideloom import CorruptStorageError, DocumentStorage, FormatMismatchError, TokenStorage
from guideloom._shards.checkpoints import CHECKPOINT_BYTES, checkpoints_of, checkpoints_size, pieces_problem
from guideloom._shards.footer import FOOTER
from guideloom._shards.header import parse_header
from guideloom._shards.layout import ShardFile, shard_trailer
from guideloom._storage.storages import StorageBase
from tests.helpers.shard_files import footer_fields, rewrite_footer, shard_file
from tests.helpers.storages import RawFormat

P = 4096  # the smallest piece a header may give: small shards span several pieces
SIZES = (0, 1000, 2 * P, 2 * P + 1)  # no data, a short piece only, whole pieces, a last piece of one byte


class MeasuredRaw(RawFormat):
    """Raw bytes whose storage records a length per record."""

    name = "measured-raw"

    def length(self, data: bytes) -> int:
        return len(data) // 2


def in_small_pieces(storage: StorageBase) -> Any:
    """``storage``, to be created with pieces of ``P`` bytes (what a header may give; new storages get 4 KiB)."""
    storage.checkpoint_bytes = P
    return storage


def write(kind: str, path: Path, size: int) -> StorageBase:
    """A new storage of ``kind`` whose shard 0 holds ``size`` bytes of data, appended in records of 3000 bytes."""
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    starts = list(range(0, size, 3000)) or [0]
    if kind == "documents":
        documents = in_small_pieces(DocumentStorage(path, MeasuredRaw()))
        with documents.sync_writer() as writer:
            for start in starts:
                writer.append(0, data[start : start + 3000].tobytes())
        return documents
    tokens = in_small_pieces(TokenStorage(path, "uint8", loss_mask=kind == "masked"))
    with tokens.sync_writer() as token_writer:
        for start in starts:
            piece = data[start : start + 3000]
            token_writer.append(0, piece, loss_mask=piece % 2 == 0 if kind == "masked" else None)
    return tokens


def shard_checkpoints(storage: StorageBase, shard: int = 0) -> tuple[list[int], bytes]:
    """The checkpoints stored in a shard, and its data."""
    opened = ShardFile(storage.path, shard, storage.header_for_reading())
    try:
        assert opened.checkpoints is not None
        return opened.checkpoints.tolist(), bytes(opened.view[: opened.data_size])
    finally:
        opened.close()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["tokens", "documents", "masked"])
def test_each_checkpoint_is_the_crc_of_the_data_up_to_its_piece_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, size: int
) -> None:
    """The background thread checksums in stretches that end inside pieces: the running CRC carries over."""
    monkeypatch.setattr(guideloom._shards.shard_in_progress, "BACKGROUND_CHUNK", 5000)
    storage = write(kind, tmp_path / kind, size)
    checkpoints, data = shard_checkpoints(storage)
    assert len(data) == size
    assert checkpoints == [zlib.crc32(data[: min(end, size)]) for end in range(P, size + P, P)]
    assert storage.verify() == []


def test_a_new_storage_records_4_kib_pieces_and_flag_4(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens", "uint32")
    with storage.sync_writer() as writer:
        writer.append(0, np.arange(2_500))  # 10,000 bytes: two whole pieces and a short one
    assert json.loads((tmp_path / "tokens" / "guideloom.json").read_text())["checkpoint_bytes"] == CHECKPOINT_BYTES
    assert footer_fields(shard_file(tmp_path / "tokens", 0))[2] == 4
    checkpoints, data = shard_checkpoints(storage)
    assert checkpoints == [zlib.crc32(data[:4096]), zlib.crc32(data[:8192]), zlib.crc32(data)]


def test_shards_of_a_rolling_writer_keep_their_checkpoints_when_relabelled(tmp_path: Path) -> None:
    storage = in_small_pieces(TokenStorage(tmp_path / "tokens", "uint16"))
    with storage.sync_writer(shard_size=3 * P) as writer:
        for document in range(10):
            writer.append(np.arange(2000) + document)
    assert len(storage.committed_shards()) > 1 and storage.verify() == []
    for shard in storage.committed_shards():
        checkpoints, data = shard_checkpoints(storage, shard)
        assert checkpoints == checkpoints_of(data, P)


def test_pieces_problem_accepts_the_right_pieces_and_names_a_changed_one() -> None:
    data = np.random.default_rng(0).integers(0, 256, 5 * P + 100, dtype=np.uint8).tobytes()
    checkpoints = np.array(checkpoints_of(data, P), "<u4")
    for first, stop in [(0, 1), (0, 6), (2, 4), (5, 6), (3, 6)]:
        part = data[first * P : stop * P]
        assert pieces_problem(part, first, checkpoints, P, len(data)) is None
    changed = bytearray(data[2 * P : 5 * P])
    changed[P + 10] ^= 1  # inside piece 3
    problem = pieces_problem(changed, 2, checkpoints, P, len(data))
    assert problem == "data bytes 12288..16383 do not match their checkpoint"
    assert pieces_problem(data[P : 2 * P - 1], 1, checkpoints, P, len(data)) is not None  # ends inside a piece


def flip(file: Path, position: int) -> None:
    """Flip one bit of the byte at ``position`` of ``file``."""
    raw = bytearray(file.read_bytes())
    raw[position] ^= 0x10
    file.write_bytes(bytes(raw))


def test_verify_names_the_piece_whose_data_changed(tmp_path: Path) -> None:
    storage = write("tokens", tmp_path / "tokens", 5 * P + 10)
    flip(shard_file(tmp_path / "tokens", 0), 2 * P + 7)
    expected = f"shard 0: data bytes 8192..12287 do not match their checkpoint ({shard_file(tmp_path / 'tokens', 0)})"
    assert storage.verify() == [expected]


def test_verify_names_a_damaged_checkpoint(tmp_path: Path) -> None:
    storage = write("documents", tmp_path / "documents", 5 * P + 10)
    file = shard_file(tmp_path / "documents", 0)
    flip(file, file.stat().st_size - FOOTER.size - checkpoints_size(5 * P + 10, P) + 4)  # checkpoint 1
    assert storage.verify() == [f"shard 0: the checkpoint of data bytes 4096..8191 is damaged ({file})"]


def test_a_shard_without_its_checkpoints_section_is_refused(tmp_path: Path) -> None:
    storage = write("tokens", tmp_path / "tokens", 3 * P)
    file = shard_file(tmp_path / "tokens", 0)
    raw = file.read_bytes()
    file.write_bytes(raw[: -FOOTER.size - 8] + raw[-FOOTER.size :])  # the section (3 checkpoints, padded) cut short
    with pytest.raises(CorruptStorageError, match="shard 0 has inconsistent sizes"):
        ShardFile(tmp_path / "tokens", 0, storage.header_for_reading())


def test_a_shard_without_flag_4_in_a_storage_with_checkpoints_is_refused(tmp_path: Path) -> None:
    storage = write("tokens", tmp_path / "tokens", 100)
    rewrite_footer(shard_file(tmp_path / "tokens", 0), flags=0)
    with pytest.raises(FormatMismatchError, match="shard 0 holds no checkpoints"):
        ShardFile(tmp_path / "tokens", 0, storage.header_for_reading())


@pytest.mark.parametrize("value", [4095, 3000, 2**27, 1 << 11, True, "65536", 65536.0, None])
def test_a_header_with_unusable_checkpoint_bytes_is_corrupt(value: object) -> None:
    raw = json.dumps({"dtype": "uint16", "kind": "tokens", "layout_version": 1, "checkpoint_bytes": value}).encode()
    with pytest.raises(CorruptStorageError, match="checkpoint_bytes"):
        parse_header(raw, "guideloom.json")


OLD_HEADERS = {  # as guideloom 0.3 wrote them: no checkpoint_bytes
    "tokens": {"dtype": "uint8", "kind": "tokens", "layout_version": 1},
    "documents": {"format": "raw-bytes", "kind": "documents", "layout_version": 1},
}


def write_the_0_3_way(path: Path, kind: str, records: list[bytes]) -> None:
    """A storage of one shard as guideloom 0.3 wrote it: its header without the field, footer flags 0."""
    header = json.dumps(OLD_HEADERS[kind], sort_keys=True).encode() + b"\n"
    (path / "shards").mkdir(parents=True)
    (path / "guideloom.json").write_bytes(header)
    data = b"".join(records)
    offsets = np.concatenate([[0], np.cumsum([len(record) for record in records])]).tolist()
    trailer = shard_trailer(0, offsets, len(data), zlib.crc32(data), parse_header(header, "guideloom.json"))
    shard_file(path, 0).write_bytes(data + trailer)


@pytest.mark.parametrize("kind", ["tokens", "documents"])
def test_a_storage_written_by_0_3_is_read_and_grown_without_checkpoints(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "old"
    write_the_0_3_way(path, kind, [b"\x01\x02\x03", b"\x04\x05"])
    header = (path / "guideloom.json").read_bytes()
    storage: Any = TokenStorage(path, "uint8") if kind == "tokens" else DocumentStorage(path, RawFormat())
    with storage.sync_reader() as reader:
        assert [bytes(reader.read(i)) for i in range(len(reader))] == [b"\x01\x02\x03", b"\x04\x05"]
    with storage.sync_writer() as writer:
        writer.append(1, b"\x06" * 70_000 if kind == "documents" else np.full(70_000, 6, np.uint8))
    assert (path / "guideloom.json").read_bytes() == header
    assert footer_fields(shard_file(path, 1))[2] == 0
    assert shard_file(path, 1).stat().st_size == 70_000 + 8 * 2 + FOOTER.size
    assert storage.verify() == []
