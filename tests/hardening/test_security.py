"""Security: decoding runs no code, names and paths from disk stay inside the storage, sizes are bounded.

A storage may come from elsewhere (a downloaded dataset, a shared file system): its files are
untrusted input. Pickle storages are the documented exception; they warn once that they must be
trusted.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from guideloom import (
    CorruptStorageError,
    DocumentJsonFormat,
    DocumentMsgpackFormat,
    DocumentPickleFormat,
    DocumentStorage,
    FormatMismatchError,
    GuideloomError,
    TokenStorage,
    UntrustedFormatWarning,
)
from guideloom.types import DocumentStorageFormat
from tests.hardening.campaigns import tally
from tests.helpers.batches import comparable
from tests.helpers.shard_files import CRAFTED_SHARD_NAMES, rewrite_footer, set_offset, shard_file
from tests.helpers.storages import RawFormat, open_storage

KINDS = ("documents", "tokens")


class _Payload:
    """Unpickling this writes the sentinel file: the proof that decoding ran code."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return Path.write_text, (self.sentinel, "code ran")


def live_payload(sentinel: Path) -> bytes:
    """A pickle that runs code when loaded (checked here: it does)."""
    payload = pickle.dumps(_Payload(sentinel), protocol=pickle.HIGHEST_PROTOCOL)
    pickle.loads(payload)
    assert sentinel.read_text() == "code ran"
    sentinel.unlink()
    return payload


def raw_records_under(name: str) -> type[DocumentStorageFormat[bytes, bytes]]:
    """A format that writes raw bytes under another format's identity: forged records."""

    class Forged(RawFormat):
        pass

    Forged.name = name
    return Forged


def make(path: Path, kind: str) -> list[Any]:
    """Shards 0, 1, 2 of raw-bytes documents or uint16 tokens; the records, as read."""
    rng = np.random.default_rng(0)
    with open_storage(path, kind).sync_writer() as writer:
        for shard, count in enumerate((3, 4, 2)):
            for _ in range(count):
                size = int(rng.integers(0, 30))
                writer.append(
                    shard, rng.integers(0, 2**16, size, dtype=np.uint16) if kind == "tokens" else rng.bytes(size)
                )
    with open_storage(path, kind).sync_reader() as reader:
        return [comparable(record) for record in reader]


def read(path: Path, kind: str) -> list[Any]:
    with open_storage(path, kind).sync_reader() as reader:
        return [comparable(record) for record in reader]


# ----------------------------------------------------------------------------- decoding runs no code


def test_json_and_msgpack_records_that_carry_pickles_stay_data(tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    payload = live_payload(sentinel)
    records = [
        {"data": payload.hex(), "__reduce__": "os.system", "py/reduce": [{"py/function": "os.system"}, ["id"]]},
        {"__class__": "pathlib.Path", "py/object": "builtins.eval", "args": ["1+1"]},
        ["__import__('os').system('id')", payload.decode("latin-1")],
    ]
    json_storage = DocumentStorage(tmp_path / "json", DocumentJsonFormat())
    msgpack_storage = DocumentStorage(tmp_path / "msgpack", DocumentMsgpackFormat())
    for storage in (json_storage, msgpack_storage):
        with storage.sync_writer() as writer:
            for record in records:
                writer.append(0, record)
    with msgpack_storage.sync_writer() as writer:  # bytes and extension types stay bytes and ExtType
        writer.append(1, {"payload": payload, "ext": msgpack.ExtType(1, payload)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither format warns: they are safe for untrusted data
        with json_storage.sync_reader() as reader:
            assert list(reader) == records
        with msgpack_storage.sync_reader() as reader:
            assert list(reader)[:3] == records
            assert reader.read(3) == {"payload": payload, "ext": msgpack.ExtType(1, payload)}
    assert not sentinel.exists()


@pytest.mark.parametrize("format_class", [DocumentJsonFormat, DocumentMsgpackFormat])
def test_forged_pickle_bytes_under_a_safe_format_run_no_code(tmp_path: Path, format_class: type) -> None:
    """Records whose bytes ARE a pickle, in a storage that says JSON/MessagePack: decoding them runs nothing."""
    sentinel = tmp_path / "sentinel"
    payload = live_payload(sentinel)
    forged = raw_records_under(format_class.name)
    storage = DocumentStorage(tmp_path / "forged", forged())
    with storage.sync_writer() as writer:
        for record in (payload, payload[:-1], b"\x80" + payload, payload * 2, msgpack.packb(payload)):
            writer.append(0, record)
    decoded = 0
    with DocumentStorage(tmp_path / "forged", format_class()).sync_reader() as reader:
        for index in range(len(reader)):
            try:
                reader.read(index)
                decoded += 1
            except (ValueError, TypeError, msgpack.UnpackException):  # a decoding error: data, not code
                pass
    assert not sentinel.exists(), "decoding ran the pickle's code"
    tally("security", forged_pickle_records=5, decoded_as_data=decoded)


def test_msgpack_length_bombs_allocate_nothing_large(tmp_path: Path) -> None:
    """Records claiming 4-billion-element arrays, maps, strings: a decode error, not an allocation."""
    forged = raw_records_under("msgpack")
    bombs = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"]
    bombs.append(b"\x91" * 100_000)  # nesting deeper than any stack
    with DocumentStorage(tmp_path / "bombs", forged()).sync_writer() as writer:
        for bomb in bombs:
            writer.append(0, bomb)
    with DocumentStorage(tmp_path / "bombs", DocumentMsgpackFormat()).sync_reader() as reader:
        for index in range(len(reader)):
            tracemalloc.start()
            try:
                with pytest.raises((ValueError, msgpack.UnpackException)):
                    reader.read(index)
                assert tracemalloc.get_traced_memory()[1] < 4 << 20
            finally:
                tracemalloc.stop()
    tally("security", size_bombs=len(bombs))


def pickle_storage_from_elsewhere(path: Path, record: object) -> DocumentStorage[Any, Any]:
    """A pickle storage this process did not write: written beside ``path``, then copied there."""
    with DocumentStorage(path.with_name(f"{path.name}-source"), DocumentPickleFormat()).sync_writer() as writer:
        writer.append(0, record)
    shutil.copytree(path.with_name(f"{path.name}-source"), path)
    return DocumentStorage(path, DocumentPickleFormat())


def test_pickle_storages_warn_once_that_they_must_be_trusted(tmp_path: Path) -> None:
    storage = pickle_storage_from_elsewhere(tmp_path / "pickled", {"a": 1})
    with pytest.warns(UntrustedFormatWarning, match=r"(?i)pickle.*(trust|arbitrary code)") as caught:
        with storage.sync_reader() as reader:
            assert reader.read(0) == {"a": 1}
    assert len(caught) == 1
    assert issubclass(UntrustedFormatWarning, UserWarning)
    assert caught[0].filename == __file__, "the warning should point at the caller's line"
    assert str(tmp_path / "pickled") in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with DocumentStorage(tmp_path / "pickled", DocumentPickleFormat()).sync_reader() as reader:  # once
            assert len(reader) == 1
    other = pickle_storage_from_elsewhere(tmp_path / "other", 1)
    with pytest.warns(UntrustedFormatWarning):
        other.sync_reader().close()


# ----------------------------------------------------------------------------- names and paths from disk


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("content", ["copy", "symlink"])
def test_crafted_shard_names_are_ignored(tmp_path: Path, kind: str, content: str) -> None:
    """Files whose names are not exactly 12 ASCII digits + '.shard' are never read, even holding a valid shard."""
    path = tmp_path / "storage"
    pristine = make(path, kind)
    failures = {}
    for name in CRAFTED_SHARD_NAMES:
        crafted = path / "shards" / name
        if content == "copy":
            shutil.copyfile(shard_file(path, 1), crafted)
        else:
            crafted.symlink_to(shard_file(path, 1))
        try:
            records = read(path, kind)
            if records != pristine:
                failures[name] = f"read {len(records)} records instead of {len(pristine)}"
        except GuideloomError as error:
            failures[name] = f"{type(error).__name__}: {error}"
        crafted.unlink()
    tally("security", crafted_names=len(CRAFTED_SHARD_NAMES))
    assert failures == {}


def test_shard_files_outside_shards_dir_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "storage"
    pristine = make(path, "documents")
    shutil.copyfile(shard_file(path, 1), tmp_path / "000000000005.shard")  # next to the storage: ../x.shard
    shutil.copyfile(shard_file(path, 1), path / "000000000005.shard")
    shutil.copyfile(shard_file(path, 1), path / "incomplete" / "000000000005.shard")
    (path / "shards" / "nested").mkdir()
    shutil.copyfile(shard_file(path, 1), path / "shards" / "nested" / "000000000005.shard")
    assert read(path, "documents") == pristine


@pytest.mark.parametrize("kind", KINDS)
def test_symlinked_shard_file_is_corrupt_storage_error(tmp_path: Path, kind: str) -> None:
    """Even a symlink to a valid copy of the very same shard is refused: shard files must be regular files."""
    path = tmp_path / "storage"
    make(path, kind)
    outside = tmp_path / "elsewhere.shard"
    shutil.move(shard_file(path, 1), outside)
    shard_file(path, 1).symlink_to(outside)
    with pytest.raises(CorruptStorageError, match="shard 1"):
        read(path, kind)


@pytest.mark.parametrize("link", ["to the shard, moved elsewhere", "looping"])
def test_a_symlink_in_shards_is_named_as_one(tmp_path: Path, link: str) -> None:
    """Refused, not followed (a storage's files are guideloom's own), and named as a link: it was "Too many levels of
    symbolic links", the error of a looping path."""
    path = tmp_path / "storage"
    make(path, "documents")
    shard = shard_file(path, 1)
    target = str(tmp_path / "elsewhere.shard") if link != "looping" else shard.name
    shutil.move(shard, target) if link != "looping" else shard.unlink()
    shard.symlink_to(target)
    named = (
        f"shard 1 is a symbolic link ({shard} -> {target}), not a shard file: guideloom writes no links, so it "
        "follows none; put the shard file itself in its place"
    )
    with pytest.raises(CorruptStorageError) as caught:
        read(path, "documents")
    assert str(caught.value) == named
    completed = subprocess.run(
        [sys.executable, "-m", "guideloom", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    assert (completed.returncode, completed.stdout.splitlines()[0]) == (1, f"CORRUPT {named}"), completed


def test_symlinked_shards_directory_exposes_no_foreign_file(tmp_path: Path) -> None:
    """``shards/`` pointing elsewhere: files there are read only if they are valid shards of this storage."""
    path = tmp_path / "storage"
    make(path, "documents")
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "id_rsa").write_bytes(b"-----BEGIN PRIVATE KEY-----" + bytes(100))
    (foreign / "000000000000.shard").write_bytes(b"-----BEGIN PRIVATE KEY-----" + bytes(100))
    shutil.rmtree(path / "shards")
    (path / "shards").symlink_to(foreign)
    with pytest.raises(CorruptStorageError, match="shard 0"):
        read(path, "documents")
    (foreign / "000000000000.shard").unlink()
    (problem,) = open_storage(path, "documents").verify()
    assert "made for another shards/ directory" in problem  # the index's records are named, not trusted
    assert read(path, "documents") == []  # the shard files are the commits: the index cannot stand in for them


# A hang fails this test, in this process (the cap) or in a command (its own 20 s); the cap leaves room for the three
# commands' interpreters to start on a machine busy with the suite's other workers (30 s did not, with four of them).
@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", ["fifo", "directory", "symlink-loop", "dangling-symlink"])
def test_special_files_instead_of_a_shard_or_header_are_errors_not_hangs(tmp_path: Path, what: str) -> None:
    for victim in ("shard", "header", "shards-dir"):
        path = tmp_path / victim / "storage"
        make(path, "documents")
        target = {"shard": shard_file(path, 1), "header": path / "guideloom.json", "shards-dir": path / "shards"}[
            victim
        ]
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        if what == "fifo":
            os.mkfifo(target)
        elif what == "directory":
            target.mkdir()
        elif what == "symlink-loop":
            target.symlink_to(target)
        else:
            target.symlink_to(tmp_path / "nowhere")
        expected: tuple[type[BaseException], ...] = (CorruptStorageError,)
        if what == "dangling-symlink" and victim == "header":
            expected = (CorruptStorageError, FileNotFoundError)  # StorageNotFoundError is a FileNotFoundError
        emptied = victim == "shards-dir" and what in ("directory", "dangling-symlink")
        if emptied:  # an empty (or missing) shards/: the shard files are the commits, and none is left
            assert read(path, "documents") == []
        else:
            with pytest.raises(expected):
                read(path, "documents")
        completed = subprocess.run(
            [sys.executable, "-m", "guideloom", "verify", str(path)], capture_output=True, text=True, timeout=20
        )
        assert completed.returncode in ((0, 1) if emptied else (1, 2)), completed
        assert "Traceback" not in completed.stderr, completed.stderr


# ----------------------------------------------------------------------------- clean-up stays inside


def test_clean_never_deletes_outside_the_storage(tmp_path: Path) -> None:
    """An ``incomplete/`` that is a symlink (a crafted storage) must not make ``clean`` delete its target's files."""
    path = tmp_path / "storage"
    make(path, "documents")
    victim = tmp_path / "home"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    shutil.rmtree(path / "incomplete")
    (path / "incomplete").symlink_to(victim)
    storage = DocumentStorage(path, RawFormat())
    try:
        removed = storage.clean_leftovers(older_than=0)
    except CorruptStorageError:
        removed = []
    assert (victim / "thesis.tex").exists(), "clean_leftovers deleted a file outside the storage"
    assert removed == []
    completed = subprocess.run(
        [sys.executable, "-m", "guideloom", "clean", str(path), "--older-than", "0"], capture_output=True, text=True
    )
    assert (victim / "thesis.tex").exists()
    assert completed.returncode == 1 and "Traceback" not in completed.stderr, (
        completed
    )  # refused: the storage is damaged


def test_clean_removes_links_not_their_targets_and_survives_directories(tmp_path: Path) -> None:
    path = tmp_path / "storage"
    make(path, "documents")
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (path / "incomplete" / "000000000009.shard.host.1.abc").symlink_to(victim)
    (path / "incomplete" / "a-directory").mkdir()
    (path / "incomplete" / "000000000008.shard.host.1.abc").write_bytes(b"left by a dead writer")
    removed = DocumentStorage(path, RawFormat()).clean_leftovers(older_than=0)
    assert victim.read_text() == "keep me"
    assert {p.name for p in removed} == {"000000000009.shard.host.1.abc", "000000000008.shard.host.1.abc"}
    assert (path / "incomplete" / "a-directory").is_dir()  # not a writer's file: left alone


# ----------------------------------------------------------------------------- sizes bounded


@pytest.fixture
def peak() -> Iterator[Callable[[], int]]:
    tracemalloc.start()
    yield lambda: tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()


BOUNDED_DAMAGE: dict[str, Callable[[Path], None]] = {
    "2**60 records": lambda path: rewrite_footer(shard_file(path, 1), record_count=2**60),
    "2**64-1 records": lambda path: rewrite_footer(shard_file(path, 1), record_count=2**64 - 1),
    "2**62 data bytes": lambda path: rewrite_footer(shard_file(path, 1), data_size=2**62),
    "records and data match a huge file": lambda path: rewrite_footer(
        shard_file(path, 1), record_count=2**40, data_size=2**50
    ),
    "offset 2**63": lambda path: set_offset(shard_file(path, 1), 1, 2**63),
    "offset 2**64-1 last": lambda path: set_offset(shard_file(path, 1), 4, 2**64 - 1),
    "header 4 GiB sparse": lambda path: os.truncate(path / "guideloom.json", 1 << 32),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("damage", sorted(BOUNDED_DAMAGE))
def test_sizes_from_disk_are_bounded_before_allocating(
    tmp_path: Path, kind: str, damage: str, peak: Callable[[], int]
) -> None:
    path = tmp_path / "storage"
    make(path, kind)
    BOUNDED_DAMAGE[damage](path)
    tracemalloc.reset_peak()
    with pytest.raises(CorruptStorageError):
        read(path, kind)
    assert peak() < 512 << 10, f"{peak()} bytes allocated to refuse {damage}"
    tally("security", size_bombs=1)


def test_tokens_checked_against_dtype_and_offsets_on_read(tmp_path: Path, peak: Callable[[], int]) -> None:
    """A token storage whose index points past its data: the shard is refused when it is opened, in every read."""
    path = tmp_path / "storage"
    make(path, "tokens")
    set_offset(shard_file(path, 1), 2, 2**40)
    tracemalloc.reset_peak()
    with TokenStorage(path).sync_reader() as reader:
        with pytest.raises(CorruptStorageError, match="shard 1 has a damaged record index"):
            reader.read_tokens(0, reader.token_count)
        with pytest.raises(CorruptStorageError, match="shard 1"):
            [reader.read(index) for index in range(len(reader))]
    assert peak() < 512 << 10
    assert TokenStorage(path).verify() != []


def test_another_format_or_kind_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "storage"
    make(path, "documents")
    with pytest.raises(FormatMismatchError):
        DocumentStorage(path, DocumentPickleFormat())
    with pytest.raises(FormatMismatchError):
        TokenStorage(path)
