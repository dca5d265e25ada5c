"""Record lengths: a format's ``length(data)`` stored per record, read back without decoding."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import (
    CorruptStorageError,
    DocumentJsonFormat,
    DocumentMsgpackFormat,
    DocumentStorage,
    FormatMismatchError,
    RecordPackError,
    TokenStorage,
)
from guideloom._cli import main
from guideloom._shards.layout import FOOTER
from guideloom.types import DocumentStorageFormat
from tests.helpers.shard_files import shard_file
from tests.helpers.storages import make_document_storage


class TokenRecords(DocumentStorageFormat[dict[str, Any], dict[str, Any]]):
    """Records of a prompt and a response, as int32 tokens; a record's length is its token count."""

    name = "token-records-test"
    head = struct.Struct("<I")

    def pack(self, data: dict[str, Any]) -> bytes:
        prompt, response = np.asarray(data["prompt"], "<i4"), np.asarray(data["response"], "<i4")
        return self.head.pack(len(prompt)) + prompt.tobytes() + response.tobytes()

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        (split,) = self.head.unpack_from(encoded_data)
        tokens = np.frombuffer(encoded_data, "<i4", offset=self.head.size)
        return {"prompt": tokens[:split].tolist(), "response": tokens[split:].tolist()}

    def length(self, data: dict[str, Any]) -> int:
        return len(data["prompt"]) + len(data["response"])


def records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt": rng.integers(0, 99, rng.integers(0, 9)).tolist(),
            "response": rng.integers(0, 99, rng.integers(1, 30)).tolist(),
        }
        for _ in range(count)
    ]


def write(storage: DocumentStorage[Any, Any], data: list[dict[str, Any]], shards: int = 3) -> None:
    with storage.sync_writer() as writer:
        for index, record in enumerate(data):
            writer.append(index * shards // len(data), record)


def test_a_formats_length_is_stored_per_record_and_read_without_decoding(tmp_path: Path) -> None:
    data = records(40)
    storage = DocumentStorage(tmp_path / "docs", TokenRecords())
    write(storage, data)
    expected = [len(record["prompt"]) + len(record["response"]) for record in data]
    with storage.sync_reader() as reader:
        assert [reader.length(index) for index in range(len(reader))] == expected
        per_shard = [reader.shard_lengths(position) for position in range(3)]
        assert np.concatenate(per_shard).tolist() == expected
        assert all(lengths.dtype == np.int64 and not lengths.flags.writeable for lengths in per_shard)
        assert [reader.read(index) for index in range(len(reader))] == data
    assert json.loads((tmp_path / "docs" / "guideloom.json").read_text())["record_lengths"] is True


def test_built_in_formats_take_a_length_function(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentMsgpackFormat(length=lambda record: len(record["tokens"])))
    with storage.sync_writer() as writer:
        writer.append(4, {"tokens": [1, 2, 3], "id": "a"})
        writer.append(4, {"tokens": [], "id": "b"})
    with storage.sync_reader() as reader:
        assert [reader.length(0), reader.length(1)] == [3, 0]


def test_without_a_length_a_record_measures_its_bytes_and_a_token_document_its_tokens(tmp_path: Path) -> None:
    documents = make_document_storage(tmp_path / "json", count=5, shards=2)
    with documents.sync_reader() as reader:
        assert [reader.length(index) for index in range(5)] == [len(bytes(reader.read_encoded(i)[0])) for i in range(5)]
        assert reader.shard_lengths(1).tolist() == [len(b'{"id":3}'), len(b'{"id":4}')]
    assert "record_lengths" not in json.loads((tmp_path / "json" / "guideloom.json").read_text())
    tokens = TokenStorage(tmp_path / "tokens", "uint16")
    with tokens.sync_writer() as writer:
        writer.append(0, [5, 6, 7])
        writer.append(0, [8])
    with tokens.sync_reader() as reader:
        assert [reader.length(0), reader.length(1)] == [3, 1]
        assert reader.shard_lengths(0).tolist() == [3, 1]


def write_0_3_storage(path: Path, shard_records: dict[int, list[bytes]], format_name: str) -> None:
    """A document storage byte by byte as guideloom 0.3 wrote it (docs/format.md): no index, no lengths."""
    header = json.dumps({"format": format_name, "kind": "documents", "layout_version": 1}, sort_keys=True).encode()
    header += b"\n"
    (path / "shards").mkdir(parents=True)
    (path / "guideloom.json").write_bytes(header)
    for shard, payloads in shard_records.items():
        data = b"".join(payloads)
        offsets = np.cumsum([0, *map(len, payloads)]).astype("<u8").tobytes()
        body = FOOTER.pack(
            b"GLOOMSH1",
            1,
            0,
            shard,
            len(payloads),
            len(data),
            zlib.crc32(data),
            zlib.crc32(offsets),
            zlib.crc32(header),
            0,
        )[: FOOTER.size - 12]
        footer = body + struct.pack("<I", zlib.crc32(body)) + bytes(8)
        padding = bytes(-len(data) % 8)
        shard_file(path, shard).write_bytes(data + padding + offsets + footer)


def test_a_0_3_storage_reads_unchanged_its_lengths_being_byte_sizes(tmp_path: Path) -> None:
    old = [{"id": 1, "text": "old"}, {"id": 2, "text": "shards"}, {"id": 3, "text": "still read"}]
    payloads = [json.dumps(record, separators=(",", ":")).encode() for record in old]
    write_0_3_storage(tmp_path / "old", {0: payloads[:2], 5: payloads[2:]}, "json")
    storage = DocumentStorage(tmp_path / "old", DocumentJsonFormat())
    with storage.sync_reader() as reader:
        assert list(reader) == old
        assert [reader.length(index) for index in range(3)] == [len(payload) for payload in payloads]
    assert storage.verify() == []
    with storage.sync_writer() as writer:  # appending to it keeps its layout: no lengths
        writer.append(6, {"id": 4})
    with storage.sync_reader() as reader:
        assert reader.length(3) == len(b'{"id":4}')


def test_a_format_with_length_cannot_append_to_a_storage_created_without(tmp_path: Path) -> None:
    make_document_storage(tmp_path / "docs", count=2, shards=1)
    measured = DocumentStorage(tmp_path / "docs", DocumentJsonFormat(length=len))
    with measured.sync_reader() as reader:  # reading is fine: the lengths are the byte sizes
        assert reader.length(0) == len(b'{"id":0}')
    with pytest.raises(ValueError, match=r"defines length\(\).*created without record lengths"):
        measured.sync_writer()
    unmeasured = DocumentStorage(tmp_path / "measured", DocumentJsonFormat(length=len))
    write(unmeasured, [{"a": 1}], shards=1)
    with pytest.raises(ValueError, match=r"defines no length\(\).*created with record lengths"):
        DocumentStorage(tmp_path / "measured", DocumentJsonFormat()).sync_writer()


@pytest.mark.parametrize("measured_on_disk", [True, False])
def test_a_format_mismatch_names_the_record_lengths_of_each_side(tmp_path: Path, measured_on_disk: bool) -> None:
    # The side opened described the storage's lengths as its own: "opened as ... and record lengths" for a format
    # without length(), and nothing for one with it.
    write(DocumentStorage(tmp_path / "docs", DocumentJsonFormat(length=len if measured_on_disk else None)), [{"a": 1}])
    with pytest.raises(FormatMismatchError) as caught:
        DocumentStorage(tmp_path / "docs", DocumentMsgpackFormat(length=None if measured_on_disk else len))
    on_disk, opened = ("documents with format 'json'", "documents with format 'msgpack'")
    if measured_on_disk:
        on_disk += " and record lengths"
    else:
        opened += " and record lengths"
    assert str(caught.value) == f"the storage at {tmp_path / 'docs'} holds {on_disk}, but was opened as {opened}"


@pytest.mark.parametrize("bad", [-1, 2.5, "3", None, True])
def test_a_length_that_is_not_a_non_negative_int_names_shard_and_record(tmp_path: Path, bad: object) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat(length=lambda record: record["n"]))
    with storage.sync_writer() as writer:
        writer.append(2, {"n": 4})
        with pytest.raises(RecordPackError, match=r"record 1 of shard 2.*length\(\) must return"):
            writer.append(2, {"n": bad})
        writer.append(2, {"n": 0})
    with storage.sync_reader() as reader:
        assert [reader.length(0), reader.length(1)] == [4, 0]


def lengths_offset(file: Path, record: int) -> int:
    """Where record ``record``'s stored length is in a shard file with lengths."""
    fields = FOOTER.unpack(file.read_bytes()[-FOOTER.size :])
    record_count, data_size = fields[4], fields[5]
    return (data_size + 7) // 8 * 8 + 8 * (record_count + 1) + 8 * record


def test_checksums_cover_the_lengths_and_verify_names_the_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = DocumentStorage(tmp_path / "docs", TokenRecords())
    write(storage, records(12))
    file = shard_file(tmp_path / "docs", 1)
    raw = bytearray(file.read_bytes())
    raw[lengths_offset(file, 2)] ^= 0x01  # another length, still a sane one
    file.write_bytes(bytes(raw))
    [problem] = storage.verify()
    assert "shard 1" in problem and "record lengths" in problem
    assert main(["verify", str(tmp_path / "docs")]) == 1
    assert "shard 1" in capsys.readouterr().out


def test_the_lengths_are_part_of_the_storages_fingerprint(tmp_path: Path) -> None:
    fingerprints = []
    for name, length in (("tokens", lambda record: len(record["t"])), ("twice", lambda record: 2 * len(record["t"]))):
        storage = DocumentStorage(tmp_path / name, DocumentJsonFormat(length=length))
        write(storage, [{"t": [1, 2]}, {"t": [3]}], shards=1)
        with storage.sync_reader() as reader:
            fingerprints.append(reader.fingerprint)
    assert fingerprints[0] != fingerprints[1]


def test_a_negative_stored_length_is_a_corrupt_shard(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", TokenRecords())
    write(storage, records(6), shards=1)
    file = shard_file(tmp_path / "docs", 0)
    raw = bytearray(file.read_bytes())
    raw[lengths_offset(file, 3) + 7] = 0xFF  # the sign byte of a little-endian int64
    file.write_bytes(bytes(raw))
    with storage.sync_reader() as reader, pytest.raises(CorruptStorageError, match=r"shard 0.*record 3 has a negative"):
        reader.length(0)


def test_inspect_lengths_shows_the_recorded_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat(length=lambda record: record["n"]))
    write(storage, [{"n": n} for n in (0, 3, 5, 900)], shards=2)
    assert main(["inspect", str(tmp_path / "docs"), "--lengths"]) == 0
    shown = capsys.readouterr().out
    assert "length per record: 4 records (1 empty), min 0, mean 227.0, max 900" in shown
    assert "measured:   by the format's length(), stored per record" in shown
