"""Integrity: damaged files give CorruptStorageError or a verify() problem naming the shard, never a crash.

Every damaged storage is opened and read in a separate interpreter (one probe process for all
cases, restarted after a crash), so a segfault or a hang fails the case instead of the test run.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import DocumentStorage, TokenStorage
from guideloom._shards.layout import FOOTER
from tests.helpers.shard_files import footer_fields, rewrite_footer, set_offset, shard_file
from tests.helpers.storages import RawFormat

PROBE = """
import json
import sys
from pathlib import Path

from guideloom import CorruptStorageError, DocumentStorage, TokenStorage
from tests.helpers.storages import RawFormat


def probe(kind, path, mode):
    storage = TokenStorage(path) if kind == "tokens" else DocumentStorage(path, RawFormat())
    if mode == "read":
        with storage.sync_reader() as reader:
            records = [reader.read(i) for i in range(len(reader))]
            assert len(list(reader)) == len(records)
            if kind == "tokens":
                reader.read_tokens(0, reader.token_count)
                reader.window_count(3)
    return storage.verify()


for argument in sys.argv[1:]:
    name, kind, path, mode = json.loads(argument)
    print("BEGIN", name, flush=True)
    try:
        problems = probe(kind, Path(path), mode)
        result = {"outcome": "verify" if problems else "ok", "message": "; ".join(problems)}
    except CorruptStorageError as error:
        result = {"outcome": "CorruptStorageError", "message": str(error)}
    except BaseException as error:
        result = {"outcome": type(error).__name__, "message": str(error)}
    print("END", name, json.dumps(result), flush=True)
"""


def make_pristine(path: Path, kind: str) -> None:
    """Shards 0, 1, 2; shard 1 has an empty record and data that is not a multiple of 8 bytes (padding)."""
    if kind == "tokens":
        with TokenStorage(path, "uint16").sync_writer() as writer:
            for shard, documents in enumerate([[[1, 2]], [[3, 4, 5], [], [6, 7]], [[8]]]):
                for document in documents:
                    writer.append(shard, document)
    else:
        with DocumentStorage(path, RawFormat()).sync_writer() as writer:
            for shard, records in enumerate([[b"zero"], [b"one", b"", b"four"], [b"two"]]):
                for record in records:
                    writer.append(shard, record)


def truncate(size: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        file = shard_file(path)
        os.truncate(file, size(file.stat().st_size))

    return damage


def overwrite_tail(content: bytes) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        file = shard_file(path)
        data = file.read_bytes()
        file.write_bytes(data[: -len(content)] + content)

    return damage


def write_header(content: bytes) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        (path / "guideloom.json").write_bytes(content)

    return damage


def directory_instead_of_shard(path: Path) -> None:
    shard_file(path).unlink()
    shard_file(path).mkdir()


SHARD_DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated-to-0": truncate(lambda size: 0),
    "truncated-to-10": truncate(lambda size: 10),
    "truncated-by-1": truncate(lambda size: size - 1),
    "truncated-footer": truncate(lambda size: size - FOOTER.size),
    "truncated-to-half": truncate(lambda size: size // 2),
    "extended-by-8": lambda path: shard_file(path).write_bytes(shard_file(path).read_bytes() + bytes(8)),
    "footer-random": overwrite_tail(np.random.default_rng(0).bytes(FOOTER.size)),
    "footer-zeroed": overwrite_tail(bytes(FOOTER.size)),
    "footer-bad-magic": lambda path: rewrite_footer(shard_file(path), magic=b"XXXXXXXX"),
    "footer-huge-record-count": lambda path: rewrite_footer(shard_file(path), record_count=2**60),
    "footer-huge-data-size": lambda path: rewrite_footer(shard_file(path), data_size=2**62),
    "footer-other-shard-id": lambda path: rewrite_footer(shard_file(path), shard=2),
    "offset-out-of-bounds": lambda path: set_offset(shard_file(path), 1, 2**40),
    "offset-last-out-of-bounds": lambda path: set_offset(shard_file(path), 3, 2**63),
    "offsets-descending": lambda path: set_offset(shard_file(path), 2, 0),
    "directory-instead-of-shard": directory_instead_of_shard,
}
HEADER_DAMAGE: dict[str, Callable[[Path], None]] = {
    "header-truncated": write_header(b'{"kind": "documents", "lay'),
    "header-empty": write_header(b""),
    "header-random-bytes": write_header(np.random.default_rng(1).bytes(100)),
    "header-json-array": write_header(b"[1, 2]"),
    "header-unknown-kind": write_header(b'{"kind": "images", "layout_version": 1}'),
    "header-bad-dtype": write_header(b'{"dtype": "float32", "kind": "tokens", "layout_version": 1}'),
    "header-huge": write_header(b" " * (1 << 20) + b'{"kind": "tokens"}'),
}
KINDS = ("documents", "tokens")


def probe_all(run_python: Any, cases: dict[str, tuple[str, Path, str]]) -> dict[str, dict[str, str]]:
    """Probe every case; a case during which the probe died or hung gets that as its outcome."""
    results: dict[str, dict[str, str]] = {}
    while pending := [name for name in cases if name not in results]:
        arguments = [json.dumps([name, cases[name][0], str(cases[name][1]), cases[name][2]]) for name in pending]
        try:
            completed = run_python(PROBE, *arguments, timeout=120)
            output, failure = completed.stdout, f"probe died (exit status {completed.returncode}): {completed.stderr}"
        except subprocess.TimeoutExpired as error:
            stdout = error.stdout or ""
            output, failure = stdout.decode() if isinstance(stdout, bytes) else stdout, "probe hung"
        started = None
        for line in output.splitlines():
            word, _, rest = line.partition(" ")
            if word == "BEGIN":
                started = rest
            elif word == "END":
                name, _, result = rest.partition(" ")
                results[name] = json.loads(result)
                started = None
        if started is None and not any(name in results for name in pending):
            started = pending[0]  # the probe failed before its first case
        if started is not None:
            results[started] = {"outcome": failure, "message": ""}
    return results


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory, run_python: Any) -> dict[str, dict[str, str]]:
    root = tmp_path_factory.mktemp("corrupt")
    cases: dict[str, tuple[str, Path, str]] = {}
    for kind in KINDS:
        pristine = root / f"pristine-{kind}"
        make_pristine(pristine, kind)
        cases[f"{kind}/pristine"] = (kind, pristine, "read")
        for name, damage in {**SHARD_DAMAGE, **HEADER_DAMAGE}.items():
            path = Path(shutil.copytree(pristine, root / f"{kind}-{name}"))
            damage(path)
            cases[f"{kind}/{name}"] = (kind, path, "read")
        file = shard_file(pristine)
        for position in range(file.stat().st_size):
            path = Path(shutil.copytree(pristine, root / f"{kind}-flip-{position}"))
            data = bytearray(shard_file(path).read_bytes())
            data[position] ^= 1 << (position % 8)
            shard_file(path).write_bytes(bytes(data))
            cases[f"{kind}/flip/{position}"] = (kind, path, "verify")
    return probe_all(run_python, cases)


@pytest.mark.parametrize("kind", KINDS)
def test_pristine_storage_reads_and_verifies(probed: dict[str, dict[str, str]], kind: str) -> None:
    assert probed[f"{kind}/pristine"] == {"outcome": "ok", "message": ""}


@pytest.mark.parametrize("damage", sorted(SHARD_DAMAGE))
@pytest.mark.parametrize("kind", KINDS)
def test_damaged_shard_is_corrupt_storage_error(probed: dict[str, dict[str, str]], kind: str, damage: str) -> None:
    result = probed[f"{kind}/{damage}"]
    assert result["outcome"] == "CorruptStorageError", result
    assert "shard 1" in result["message"]


@pytest.mark.parametrize("damage", sorted(HEADER_DAMAGE))
@pytest.mark.parametrize("kind", KINDS)
def test_damaged_header_is_corrupt_storage_error(probed: dict[str, dict[str, str]], kind: str, damage: str) -> None:
    result = probed[f"{kind}/{damage}"]
    assert result["outcome"] == "CorruptStorageError", result
    assert "guideloom.json" in result["message"]


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, range]]:
    """Byte ranges of shard 1's file per kind: data, padding, index, footer fields, footer reserved bytes."""
    found = {}
    for kind in KINDS:
        path = tmp_path_factory.mktemp("regions") / kind
        make_pristine(path, kind)
        size = shard_file(path).stat().st_size
        record_count, data_size = footer_fields(shard_file(path))[4:6]
        index_start = (data_size + 7) // 8 * 8
        footer_start = size - FOOTER.size
        found[kind] = {
            "data": range(0, data_size),
            "padding": range(data_size, index_start),
            "index": range(index_start, index_start + 8 * (record_count + 1)),
            "footer": range(footer_start, footer_start + FOOTER.size - 8),
            "footer-reserved": range(footer_start + FOOTER.size - 8, size),
        }
    return found


@pytest.mark.parametrize("region", ["data", "padding", "index", "footer", "footer-reserved"])
@pytest.mark.parametrize("kind", KINDS)
def test_any_flipped_bit_names_the_shard(
    probed: dict[str, dict[str, str]], regions: dict[str, dict[str, range]], kind: str, region: str
) -> None:
    positions = regions[kind][region]
    assert len(positions) > 0
    undetected = {}
    for position in positions:
        result = probed[f"{kind}/flip/{position}"]
        if result["outcome"] not in ("verify", "CorruptStorageError") or "shard 1" not in result["message"]:
            undetected[position] = result
    assert undetected == {}


def test_flipped_data_bit_is_found_by_verify(storage_path: Path) -> None:
    make_pristine(storage_path, "documents")
    data = bytearray(shard_file(storage_path, 2).read_bytes())
    data[1] ^= 0x10
    shard_file(storage_path, 2).write_bytes(bytes(data))
    problems = DocumentStorage(storage_path, RawFormat()).verify()
    assert len(problems) == 1
    assert "shard 2" in problems[0]
    assert "data bytes 0.." in problems[0] and "do not match their checkpoint" in problems[0]  # the damaged piece


def test_unknown_footer_flags_with_a_valid_checksum_are_format_mismatch(tmp_path: Path) -> None:
    """A footer from a future layout (flags set, checksum right) is refused, not misread."""
    from guideloom import FormatMismatchError, TokenStorage

    storage = TokenStorage(tmp_path)
    with storage.sync_writer() as writer:
        writer.append(0, [1, 2, 3])
    shard = tmp_path / "shards" / "000000000000.shard"
    data = bytearray(shard.read_bytes())
    footer_start = len(data) - FOOTER.size
    struct.pack_into("<I", data, footer_start + 12, 1)  # flags
    struct.pack_into("<I", data, footer_start + 52, zlib.crc32(data[footer_start : footer_start + 52]))
    shard.write_bytes(bytes(data))
    with storage.sync_reader() as reader, pytest.raises(FormatMismatchError, match="flags"):
        reader.read(0)  # opening reads the listing and the index; the shard is checked when first read
