"""``guideloom tokenize`` writing to a storage URL gives the storage it writes to a directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guideloom import TokenStorage
from guideloom._cli import main
from guideloom.tokenize import train_tokenizer
from tests.remote.conftest import ServiceStorage

TEXTS = ["the quick brown fox", "jumps over", "the lazy dog", "", "naïve café 東京"]


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[list[str], list[str]]:
    """Three JSONL files, and the options naming a tokenizer trained on their texts."""
    paths = []
    for number in range(3):
        path = tmp_path / f"part{number}.jsonl"
        path.write_text("".join(json.dumps({"text": f"{text} {number}"}) + "\n" for text in TEXTS))
        paths.append(str(path))
    tokenizer = train_tokenizer(TEXTS * 10, 300, tmp_path / "tokenizer.json")
    return paths, ["--tokenizer", str(tokenizer), "--quiet"]


def test_tokenize_into_a_url_equals_tokenize_into_a_directory(
    inputs: tuple[list[str], list[str]],
    service: ServiceStorage,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GUIDELOOM_CACHE_DIR", str(tmp_path / "cache"))
    files, common = inputs
    options = [*common, "--storage-options", json.dumps(service.options)]
    assert main(["tokenize", *files, str(tmp_path / "local"), *common, "--workers", "2"]) == 0
    assert main(["tokenize", *files, service.url, *options, "--workers", "2"]) == 0
    remote = TokenStorage(service.url, storage_options=service.options)
    with TokenStorage(tmp_path / "local").sync_reader() as local, remote.sync_reader() as reader:
        assert reader.fingerprint == local.fingerprint
        assert [reader.read(i).tolist() for i in range(len(reader))] == [
            local.read(i).tolist() for i in range(len(local))
        ]
    assert main(["tokenize", *files, service.url, *options]) == 2  # its shards exist: nothing is overwritten


def test_skip_existing_reads_what_a_url_holds_from_one_listing(
    inputs: tuple[list[str], list[str]],
    service: ServiceStorage,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GUIDELOOM_CACHE_DIR", str(tmp_path / "cache"))
    files, common = inputs
    options = [*common, "--storage-options", json.dumps(service.options), "--shard-size", "16"]  # many shards
    assert main(["tokenize", *files, service.url, *options]) == 0
    shards = TokenStorage(service.url, storage_options=service.options).committed_shards()
    assert {shard // 10**6 for shard in shards} == {0, 1, 2} and len(shards) > 3
    assert len(service.object_bytes("shards.index")) == 40 * (1 + len(shards))  # written at the end of the run
    capsys.readouterr()
    assert main(["tokenize", *files, service.url, *options, "--skip-existing"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "3 input files skipped: their shards already existed"
    assert TokenStorage(service.url, storage_options=service.options).committed_shards() == shards
