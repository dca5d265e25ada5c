"""``guideloom inspect``, ``verify`` and ``clean`` on a storage URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guideloom import TokenStorage
from guideloom._cli import main
from tests.remote.conftest import ServiceStorage


@pytest.fixture
def written(service: ServiceStorage, tmp_path: Path) -> list[str]:
    """The storage's URL and ``--storage-options`` for the test server."""
    with TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path).sync_writer() as writer:
        writer.append(0, list(range(100)))
        writer.append(3, list(range(50)))
    return [service.url, "--storage-options", json.dumps(service.options)]


def test_inspect_a_url_reads_only_the_listing(
    written: list[str], service: ServiceStorage, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", *written, "--shards"]) == 0
    out = capsys.readouterr().out
    assert f"path:       {written[0]}" in out
    assert "shards:     2" in out and "tokens:     150" in out
    assert service.gets("/shards/") == []


def test_inspect_a_url_with_its_cache_shows_what_the_cache_holds(
    written: list[str], service: ServiceStorage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "machine"
    storage = TokenStorage(written[0], storage_options=service.options, cache_dir=cache)
    with storage.open_reader() as reader:
        reader.read(0)  # shard 0 downloaded whole
    size = int(storage.snapshot().rows["size"][0])
    assert main(["inspect", *written, "--cache", str(cache), "--cache-limit", str(4 * size)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("cache:"))
    assert line.endswith(f": 1 of 2 shards whole, 0 parts of shards, {size:,} bytes of a {4 * size:,}-byte limit (25%)")


def test_inspect_a_local_path_refuses_a_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path), "--cache", str(tmp_path)]) == 2
    assert "--cache and --cache-limit apply to URLs only" in capsys.readouterr().err


def test_inspect_lengths_of_a_url_reads_the_shards_tails_only(
    written: list[str], service: ServiceStorage, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", *written, "--lengths"]) == 0
    assert "tokens per document: 2 documents (0 empty), min 50, mean 75.0, max 100" in capsys.readouterr().out
    assert service.gets("/shards/") == []
    assert len(service.ranged_gets("/shards/")) == 2


def test_verify_a_url_names_a_damaged_shard(
    written: list[str], service: ServiceStorage, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", *written]) == 0
    assert "ok: 2 shards" in capsys.readouterr().out
    key = "shards/000000000003.shard"
    damaged = bytearray(service.object_bytes(key))
    damaged[0] ^= 1
    service.put_object(key, bytes(damaged))
    assert main(["verify", *written]) == 1
    assert "CORRUPT shard 3: data bytes 0.." in capsys.readouterr().out  # the piece holding the flipped bit


def test_clean_a_url(written: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clean", *written]) == 0
    assert "removed 0 leftover files" in capsys.readouterr().out


def test_storage_options_on_a_local_path_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path), "--storage-options", "{}"]) == 2
    assert "apply to URLs only" in capsys.readouterr().err
