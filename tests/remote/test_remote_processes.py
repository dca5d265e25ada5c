"""Several processes writing and reading one storage on the S3 API server; a writer killed mid-upload."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np

from guideloom import TokenStorage
from tests.remote.remote_child import shard_tokens
from tests.remote.s3_support import S3Server

CHILD = Path(__file__).with_name("remote_child.py")


def _start(s3_server: S3Server, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), s3_server.endpoint, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out.strip()


def test_two_writer_processes_on_different_shards(s3_url: str, s3_server: S3Server, tmp_path: Path) -> None:
    writers = [
        _start(s3_server, "write", s3_url, tmp_path / f"w{i}", *shards) for i, shards in enumerate([(0, 2), (1, 3)])
    ]
    assert [_finish(writer) for writer in writers] == ["committed", "committed"]
    storage = TokenStorage(s3_url, storage_options=s3_server.options, cache_dir=tmp_path / "r")
    with storage.sync_reader() as reader:
        expected = [tokens for shard in range(4) for tokens in shard_tokens(shard)]
        assert len(reader) == len(expected)
        assert all(np.array_equal(reader.read(i), tokens) for i, tokens in enumerate(expected))


def test_a_writer_killed_mid_upload_leaves_no_shard(s3_url: str, s3_server: S3Server, tmp_path: Path) -> None:
    cache = tmp_path / "writer"
    TokenStorage(s3_url, storage_options=s3_server.options, cache_dir=cache).sync_writer().close()  # the header
    process = _start(s3_server, "die-uploading", s3_url, cache, 4)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == -9 and out.strip() == "dying"
    storage = TokenStorage(s3_url, storage_options=s3_server.options, cache_dir=cache)
    with storage.sync_reader() as reader:
        assert len(reader) == 0
    removed = storage.clean_leftovers(older_than=0)
    assert [Path(str(path)).name.startswith("000000000004.shard.") for path in removed] == [True]
    assert storage.clean_leftovers(older_than=0) == []
    with storage.sync_writer() as writer:  # the shard id is free again
        writer.append(4, [1, 2])


def test_reader_processes_sharing_a_cache_download_each_shard_once(
    s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path
) -> None:
    assert _finish(_start(s3_server, "write", s3_url, tmp_path / "w", 0, 1, 2)) == "committed"
    readers = [_start(s3_server, "read", s3_url, tmp_path / "shared") for _ in range(2)]
    total = sum(int(tokens.sum()) for shard in range(3) for tokens in shard_tokens(shard))
    assert [_finish(reader) for reader in readers] == [str(total), str(total)]
    shard_gets = s3_server.gets(bucket, "/shards/")
    assert sorted(shard_gets) == [f"/{bucket}/corpus/shards/{shard:012d}.shard" for shard in range(3)]


def test_a_writer_killed_mid_multipart_upload_leaves_no_shard(
    s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path
) -> None:
    cache = tmp_path / "writer"
    TokenStorage(s3_url, storage_options=s3_server.options, cache_dir=cache).sync_writer().close()  # the header
    process = _start(s3_server, "die-in-parts", s3_url, cache, 4)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == -9 and out.strip() == "dying"
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    assert len(client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])) == 1
    storage = TokenStorage(s3_url, storage_options=s3_server.options, cache_dir=cache)
    with storage.sync_reader() as reader:
        assert len(reader) == 0
    removed = [str(path) for path in storage.clean_leftovers(older_than=0)]
    assert f"{s3_url}/shards/000000000004.shard" in removed and len(removed) == 2  # the upload, the local file
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
