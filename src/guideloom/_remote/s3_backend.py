"""S3 (and stores that speak its API): the object-store backend through s3fs and its aiobotocore client.

The only module that knows s3fs or botocore, and it calls their public API only: s3fs's ``call_s3``
(one S3 request, its errors translated), ``info``, ``rm_file``, ``split_path``, and for the requests whose
bodies are streamed, the client itself (``set_session`` and ``get_s3``), its errors translated by
``s3fs.errors.translate_boto_error``. A create is a ``PutObject`` with ``If-None-Match: *`` (412 when
the key exists), a large one a multipart upload completed the same way; a GET streams its body
straight into the file (several times faster than fsspec's ``cat_file``), and a shard of a known size
comes in ranged GETs side by side (``ranged_parts``). Each body's length is checked against the
answer's ``Content-Length``, so one cut short is a ``ShortBody`` that is retried. botocore's and
s3fs's own retries are off (guideloom's ``retries`` are the only ones, so their bounds hold).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any

from guideloom._remote.fsspec_backend import FsspecClient
from guideloom._remote.object_backend import (
    BROKEN_CONNECTIONS,
    DOWNLOAD_CHUNK,
    PAGE_SIZE,
    Decoder,
    ListPage,
    named_among,
)
from guideloom._remote.ranged_parts import download_parts
from guideloom._remote.retries import Retrying, ShortBody

MULTIPART_BYTES = 1 << 30  # larger shards are uploaded in parts (one PUT takes at most 5 GiB)
PART_BYTES = 64 << 20
# Fail fast on an unreachable endpoint instead of botocore's long defaults, and leave retrying to
# guideloom (total_max_attempts 1: botocore tries once; its max_attempts counts retries, so 1 would
# retry once more, unlogged and uncounted); storage_options may override.
S3_DEFAULTS: dict[str, Any] = {
    "use_listings_cache": False,
    "config_kwargs": {
        "connect_timeout": 10,
        "read_timeout": 30,
        "retries": {"total_max_attempts": 1, "mode": "standard"},
    },
}
# botocore's classes for "the connection failed or the response was incomplete", matched by name.
S3_BROKEN_CONNECTIONS = BROKEN_CONNECTIONS | {
    "HTTPClientError",  # connection closed, read timeout, streaming errors
    "IncompleteReadError",
    "ResponseParserError",  # a throttling response with a garbled body
    "EndpointConnectionError",
}


class S3Backend(FsspecClient):
    """The objects of an S3 bucket through s3fs (one filesystem per process)."""

    atomic_creates = True
    ranged_downloads = True
    listable = True

    def __init__(self, protocol: str, options: dict[str, Any], location: str = "") -> None:
        config = {**S3_DEFAULTS["config_kwargs"], **options.get("config_kwargs", {})}
        super().__init__(protocol, {**S3_DEFAULTS, **options, "config_kwargs": config}, location)

    def made(self, fs: Any) -> None:
        fs.retries = 1  # s3fs's own retry loop: one try, guideloom retries

    def list_page(self, folder: str, start_after: str, page: str | None) -> ListPage:
        """One ``ListObjectsV2`` page: keys come in byte order, up to 1,000 a request, from ``StartAfter`` on."""
        bucket, prefix, _ = self.fs.split_path(folder)
        prefix = prefix.rstrip("/") + "/"
        arguments: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/", "MaxKeys": PAGE_SIZE}
        if page is not None:
            arguments["ContinuationToken"] = page
        else:
            arguments["StartAfter"] = prefix + start_after
        answer = self.fs.call_s3("list_objects_v2", **arguments)
        names = {str(entry["Key"])[len(prefix) :]: int(entry.get("Size") or 0) for entry in answer.get("Contents", [])}
        token = answer.get("NextContinuationToken")
        return ListPage(names, token if answer.get("IsTruncated") and token is not None else None)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """One GET (where fsspec's ``cat_file`` may first HEAD and list)."""
        byte_range = None if start is None else f"bytes={start}-{'' if end is None else end - 1}"
        data: bytes = self._run(self._read_body(key, byte_range))[0]
        return data

    def read_start(self, key: str, limit: int) -> tuple[bytes, int]:
        """One ranged GET: the size comes in its ``Content-Range``."""
        try:
            found: tuple[bytes, int] = self._run(self._read_body(key, f"bytes=0-{limit - 1}"))
            return found
        except OSError as error:
            if "InvalidRange" in str(error) or "not satisfiable" in str(error):  # S3's answer to a range of nothing
                return b"", 0
            raise

    def size(self, key: str) -> int:
        return int(self.fs.info(key).get("size") or 0)

    def download(self, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None) -> None:
        self._run(self._stream_body(key, destination, decoder))

    def download_ranges(
        self, key: str, destination: Path, ranges: list[tuple[int, int]], retrying: Retrying, doing: str
    ) -> None:
        self._run(download_parts(partial(self._fetch_range, key), destination, ranges, retrying, doing))

    def create(self, key: str, source: bytes | Path, retrying: Retrying, doing: str) -> bool | None:
        bucket, path, _ = self.fs.split_path(key)
        if isinstance(source, Path) and source.stat().st_size > MULTIPART_BYTES:
            return self._create_in_parts(bucket, path, source, retrying, doing)

        def put(_: int) -> bool | None:
            try:
                with open(source, "rb") if isinstance(source, Path) else contextlib.nullcontext(source) as body:
                    self.fs.call_s3("put_object", Bucket=bucket, Key=path, Body=body, IfNoneMatch="*")
            except FileExistsError:  # s3fs's translation of 412 Precondition Failed: whose object?
                return None
            return True

        return retrying.call(doing, put)

    def _create_in_parts(self, bucket: str, key: str, source: Path, retrying: Retrying, doing: str) -> bool | None:
        """A multipart upload, completed with If-None-Match: nothing is visible before the completion."""
        call_s3 = self.fs.call_s3
        upload_id = retrying.call(doing, lambda _: call_s3("create_multipart_upload", Bucket=bucket, Key=key))
        upload_id = upload_id["UploadId"]
        try:
            parts: list[dict[str, Any]] = []

            def upload_part(number: int, chunk: bytes, _: int) -> Any:
                return call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk)

            with open(source, "rb") as file:
                while chunk := file.read(PART_BYTES):
                    number = len(parts) + 1
                    part = retrying.call(f"{doing} (part {number})", partial(upload_part, number, chunk))
                    parts.append({"ETag": part["ETag"], "PartNumber": number})

            def complete(attempt: int) -> bool | None:
                try:
                    call_s3(
                        "complete_multipart_upload",
                        Bucket=bucket,
                        Key=key,
                        UploadId=upload_id,
                        MultipartUpload={"Parts": parts},
                        IfNoneMatch="*",
                    )
                except FileExistsError:  # 412: the key exists (another writer's, or our earlier attempt's)
                    return None
                except FileNotFoundError:  # NoSuchUpload on a retry: our earlier attempt completed it
                    if attempt == 1:
                        raise
                    return None
                return True

            return retrying.call(doing, complete)
        except BaseException:
            with contextlib.suppress(Exception):  # a failure here leaves an upload that clean aborts
                call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
            raise

    def put(self, key: str, data: bytes) -> None:
        bucket, path, _ = self.fs.split_path(key)
        self.fs.call_s3("put_object", Bucket=bucket, Key=path, Body=data)

    def delete(self, key: str) -> None:
        self.fs.rm_file(key)

    def abort_uploads(self, folder: str, older_than: float, retrying: Retrying, doing: str) -> list[str]:
        bucket, prefix, _ = self.fs.split_path(folder)
        arguments = {"Bucket": bucket, "Prefix": prefix.rstrip("/") + "/"}
        listing = retrying.call(doing, lambda _: self.fs.call_s3("list_multipart_uploads", **arguments))
        aborted = []
        now = time.time()
        for upload in listing.get("Uploads", []):
            if now - upload["Initiated"].timestamp() < older_than:
                continue  # a live writer's, most likely
            which = {"Bucket": bucket, "Key": upload["Key"], "UploadId": upload["UploadId"]}
            with contextlib.suppress(FileNotFoundError):  # a retry after the abort landed
                retrying.call(f"aborting the upload of {upload['Key']}", partial(self._abort, which))
            aborted.append(f"{bucket}/{upload['Key']}")
        return aborted

    def _abort(self, which: dict[str, str], _: int) -> None:
        self.fs.call_s3("abort_multipart_upload", **which)

    def status(self, error: BaseException) -> int | None:
        """botocore's error carries the answer: its HTTP status, or a numeric error code."""
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
            code = str(response.get("Error", {}).get("Code", ""))
            if code.isdigit():
                return int(code)
        return None

    def broken_connection(self, error: BaseException) -> bool:
        return named_among(error, S3_BROKEN_CONNECTIONS)

    def _run(self, coroutine: Any) -> Any:
        """Run a coroutine on s3fs's event loop (its client lives there) and wait for its result."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, _awaited, coroutine)

    async def _get_object(self, key: str, byte_range: str | None) -> tuple[dict[str, Any], str]:
        """A GET through the client itself (its body is streamed); s3fs's translation of its errors."""
        from s3fs.errors import translate_boto_error

        fs = self.fs
        bucket, path, _ = fs.split_path(key)
        await fs.set_session()
        client = await fs.get_s3(bucket)
        arguments = {**_request_defaults(client, fs), "Bucket": bucket, "Key": path}
        if byte_range is not None:
            arguments["Range"] = byte_range
        try:
            return await client.get_object(**arguments), f"{bucket}/{path}"
        except Exception as error:
            translated = translate_boto_error(error)
            if translated is error:
                raise
            raise translated from error

    async def _read_body(self, key: str, byte_range: str | None) -> tuple[bytes, int]:
        """The body and the object's whole size (from ``Content-Range`` where a range was asked)."""
        response, name = await self._get_object(key, byte_range)
        body = response["Body"]
        try:
            data = bytes(await body.read())
        finally:
            body.close()
        check_length(len(data), response, name)
        total = str(response.get("ContentRange") or "").rpartition("/")[2]
        return data, int(total) if total.isdigit() else len(data)

    async def _stream_body(self, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None) -> None:
        response, name = await self._get_object(key, None)
        body = response["Body"]
        received = 0
        try:
            with open(destination, "wb") as file:
                decoding = None if decoder is None else decoder(file)
                while chunk := await body.read(DOWNLOAD_CHUNK):
                    received += len(chunk)
                    if decoding is None:
                        file.write(chunk)
                    else:
                        decoding.write(chunk)
                check_length(received, response, name)
                if decoding is not None:
                    decoding.finish()
        finally:
            body.close()

    async def _fetch_range(self, key: str, start: int, end: int, write: Callable[[bytes], None]) -> None:
        """One ranged GET of a download in parts, its body handed on chunk by chunk."""
        response, name = await self._get_object(key, f"bytes={start}-{end - 1}")
        body = response["Body"]
        received = 0
        try:
            while chunk := await body.read(DOWNLOAD_CHUNK):
                write(chunk)
                received += len(chunk)
            check_length(received, response, f"{name} (bytes {start}-{end - 1})")
        finally:
            body.close()


async def _awaited(coroutine: Any) -> Any:
    return await coroutine


def _request_defaults(client: Any, fs: Any) -> dict[str, Any]:
    """What s3fs adds to each of its GETs (``s3_additional_kwargs``, requester pays), kept to what GetObject takes."""
    given = {**fs.s3_additional_kwargs, **fs.req_kw}
    if not given:
        return {}
    accepted = client.meta.service_model.operation_model("GetObject").input_shape.members
    return {name: value for name, value in given.items() if name in accepted and value is not None}


def check_length(received: int, response: dict[str, Any], name: str) -> None:
    """A body shorter (or longer) than its ``Content-Length`` is a ``ShortBody``, retried."""
    expected = response.get("ContentLength")
    if isinstance(expected, int) and received != expected:
        raise ShortBody(f"the body of {name} ended after {received} of {expected} bytes")
