"""A damaged record index is a CorruptStorageError naming the shard in every mode, when the shard is opened.

A flipped byte in a shard's record offsets used to give plain windows and document boundaries wrong
answers silently and packing a NumPy error; now opening the shard checks the index (its checksum and
its offsets' order), so every way of reading says which shard is damaged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import (
    CorruptStorageError,
    DocumentJsonFormat,
    DocumentMsgpackFormat,
    DocumentPickleFormat,
    DocumentStorage,
    StatefulDataLoader,
    TokenStorage,
)
from guideloom._shards.layout import FOOTER
from tests.helpers.shard_files import shard_file

pytestmark = pytest.mark.filterwarnings("ignore::guideloom.UntrustedFormatWarning")


def _flip_offset_byte(path: Path, record: int, byte: int) -> None:
    """Flip one byte of shard 1's offset of ``record`` (byte 0 is the lowest: the offsets stay in order)."""
    file = shard_file(path)
    data = bytearray(file.read_bytes())
    data_size = FOOTER.unpack(bytes(data[-FOOTER.size :]))[5]
    data[(data_size + 7) // 8 * 8 + 8 * record + byte] ^= 0x01
    file.write_bytes(bytes(data))


def _tokens(path: Path, byte: int = 0) -> TokenStorage:
    storage = TokenStorage(path)
    generator = np.random.default_rng(0)
    with storage.sync_writer() as writer:
        for shard in range(3):
            for _ in range(80):
                writer.append(shard, generator.integers(0, 1000, int(generator.integers(20, 60)), dtype=np.uint32))
    _flip_offset_byte(path, 50, byte)
    return storage


def _read_epoch(storage: Any, **options: Any) -> None:
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4, **options) as loader:
        for _ in loader:
            pass


TOKEN_MODES = {
    "plain windows": {"sequence_length": 32},
    "document_boundaries": {"sequence_length": 32, "document_boundaries": True},
    "pack_documents": {"sequence_length": 64, "pack_documents": True},
}


@pytest.mark.parametrize("byte", [0, 5], ids=["low byte (offsets in order)", "high byte"])
@pytest.mark.parametrize("mode", sorted(TOKEN_MODES))
def test_token_windows_in_every_mode_name_the_damaged_shard(tmp_path: Path, mode: str, byte: int) -> None:
    storage = _tokens(tmp_path / "tokens", byte)
    with pytest.raises(CorruptStorageError, match=r"shard 1 has a damaged record index"):
        _read_epoch(storage, **TOKEN_MODES[mode])


@pytest.mark.parametrize("mode", sorted(TOKEN_MODES))
def test_with_workers_too(tmp_path: Path, mode: str) -> None:
    storage = _tokens(tmp_path / "tokens")
    with pytest.raises(CorruptStorageError, match=r"shard 1 has a damaged record index"):
        _read_epoch(storage, num_workers=2, shuffle=True, **TOKEN_MODES[mode])


@pytest.mark.parametrize("format", [DocumentPickleFormat, DocumentJsonFormat, DocumentMsgpackFormat])
@pytest.mark.parametrize("workers", [0, 2])
def test_documents_in_each_format_name_the_damaged_shard(tmp_path: Path, format: type, workers: int) -> None:
    storage = DocumentStorage(tmp_path / "documents", format())
    with storage.sync_writer() as writer:
        for shard in range(3):
            for record in range(80):
                writer.append(shard, {"text": "x" * (record % 7), "id": record})
    _flip_offset_byte(tmp_path / "documents", 50, 0)
    with pytest.raises(CorruptStorageError, match=r"shard 1 has a damaged record index"):
        _read_epoch(storage, num_workers=workers)
    with pytest.raises(CorruptStorageError, match=r"shard 1 has a damaged record index"):
        with storage.sync_reader() as reader:
            reader.read(100)  # shard 1 holds records 80 to 159
    assert ["shard 1" in problem for problem in storage.verify()] == [True]


def test_the_reader_and_verify_name_it_too(tmp_path: Path) -> None:
    storage = _tokens(tmp_path / "tokens")
    with pytest.raises(CorruptStorageError, match=r"shard 1 has a damaged record index .*checksum"):
        with storage.sync_reader() as reader:
            reader.read(100)  # shard 1 holds records 80 to 159
    problems = storage.verify()
    assert len(problems) == 1 and problems[0].startswith("shard 1 has a damaged record index")
