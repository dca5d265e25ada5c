"""Objects of a storage on an object store, through fsspec: one listing, conditional create, whole downloads.

Imported only when a storage is opened by URL (fsspec, and s3fs for ``s3://``, come from the ``remote``
extra). On S3 the calls go through s3fs's own client: a create is a ``PutObject`` with
``If-None-Match: *`` (the store refuses it with 412 when the key exists) and a download streams the
object's body straight into a file, a shard of a known size in ranged parts side by side (``ranged_parts``).
Other fsspec stores use fsspec's generic calls, where a create is "check, then put" (see
docs/object-storage.md). Every request is retried on transient failures
(``retries``); botocore's and s3fs's own retries are off, so the bounds stated there hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar

from guideloom._core.errors import StorageNotFoundError
from guideloom._remote.compression import DamagedDownload
from guideloom._remote.ranged_parts import download_parts, part_ranges
from guideloom._remote.retries import RetriesExhausted, Retrying, RetryPolicy
from guideloom._remote.s3_bodies import DOWNLOAD_CHUNK, Decoder, read_s3_object, stream_s3_object

CONDITIONAL_PROTOCOLS = ("s3", "s3a")
BUCKET_PROTOCOLS = (*CONDITIONAL_PROTOCOLS, "gs", "gcs", "az", "abfs", "abfss")  # the first part is a bucket
MULTIPART_BYTES = 1 << 30  # larger shards are uploaded in parts (one PUT takes at most 5 GiB)
PART_BYTES = 64 << 20
COMPARED_TAIL = 64  # bytes at an object's end compared with ours (a shard's footer: its checksums)
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
T = TypeVar("T")


def is_url(location: object) -> bool:
    """Whether a storage location names an object store (``scheme://...``) rather than a local path."""
    return isinstance(location, str) and "://" in location and not location.startswith("file://")


def parse_storage_options(text: str | None) -> dict[str, Any] | None:
    """The command line's ``--storage-options``: a JSON object handed to fsspec (URLs only)."""
    if text is None:
        return None
    try:
        options = json.loads(text)
    except ValueError as error:
        raise ValueError(f"--storage-options must be a JSON object: {error}") from None
    if not isinstance(options, dict):
        raise ValueError(f"--storage-options must be a JSON object, got {text!r}")
    return options


class ObjectStore:
    """The objects under one URL prefix; picklable, and fork-safe (each process makes its own client)."""

    def __init__(self, url: str, options: dict[str, Any] | None) -> None:
        try:
            import fsspec
        except ImportError:  # pragma: no cover - depends on the installed extras
            raise ImportError(
                f"opening {url} needs fsspec (and s3fs for s3://): pip install 'guideloom[remote]'"
            ) from None
        self.protocol, _, rest = url.partition("://")
        if not rest.strip("/") or (rest.startswith("/") and self.protocol in BUCKET_PROTOCOLS):
            raise ValueError(f"path {url!r} names no bucket: use {self.protocol}://BUCKET/PREFIX")
        self.url = url.rstrip("/")
        rest = rest.rstrip("/")
        self.root = rest
        policy, self.options = RetryPolicy.from_options(options or {})
        self.retrying = Retrying(policy)
        if self.protocol in CONDITIONAL_PROTOCOLS:
            config = {**S3_DEFAULTS["config_kwargs"], **self.options.get("config_kwargs", {})}
            self.options = {**S3_DEFAULTS, **self.options, "config_kwargs": config}
        try:
            fsspec.get_filesystem_class(self.protocol)
        except (ImportError, ValueError) as error:
            raise ImportError(f"opening {url} needs the fsspec implementation of {self.protocol}://: {error}") from None
        self._fs: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_pid": -1}  # a client is made afresh where it is unpickled

    @property
    def conditional(self) -> bool:
        """Whether creating an object is atomic against a racing create (If-None-Match)."""
        return self.protocol in CONDITIONAL_PROTOCOLS

    @property
    def fs(self) -> Any:
        if self._fs is None or self._pid != os.getpid():  # fsspec's async clients must not cross a fork
            import fsspec

            self._fs = fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.options)
            if self.conditional:
                self._fs.retries = 1  # s3fs's own retry loop: one try, guideloom retries
            self._pid = os.getpid()
        return self._fs

    def key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def name_of(self, name: str) -> str:
        """The full URL of an object, for messages."""
        return f"{self.url}/{name}"

    def _call(self, doing: str, request: Callable[[int], T]) -> T:
        """``request(attempt)`` with retries; a failure that remains is an error a user can act on."""
        try:
            return self.retrying.call(doing, request)
        except RetriesExhausted as error:
            raise self.failure(error, doing) from error.last
        except FileNotFoundError as error:
            self._check_root(error)  # a missing bucket is StorageNotFoundError: callers let it through
            raise
        except FileExistsError:
            raise
        except Exception as error:
            raise self.failure(error, doing) from error

    def listing(self, directory: str) -> dict[str, int]:
        """Names (relative to ``directory``) and sizes of the objects in it; empty when there are none."""
        doing = f"listing {self.name_of(directory)}"
        try:
            entries = self._call(doing, lambda _: self.fs.ls(self.key(directory), detail=True, refresh=True))
        except StorageNotFoundError:
            raise
        except FileNotFoundError:
            return {}
        names = {}
        prefix = self.fs._strip_protocol(self.key(directory)).rstrip("/") + "/"
        for entry in entries:
            name = self.fs._strip_protocol(str(entry["name"]))
            if entry.get("type") == "file" and name.startswith(prefix):
                names[name[len(prefix) :]] = int(entry.get("size") or 0)
        return names

    def exists(self, name: str) -> bool:
        doing = f"looking up {self.name_of(name)}"
        return bool(self._call(doing, lambda _: self.fs.exists(self.key(name))))

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        """The object's bytes (or a range of them); None if it does not exist."""
        doing = f"reading {self.name_of(name)}"

        def request(_: int) -> bytes:
            if self.conditional:  # one GET, where fsspec's cat_file may first HEAD and list
                from fsspec.asyn import sync

                bucket, key, _version = self.fs.split_path(self.key(name))
                byte_range = {} if start is None else {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
                return bytes(sync(self.fs.loop, read_s3_object, self.fs, bucket, key, byte_range))
            return bytes(self.fs.cat_file(self.key(name), start=start, end=end))

        try:
            return self._call(doing, request)
        except StorageNotFoundError:
            raise
        except FileNotFoundError:
            return None

    def create(self, name: str, source: bytes | Path) -> bool:
        """Create the object from bytes or a local file unless it exists; True if this call created it.

        An object found existing (412) counts as created by this call when it holds this call's bytes:
        an earlier attempt landed and its answer was lost (our retry, or the HTTP client's own resend
        of a PUT on a dropped kept-alive connection, which aiohttp does once). Compared: the size and
        the last bytes, a shard's footer with its checksums (the whole object for bytes).
        """
        doing = f"creating {self.name_of(name)}"
        try:
            if not self.conditional:
                if self._call(doing, lambda _: self.fs.exists(self.key(name))):
                    return False
                if isinstance(source, Path):
                    self._call(doing, lambda _: self.fs.put_file(str(source), self.key(name)))
                else:
                    self._call(doing, lambda _: self.fs.pipe_file(self.key(name), source))
                return True
            bucket, key, _ = self.fs.split_path(self.key(name))
            if isinstance(source, Path) and source.stat().st_size > MULTIPART_BYTES:
                created = self._create_in_parts(doing, bucket, key, source)
            else:

                def put(_: int) -> bool | None:
                    try:
                        with open(source, "rb") if isinstance(source, Path) else contextlib.nullcontext(source) as body:
                            self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
                    except FileExistsError:  # s3fs's translation of 412 Precondition Failed: whose object?
                        return None
                    return True

                created = self._call(doing, put)
            return self._holds(name, source) if created is None else created
        except StorageNotFoundError:
            raise
        except FileNotFoundError as error:
            raise self.failure(error, doing) from error

    def _holds(self, name: str, source: bytes | Path) -> bool:
        """Whether the object ``name`` is ``source``'s bytes (compared by size and by its last bytes)."""
        if isinstance(source, bytes):
            return self.read(name) == source
        size = source.stat().st_size
        with open(source, "rb") as file:
            file.seek(max(0, size - COMPARED_TAIL))
            tail = file.read()
        listed = self._call(f"looking up {self.name_of(name)}", lambda _: self.fs.info(self.key(name)))
        return int(listed.get("size") or -1) == size and self.read(name, size - len(tail), size) == tail

    def _create_in_parts(self, doing: str, bucket: str, key: str, source: Path) -> bool | None:
        """A multipart upload, completed with If-None-Match: nothing is visible before the completion."""
        call_s3 = self.fs.call_s3
        upload_id = self._call(doing, lambda _: call_s3("create_multipart_upload", Bucket=bucket, Key=key))["UploadId"]
        try:
            parts: list[dict[str, Any]] = []

            def upload_part(number: int, chunk: bytes, _: int) -> Any:
                return call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk)

            with open(source, "rb") as file:
                while chunk := file.read(PART_BYTES):
                    number = len(parts) + 1
                    part = self._call(f"{doing} (part {number})", partial(upload_part, number, chunk))
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

            return self._call(doing, complete)
        except BaseException:
            with contextlib.suppress(Exception):  # a failure here leaves an upload that clean aborts
                call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
            raise

    def download(
        self,
        name: str,
        destination: Path,
        decoder: Callable[[IO[bytes]], Decoder] | None = None,
        size: int | None = None,
    ) -> None:
        """Write the whole object into ``destination`` (created or truncated), through ``decoder`` if given.

        On S3, an object of a known ``size`` (its bytes as stored), read without a decoder, comes in ranged
        parts side by side (``ranged_parts``), each retried on its own; else one GET, retried whole.
        FileNotFoundError if the object is gone. Each attempt starts the file afresh.
        """
        doing = f"downloading {self.name_of(name)}"
        ranges = part_ranges(size) if self.conditional and decoder is None and size is not None else []

        def request(_: int) -> None:
            if self.conditional:
                from fsspec.asyn import sync

                bucket, key, _version = self.fs.split_path(self.key(name))
                sync(self.fs.loop, stream_s3_object, self.fs, bucket, key, destination, decoder)
            elif decoder is None:
                self.fs.get_file(self.key(name), str(destination))
            else:
                with self.fs.open(self.key(name), "rb") as remote, open(destination, "wb") as file:
                    decoding = decoder(file)
                    while chunk := remote.read(DOWNLOAD_CHUNK):
                        decoding.write(chunk)
                    decoding.finish()

        def in_parts() -> None:
            from fsspec.asyn import sync

            bucket, key, _version = self.fs.split_path(self.key(name))
            sync(self.fs.loop, download_parts, self.fs, bucket, key, destination, ranges, self.retrying, doing)

        try:
            if len(ranges) > 1:
                in_parts()
            else:
                self.retrying.call(doing, request)
        except FileNotFoundError:
            raise
        except RetriesExhausted as error:
            raise self.failure(error, doing) from error.last
        except OSError as error:
            if error.filename is not None and Path(str(error.filename)) == destination:
                raise  # the local side failed (a full cache disk): not the store's fault
            raise self.failure(error, doing) from error
        except DamagedDownload:
            raise
        except Exception as error:
            raise self.failure(error, doing) from error

    def delete(self, name: str) -> None:
        doing = f"deleting {self.name_of(name)}"
        try:
            self._call(doing, lambda _: self.fs.rm_file(self.key(name)))
        except StorageNotFoundError:
            raise
        except FileNotFoundError:
            pass

    def abort_uploads(self, directory: str, older_than: float) -> list[str]:
        """Abort multipart uploads under ``directory`` begun ``older_than`` seconds ago or more (S3 only)."""
        if not self.conditional:
            return []
        bucket, prefix, _ = self.fs.split_path(self.key(directory))
        doing = f"listing unfinished uploads under {self.name_of(directory)}"
        listing = self._call(
            doing, lambda _: self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
        )
        aborted = []
        now = time.time()
        for upload in listing.get("Uploads", []):
            if now - upload["Initiated"].timestamp() < older_than:
                continue  # a live writer's, most likely
            arguments = {"Bucket": bucket, "Key": upload["Key"], "UploadId": upload["UploadId"]}
            with contextlib.suppress(FileNotFoundError):  # a retry after the abort landed
                self._call(f"aborting the upload of {upload['Key']}", partial(self._abort, arguments))
            aborted.append(f"{self.protocol}://{bucket}/{upload['Key']}")
        return aborted

    def _abort(self, arguments: dict[str, str], _: int) -> None:
        self.fs.call_s3("abort_multipart_upload", **arguments)

    def _check_root(self, error: FileNotFoundError) -> None:
        """A missing bucket is a missing storage, said so; a missing key is the caller's business."""
        text = str(error)
        if "NoSuchBucket" in text or "specified bucket does not exist" in text:
            raise StorageNotFoundError(f"no storage at {self.url}: the bucket does not exist") from None

    def failure(self, error: BaseException, doing: str) -> Exception:
        """An error a user can act on, for a failed call to the store."""
        if isinstance(error, RetriesExhausted):
            last = error.last
            unreachable = "Connect" in type(last).__name__ or isinstance(last, ConnectionRefusedError)
            where = self._endpoint()
            reason = f"the object store{where} cannot be reached, " if unreachable else ""
            return ConnectionError(f"{doing} failed: {reason}{error} (see storage_options['request_attempts'])")
        text = str(error) or type(error).__name__
        denied = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoCredentials", "credentials")
        if isinstance(error, PermissionError) or any(word in text or word in type(error).__name__ for word in denied):
            return PermissionError(
                f"{doing} was denied: {text} (credentials come from storage_options or the usual environment "
                "variables, e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE)"
            )
        kind = type(error).__name__
        if "Connect" in kind or "Timeout" in kind or isinstance(error, ConnectionError | TimeoutError):
            return ConnectionError(f"{doing} failed: the object store{self._endpoint()} cannot be reached ({text})")
        if isinstance(error, OSError):
            return OSError(error.errno, f"{doing} failed: {text}")
        return OSError(f"{doing} failed: {kind}: {text}")

    def _endpoint(self) -> str:
        endpoint = self.options.get("endpoint_url") or self.options.get("client_kwargs", {}).get("endpoint_url")
        return f" at {endpoint}" if endpoint else ""
