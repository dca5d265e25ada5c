"""Objects of a storage on an object store, through fsspec: one listing, conditional create, whole downloads.

Imported only when a storage is opened by URL (fsspec, and s3fs for ``s3://``, come from the ``remote``
extra). On S3 the calls go through s3fs's own client: a create is a ``PutObject`` with
``If-None-Match: *`` (the store refuses it with 412 when the key exists) and a download streams the
object's body straight into a file. Other fsspec stores use fsspec's generic calls, where a create
is "check, then put" (see docs/object-storage.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from guideloom._core.errors import StorageNotFoundError

CONDITIONAL_PROTOCOLS = ("s3", "s3a")
BUCKET_PROTOCOLS = (*CONDITIONAL_PROTOCOLS, "gs", "gcs", "az", "abfs", "abfss")  # the first part is a bucket
DOWNLOAD_CHUNK = 4 * 1024 * 1024
MULTIPART_BYTES = 1 << 30  # larger shards are uploaded in parts (one PUT takes at most 5 GiB)
PART_BYTES = 64 << 20
# Fail fast on an unreachable endpoint instead of botocore's long defaults; storage_options may override.
S3_DEFAULTS: dict[str, Any] = {
    "use_listings_cache": False,
    "config_kwargs": {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3, "mode": "standard"}},
}


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
        self.options = dict(options or {})
        if self.protocol in CONDITIONAL_PROTOCOLS:
            self.options = {**S3_DEFAULTS, **self.options}
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
            self._pid = os.getpid()
        return self._fs

    def key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def name_of(self, name: str) -> str:
        """The full URL of an object, for messages."""
        return f"{self.url}/{name}"

    def listing(self, directory: str) -> dict[str, int]:
        """Names (relative to ``directory``) and sizes of the objects in it; empty when there are none."""
        try:
            entries = self.fs.ls(self.key(directory), detail=True, refresh=True)
        except FileNotFoundError as error:
            self._check_root(error)
            return {}
        except Exception as error:
            raise self.failure(error, f"listing {self.name_of(directory)}") from error
        names = {}
        prefix = self.fs._strip_protocol(self.key(directory)).rstrip("/") + "/"
        for entry in entries:
            name = self.fs._strip_protocol(str(entry["name"]))
            if entry.get("type") == "file" and name.startswith(prefix):
                names[name[len(prefix) :]] = int(entry.get("size") or 0)
        return names

    def exists(self, name: str) -> bool:
        try:
            return bool(self.fs.exists(self.key(name)))
        except Exception as error:
            raise self.failure(error, f"looking up {self.name_of(name)}") from error

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        """The object's bytes (or a range of them); None if it does not exist."""
        try:
            if self.conditional:  # one GET, where fsspec's cat_file may first HEAD and list
                from fsspec.asyn import sync

                bucket, key, _ = self.fs.split_path(self.key(name))
                byte_range = {} if start is None else {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
                return bytes(sync(self.fs.loop, _read_s3_object, self.fs, bucket, key, byte_range))
            return bytes(self.fs.cat_file(self.key(name), start=start, end=end))
        except FileNotFoundError as error:
            self._check_root(error)
            return None
        except Exception as error:
            raise self.failure(error, f"reading {self.name_of(name)}") from error

    def create(self, name: str, source: bytes | Path) -> bool:
        """Create the object from bytes or a local file unless it exists; True if this call created it."""
        try:
            if self.conditional:
                bucket, key, _ = self.fs.split_path(self.key(name))
                try:
                    if isinstance(source, Path) and source.stat().st_size > MULTIPART_BYTES:
                        return self._create_in_parts(bucket, key, source)
                    if isinstance(source, Path):
                        with open(source, "rb") as body:
                            self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
                    else:
                        self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=source, IfNoneMatch="*")
                except FileExistsError:  # s3fs's translation of 412 Precondition Failed
                    return False
                return True
            if self.fs.exists(self.key(name)):
                return False
            if isinstance(source, Path):
                self.fs.put_file(str(source), self.key(name))
            else:
                self.fs.pipe_file(self.key(name), source)
            return True
        except FileNotFoundError as error:
            self._check_root(error)
            raise self.failure(error, f"creating {self.name_of(name)}") from error
        except Exception as error:
            raise self.failure(error, f"creating {self.name_of(name)}") from error

    def _create_in_parts(self, bucket: str, key: str, source: Path) -> bool:
        """A multipart upload, completed with If-None-Match: nothing is visible before the completion."""
        upload_id = self.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
        try:
            parts: list[dict[str, Any]] = []
            with open(source, "rb") as file:
                while chunk := file.read(PART_BYTES):
                    number = len(parts) + 1
                    part = self.fs.call_s3(
                        "upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk
                    )
                    parts.append({"ETag": part["ETag"], "PartNumber": number})
            self.fs.call_s3(
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                IfNoneMatch="*",
            )
            return True
        except BaseException as error:
            with contextlib.suppress(Exception):  # a failure here leaves an upload that clean aborts
                self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
            if isinstance(error, FileExistsError):  # 412: another writer completed this key first
                return False
            raise

    def download(self, name: str, destination: Path) -> None:
        """Write the whole object into ``destination`` (created or truncated); FileNotFoundError if gone."""
        try:
            if self.conditional:
                from fsspec.asyn import sync

                bucket, key, _ = self.fs.split_path(self.key(name))
                sync(self.fs.loop, _stream_s3_object, self.fs, bucket, key, destination)
            else:
                self.fs.get_file(self.key(name), str(destination))
        except FileNotFoundError:
            raise
        except OSError as error:
            if error.filename is not None and Path(str(error.filename)) == destination:
                raise  # the local side failed (a full cache disk): not the store's fault
            raise self.failure(error, f"downloading {self.name_of(name)}") from error
        except Exception as error:
            raise self.failure(error, f"downloading {self.name_of(name)}") from error

    def delete(self, name: str) -> None:
        try:
            self.fs.rm_file(self.key(name))
        except FileNotFoundError:
            pass
        except Exception as error:
            raise self.failure(error, f"deleting {self.name_of(name)}") from error

    def abort_uploads(self, directory: str, older_than: float) -> list[str]:
        """Abort multipart uploads under ``directory`` begun ``older_than`` seconds ago or more (S3 only)."""
        if not self.conditional:
            return []
        bucket, prefix, _ = self.fs.split_path(self.key(directory))
        try:
            listing = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
            aborted = []
            now = time.time()
            for upload in listing.get("Uploads", []):
                if now - upload["Initiated"].timestamp() < older_than:
                    continue  # a live writer's, most likely
                self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted.append(f"{self.protocol}://{bucket}/{upload['Key']}")
            return aborted
        except Exception as error:
            raise self.failure(error, f"listing unfinished uploads under {self.name_of(directory)}") from error

    def _check_root(self, error: FileNotFoundError) -> None:
        """A missing bucket is a missing storage, said so; a missing key is the caller's business."""
        text = str(error)
        if "NoSuchBucket" in text or "specified bucket does not exist" in text:
            raise StorageNotFoundError(f"no storage at {self.url}: the bucket does not exist") from None

    def failure(self, error: BaseException, doing: str) -> Exception:
        """An error a user can act on, for a failed call to the store."""
        text = str(error) or type(error).__name__
        denied = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoCredentials", "credentials")
        if isinstance(error, PermissionError) or any(word in text or word in type(error).__name__ for word in denied):
            return PermissionError(
                f"{doing} was denied: {text} (credentials come from storage_options or the usual environment "
                "variables, e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE)"
            )
        kind = type(error).__name__
        if "Connect" in kind or "Timeout" in kind or isinstance(error, ConnectionError | TimeoutError):
            endpoint = self.options.get("endpoint_url") or self.options.get("client_kwargs", {}).get("endpoint_url")
            where = f" at {endpoint}" if endpoint else ""
            return ConnectionError(f"{doing} failed: the object store{where} cannot be reached ({text})")
        if isinstance(error, OSError):
            return OSError(error.errno, f"{doing} failed: {text}")
        return OSError(f"{doing} failed: {kind}: {text}")


async def _read_s3_object(fs: Any, bucket: str, key: str, arguments: dict[str, str]) -> bytes:
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **arguments)
    body = response["Body"]
    try:
        return bytes(await body.read())
    finally:
        body.close()


async def _stream_s3_object(fs: Any, bucket: str, key: str, destination: Path) -> None:
    """Stream an S3 object's body into a local file (several times faster than fsspec's cat_file)."""
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    body = response["Body"]
    try:
        with open(destination, "wb") as file:
            while chunk := await body.read(DOWNLOAD_CHUNK):
                file.write(chunk)
    finally:
        body.close()
