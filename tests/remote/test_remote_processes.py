"""Several processes writing and reading one storage on each service; a writer killed mid-upload (S3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np
import pytest

from guideloom import TokenStorage
from tests.remote.conftest import ServiceStorage
from tests.remote.remote_child import shard_tokens

CHILD = Path(__file__).with_name("remote_child.py")


def _start(service: ServiceStorage, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(service.options), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out.strip()


def test_two_writer_processes_on_different_shards(service: ServiceStorage, tmp_path: Path) -> None:
    writers = [
        _start(service, "write", service.url, tmp_path / f"w{i}", *shards) for i, shards in enumerate([(0, 2), (1, 3)])
    ]
    assert [_finish(writer) for writer in writers] == ["committed", "committed"]
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r")
    with storage.sync_reader() as reader:
        expected = [tokens for shard in range(4) for tokens in shard_tokens(shard)]
        assert len(reader) == len(expected)
        assert all(np.array_equal(reader.read(i), tokens) for i, tokens in enumerate(expected))


@pytest.mark.parametrize("service", ["s3"], indirect=True)
def test_a_writer_killed_mid_upload_leaves_no_shard(service: ServiceStorage, tmp_path: Path) -> None:
    """On S3 only: the child dies from inside the S3 backend's upload (the other services' clients upload from
    their own code, out of its reach)."""
    cache = tmp_path / "writer"
    TokenStorage(service.url, storage_options=service.options, cache_dir=cache).sync_writer().close()  # the header
    process = _start(service, "die-uploading", service.url, cache, 4)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == -9 and out.strip() == "dying"
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=cache)
    with storage.sync_reader() as reader:
        assert len(reader) == 0
    removed = storage.clean_leftovers(older_than=0)
    assert [Path(str(path)).name.startswith("000000000004.shard.") for path in removed] == [True]
    assert storage.clean_leftovers(older_than=0) == []
    with storage.sync_writer() as writer:  # the shard id is free again
        writer.append(4, [1, 2])


def test_reader_processes_sharing_a_cache_download_each_shard_once(service: ServiceStorage, tmp_path: Path) -> None:
    assert _finish(_start(service, "write", service.url, tmp_path / "w", 0, 1, 2)) == "committed"
    readers = [_start(service, "read", service.url, tmp_path / "shared") for _ in range(2)]
    total = sum(int(tokens.sum()) for shard in range(3) for tokens in shard_tokens(shard))
    assert [_finish(reader) for reader in readers] == [str(total), str(total)]
    assert sorted(name for name, _, _, _ in service.reads("/shards/")) == [
        f"corpus/shards/{shard:012d}.shard" for shard in range(3)
    ]


@pytest.mark.parametrize("service", ["s3"], indirect=True)
def test_a_writer_killed_mid_multipart_upload_leaves_no_shard(service: ServiceStorage, tmp_path: Path) -> None:
    """On S3 only: an abandoned multipart upload is S3's, and the child dies from inside the S3 backend's upload."""
    cache = tmp_path / "writer"
    TokenStorage(service.url, storage_options=service.options, cache_dir=cache).sync_writer().close()  # the header
    process = _start(service, "die-in-parts", service.url, cache, 4)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == -9 and out.strip() == "dying"
    client = boto3.client("s3", **service.options)
    assert len(client.list_multipart_uploads(Bucket=service.bucket).get("Uploads", [])) == 1
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=cache)
    with storage.sync_reader() as reader:
        assert len(reader) == 0
    removed = [str(path) for path in storage.clean_leftovers(older_than=0)]
    assert f"{service.url}/shards/000000000004.shard" in removed and len(removed) == 2  # the upload, the local file
    assert client.list_multipart_uploads(Bucket=service.bucket).get("Uploads", []) == []
