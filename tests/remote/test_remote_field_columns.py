"""A caption pass over an image storage on S3 reads the caption columns alone: the server counts what it served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest

from guideloom import CorruptStorageError, DocumentStorage, StatefulDataLoader
from guideloom.fields import Image, RecordSchema, Scalar, Text
from tests.fields.media_files import image_bytes
from tests.remote.s3_support import S3Server

SCHEMA = RecordSchema(caption=Text(), image=Image(), score=Scalar("float32", optional=True))
SHARDS, PER_SHARD = 4, 60


def caption(number: int) -> str:
    """About 50 bytes of UTF-8, not all ASCII."""
    return f"photo n° {number:04d}: a street at dusk, wet cobbles"


def records() -> list[dict[str, Any]]:
    return [
        {
            "caption": caption(number),
            "image": image_bytes(48, 40, "JPEG", seed=number),
            "score": None if number % 3 else float(number),
        }
        for number in range(SHARDS * PER_SHARD)
    ]


def remote(url: str, s3_server: S3Server, cache: Path, **options: Any) -> DocumentStorage[Any, Any]:
    return DocumentStorage(url, SCHEMA, storage_options=s3_server.options, cache_dir=cache, **options)


def write(storage: DocumentStorage[Any, Any]) -> list[dict[str, Any]]:
    written = records()
    with storage.sync_writer() as writer:
        for number, record in enumerate(written):
            writer.append(number // PER_SHARD, record)
    return written


def bucket_of(url: str) -> str:
    return url.removeprefix("s3://").split("/")[0]


def log_marks(s3_server: S3Server) -> tuple[int, int]:
    """Where the server's logs of requests and of ranged requests end now."""
    return len(s3_server.log.requests), len(s3_server.log.ranges)


def served_bytes(s3_server: S3Server, bucket: str, since: tuple[int, int]) -> int:
    """The bytes of objects the server sent for ``bucket`` since ``since`` (`log_marks`): whole objects (the header,
    an index object) at their size, ranged reads (tails, columns) at their range; listings are not objects."""
    prefix = f"/{bucket}/"
    sizes = {
        f"{prefix}{item['Key']}": item["Size"]
        for item in boto3.client("s3", endpoint_url=s3_server.endpoint).list_objects_v2(Bucket=bucket)["Contents"]
    }
    whole = [
        sizes[path]
        for method, path, status in s3_server.log.requests[since[0] :]
        if method == "GET" and path.startswith(prefix) and "?" not in path and status == 200
    ]
    ranged = []
    for method, path, status, byte_range in s3_server.log.ranges[since[1] :]:
        if method == "GET" and path.startswith(prefix) and status == 206:
            first, last = (int(end) for end in byte_range.removeprefix("bytes=").split("-"))
            ranged.append(min(last, sizes[path] - 1) - first + 1)
    return sum(whole) + sum(ranged)


def caption_bytes() -> int:
    return sum(len(caption(number).encode()) for number in range(SHARDS * PER_SHARD))


def test_a_caption_pass_through_the_loader_downloads_at_most_1_1x_the_captions(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    written = write(remote(s3_url, s3_server, tmp_path / "writer"))
    storage = remote(s3_url, s3_server, tmp_path / "reader")
    since = log_marks(s3_server)
    with StatefulDataLoader.from_storage(
        storage, list, device="cpu", local_batch_size=16, shuffle=True, num_workers=2, fields=("caption",)
    ) as loader:
        read = [record for batch in loader for record in batch]
    served = served_bytes(s3_server, bucket_of(s3_url), since)
    assert sorted(record["caption"] for record in read) == sorted(record["caption"] for record in written)
    assert all(list(record) == ["caption"] for record in read)
    assert served <= 1.1 * caption_bytes(), (served, caption_bytes())
    assert s3_server.gets(bucket_of(s3_url), ".shard") == []  # no shard downloaded whole


def test_a_readers_caption_pass_reads_what_whole_records_hold_and_downloads_at_most_1_1x(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    write(remote(s3_url, s3_server, tmp_path / "writer"))
    since = log_marks(s3_server)
    with remote(s3_url, s3_server, tmp_path / "reader").sync_reader() as reader:
        some = [reader.read(index, fields=("caption", "score")) for index in range(len(reader))]
        captions = [reader.read(index, fields=("caption",)) for index in range(len(reader))]
    served = served_bytes(s3_server, bucket_of(s3_url), since)
    scores = 4 * SHARDS * PER_SHARD  # float32, where present
    assert served <= 1.1 * (caption_bytes() + scores), (served, caption_bytes())
    with remote(s3_url, s3_server, tmp_path / "whole").sync_reader() as reader:
        whole = [reader.read(index) for index in range(len(reader))]
    assert some == [{"caption": record["caption"], "score": record["score"]} for record in whole]
    assert captions == [{"caption": record["caption"]} for record in whole]


def test_fields_naming_a_medium_read_the_shards(s3_server: S3Server, s3_url: str, tmp_path: Path) -> None:
    written = write(remote(s3_url, s3_server, tmp_path / "writer"))
    with remote(s3_url, s3_server, tmp_path / "reader").sync_reader() as reader:
        read = [reader.read(index, fields=("image", "caption")) for index in range(0, len(reader), 7)]
    assert [(record["caption"], bytes(record["image"].data)) for record in read] == [
        (record["caption"], record["image"]) for record in written[::7]
    ]
    assert len(s3_server.gets(bucket_of(s3_url), ".shard")) == SHARDS


def damage_caption_column(s3_server: S3Server, url: str, shard: int) -> None:
    """Flip a byte of the caption column of ``shard``'s object (its size unchanged: the listing still fits)."""
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    bucket, key = bucket_of(url), f"corpus/shards/{shard:012d}.shard"
    content = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    start = content.rindex(caption(shard * PER_SHARD).encode())  # the last copy: in the column, after the records
    content[start + 2] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(content))


def test_a_damaged_column_is_named_by_the_reader_and_by_verify(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    write(remote(s3_url, s3_server, tmp_path / "writer"))
    damage_caption_column(s3_server, s3_url, 2)
    with remote(s3_url, s3_server, tmp_path / "reader").sync_reader() as reader:
        assert reader.read(0, fields=("caption",)) == {"caption": caption(0)}
        with pytest.raises(CorruptStorageError, match="shard 2: its column of field 'caption' is damaged"):
            reader.read(2 * PER_SHARD, fields=("caption",))
        with pytest.raises(CorruptStorageError, match="shard 2: its column of field 'caption' is damaged"):
            reader.read(2 * PER_SHARD)  # a damaged shard is not read, even where its records are sound
    (problem,) = remote(s3_url, s3_server, tmp_path / "verify").verify()
    assert "shard 2: its column of field 'caption' is damaged: its checksum does not match" in problem


def test_a_storage_without_columns_reads_fields_from_its_shards(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    """A storage created before field columns: its header names none, and its shards hold none."""
    older = {"checkpoint_bytes": 4096, "format": SCHEMA.name, "kind": "documents", "layout_version": 1}
    header = json.dumps(older, sort_keys=True).encode() + b"\n"
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    client.put_object(Bucket=bucket_of(s3_url), Key="corpus/guideloom.json", Body=header)
    written = write(remote(s3_url, s3_server, tmp_path / "writer"))
    storage = remote(s3_url, s3_server, tmp_path / "reader")
    with StatefulDataLoader.from_storage(
        storage, list, device="cpu", local_batch_size=16, fields=("caption",)
    ) as loader:
        read = [record for batch in loader for record in batch]
    assert read == [{"caption": record["caption"]} for record in written]
    assert len(s3_server.gets(bucket_of(s3_url), ".shard")) == SHARDS  # read whole, as before columns


def test_a_caption_pass_resumes_exactly_over_the_columns(s3_server: S3Server, s3_url: str, tmp_path: Path) -> None:
    write(remote(s3_url, s3_server, tmp_path / "writer"))

    def open_loader(cache: str) -> StatefulDataLoader:
        storage = remote(s3_url, s3_server, tmp_path / cache)
        options: dict[str, Any] = {"device": "cpu", "local_batch_size": 8, "shuffle": True, "seed": 3}
        return StatefulDataLoader.from_storage(storage, list, num_workers=2, fields=("caption",), **options)

    with open_loader("whole") as loader:
        uninterrupted = [batch for batch in loader]
    with open_loader("first") as loader:
        batches = iter(loader)
        first = [next(batches) for _ in range(7)]
        state = loader.state_dict()
    with open_loader("second") as loader:
        loader.load_state_dict(state)
        rest = list(loader)
    assert first + rest == uninterrupted
    assert s3_server.gets(bucket_of(s3_url), ".shard") == []


def test_a_budget_by_length_reads_the_tails_and_the_columns_not_the_shards(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    measured = RecordSchema(
        length=lambda record: len(record["caption"]) + record["image"].width // 8,
        caption=Text(),
        image=Image(),
        score=Scalar("float32", optional=True),
    )
    written = write(DocumentStorage(s3_url, measured, storage_options=s3_server.options, cache_dir=tmp_path / "w"))
    storage = DocumentStorage(s3_url, measured, storage_options=s3_server.options, cache_dir=tmp_path / "reader")
    with StatefulDataLoader.from_storage(storage, list, device="cpu", batch_tokens=400, fields=("caption",)) as loader:
        read = [record for batch in loader for record in batch]
    assert read == [{"caption": record["caption"]} for record in written]
    assert s3_server.gets(bucket_of(s3_url), ".shard") == []


def test_a_compressed_storage_holds_no_columns_and_reads_fields_from_its_shards(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    written = write(remote(s3_url, s3_server, tmp_path / "writer", compression="zstd"))
    header = boto3.client("s3", endpoint_url=s3_server.endpoint).get_object(
        Bucket=bucket_of(s3_url), Key="corpus/guideloom.json"
    )
    assert "field_columns" not in json.loads(header["Body"].read())
    with remote(s3_url, s3_server, tmp_path / "reader").sync_reader() as reader:
        assert [reader.read(index, fields=("caption",)) for index in range(len(reader))] == [
            {"caption": record["caption"]} for record in written
        ]
