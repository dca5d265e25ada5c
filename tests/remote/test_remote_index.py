"""The index object of a remote storage: readers list only what it cannot know; it never hides or invents a shard."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import guideloom._remote.indexed_listing
from guideloom import TokenStorage
from guideloom._cli import main
from tests.remote.conftest import ServiceStorage


def _storage(url: str, service: ServiceStorage, cache: Path, compression: str | None = None) -> TokenStorage:
    return TokenStorage(url, np.uint16, storage_options=service.options, cache_dir=cache, compression=compression)


def _commit(storage: TokenStorage, shards: list[int]) -> None:
    with storage.sync_writer() as writer:
        for shard in shards:
            writer.append(shard, np.arange(shard % 7 + 1, dtype=np.uint16) + shard)


def _read_ids(url: str, service: ServiceStorage, cache: Path) -> list[int]:
    return _storage(url, service, cache).committed_shards()


def test_a_reader_of_a_current_index_lists_once_after_it(service: ServiceStorage, tmp_path: Path) -> None:
    storage = _storage(service.url, service, tmp_path / "w")
    _commit(storage, list(range(40)))
    assert storage.write_index() == 40
    before, listed = len(service.requests()), len(service.listings())
    reader = _storage(service.url, service, tmp_path / "r").sync_reader()
    requests = service.requests()[before:]
    assert len(reader.infos) == 40
    reader.close()
    listings = service.listings()[listed:]
    if service.name == "s3":  # gcsfs's and adlfs's listings start at the folder's first name: S3's alone list after
        assert len(listings) == 1 and "start-after=corpus%2Fshards%2F000000000039" in listings[0]
    assert not [
        path
        for method, path, _, _, _ in requests
        if "/shards/0" in unquote(path) and not service.service.listing(method, path)
    ]  # no footer read


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_shards_committed_after_the_index_are_seen_above_and_below_its_last(
    compression: str | None, service: ServiceStorage, tmp_path: Path
) -> None:
    storage = _storage(service.url, service, tmp_path / "w", compression)
    _commit(storage, [0, 2, 3, 7])
    storage.write_index()
    _commit(storage, [1, 5, 9])  # uncoordinated late commits, in the index's gaps and past its end
    with _storage(service.url, service, tmp_path / "r").sync_reader() as reader:
        assert [int(shard) for shard in reader.infos.ids] == [0, 1, 2, 3, 5, 7, 9]
        assert [reader.read(i).tolist()[0] for i in range(len(reader))] == [0, 1, 2, 3, 5, 7, 9]
    assert storage.verify() == []


def test_a_late_shard_without_its_marker_is_read_from_its_footer(service: ServiceStorage, tmp_path: Path) -> None:
    storage = _storage(service.url, service, tmp_path / "w")
    _commit(storage, [0, 4])
    storage.write_index()
    _commit(storage, [2])
    (marker,) = [name for name in service.object_names() if name.startswith("shards/000000000002.r")]
    service.delete_object(marker)  # its writer died between the shard and its marker
    with _storage(service.url, service, tmp_path / "r").sync_reader() as reader:
        assert [int(shard) for shard in reader.infos.ids] == [0, 2, 4]
        assert reader.read(1).tolist() == [2, 3, 4]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.sets(st.integers(0, 30), max_size=8),
    after=st.sets(st.integers(0, 30), max_size=5),
)
def test_every_committed_shard_is_seen_whatever_was_indexed(
    before: set[int], after: set[int], service: ServiceStorage, tmp_path: Path
) -> None:
    url = service.service.url(service.service.new_bucket())
    storage = _storage(url, service, tmp_path / "w")
    _commit(storage, sorted(before))
    storage.write_index()
    _commit(storage, sorted(after - before))
    assert _read_ids(url, service, tmp_path / "r") == sorted(before | after)


@pytest.mark.parametrize(
    "damage",
    ["bit flip", "cut short", "cut to its preamble", "extended", "empty", "another storage's", "not an index"],
)
def test_a_damaged_index_hides_and_invents_nothing_and_verify_and_inspect_name_it(
    damage: str, service: ServiceStorage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = _storage(service.url, service, tmp_path / "w")
    _commit(storage, [0, 1, 2, 3])
    storage.write_index()
    raw = service.object_bytes("shards.index")
    if damage == "another storage's":
        other = _storage(service.service.url(service.bucket, "other"), service, tmp_path / "o")
        _commit(other, [0, 1, 2, 3, 4, 5])
        other.write_index()
        raw = bytes(service.filesystem().cat_file(f"{service.bucket}/other/shards.index"))
    damaged = {
        "bit flip": raw[:97] + bytes([raw[97] ^ 4]) + raw[98:],
        "cut short": raw[:-7],
        "cut to its preamble": raw[:40],
        "extended": raw + raw[-40:],
        "empty": b"",
        "another storage's": raw,
        "not an index": b"{}" * 100,
    }[damage]
    service.put_object("shards.index", damaged)
    assert _read_ids(service.url, service, tmp_path / "r") == [0, 1, 2, 3]
    problems = _storage(service.url, service, tmp_path / "v").verify()
    assert len(problems) == 1 and f"{service.url}/shards.index" in problems[0] and "guideloom index" in problems[0]
    assert main(["inspect", service.url, "--storage-options", json.dumps(service.options)]) == 0
    index_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("index:")]
    assert len(index_lines) == 1, index_lines
    assert index_lines[0].startswith(f"index:      not used, the storage was listed whole: {service.url}/shards.index")
    assert main(["verify", service.url, "--storage-options", json.dumps(service.options)]) == 1
    out, err = capsys.readouterr()
    assert [line for line in out.splitlines() if line.startswith("CORRUPT")] == [f"CORRUPT {problems[0]}"]
    assert err.strip() == "the index was damaged, no shard: readers bypass it"


def test_an_index_larger_than_any_index_is_refused_unread(
    service: ServiceStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guideloom._remote.indexed_listing, "MAX_INDEX_BYTES", 4096)
    storage = _storage(service.url, service, tmp_path / "w")
    _commit(storage, [0, 1])
    service.put_object("shards.index", bytes(1 << 20))
    assert _read_ids(service.url, service, tmp_path / "r") == [0, 1]
    assert f"{service.url}/shards.index has 1048576 bytes, more than an index of 101 shards" in storage.verify()[0]


def test_an_index_naming_a_deleted_shard_is_refused(service: ServiceStorage, tmp_path: Path) -> None:
    storage = _storage(service.url, service, tmp_path / "w")
    _commit(storage, [0, 1, 2])
    storage.write_index()
    for name in service.object_names():
        if name.startswith("shards/000000000002"):
            service.delete_object(name)
    assert _read_ids(service.url, service, tmp_path / "r") == [0, 1]
    assert "names 1 shards that are not committed (first: shard 2)" in storage.verify()[0]


def test_a_rewritten_index_is_sound_again(service: ServiceStorage, tmp_path: Path) -> None:
    storage = _storage(service.url, service, tmp_path / "w")
    _commit(storage, [0, 1])
    storage.write_index()
    _commit(storage, [2])
    assert storage.verify() == []  # a shard committed after the index is no problem
    assert storage.write_index() == 3


def test_the_index_command_writes_the_index(
    service: ServiceStorage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = _storage(service.url, service, tmp_path / "w")
    _commit(storage, [0, 1, 5])
    options = json.dumps(service.options)
    assert main(["index", service.url, "--storage-options", options]) == 0
    assert capsys.readouterr().out.strip() == f"indexed 3 shards in {service.url}/shards.index"
    assert storage.verify() == []


def test_the_index_command_rewrites_a_local_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = TokenStorage(tmp_path / "tokens", np.uint16)
    _commit(storage, [0, 3])
    (tmp_path / "tokens" / "shards.index").write_bytes(b"damaged")
    assert main(["index", str(tmp_path / "tokens")]) == 0
    assert capsys.readouterr().out.strip() == f"indexed 2 shards in {tmp_path / 'tokens'}/shards.index"
    assert TokenStorage(tmp_path / "tokens").committed_shards() == [0, 3]
    assert storage.verify() == []


def test_an_index_on_a_generic_fsspec_store_works(tmp_path: Path) -> None:
    url = f"memory://index-{tmp_path.name}/corpus"
    storage = TokenStorage(url, np.uint16, cache_dir=tmp_path)
    _commit(storage, [0, 2])
    storage.write_index()
    _commit(storage, [1, 3])
    assert TokenStorage(url, cache_dir=tmp_path / "r").committed_shards() == [0, 1, 2, 3]
