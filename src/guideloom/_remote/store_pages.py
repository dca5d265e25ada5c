"""The object store requests a remote index needs beyond ``ObjectStore``'s: a listing from a key on, a
read of at most so many bytes, and an overwrite.

On S3 a listing from a key on is ``ListObjectsV2`` with ``StartAfter``: keys come in byte order, a
page of up to 1,000 per request, so a reader can list only what sorts after a name it already knows.
Other fsspec stores list everything and the names before the key are dropped (correct, not cheaper).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from guideloom._core.errors import StorageNotFoundError
from guideloom._remote.object_store import ObjectStore
from guideloom._remote.s3_bodies import check_length

PAGE_SIZE = 1000  # keys per ListObjectsV2 page (S3's maximum and default)


def list_after(
    store: ObjectStore, directory: str, start_after: str, enough: Callable[[str], bool] | None = None
) -> tuple[dict[str, int], int]:
    """Names (relative to ``directory``) sorting after ``start_after``, with sizes, and the pages requested.

    Pages are requested until the listing ends or a page holds a name for which ``enough`` is true;
    the names of the last page past that one are returned too (callers ignore what they do not need).
    """
    if not store.conditional:
        everything = store.listing(directory)
        return {name: size for name, size in everything.items() if name > start_after}, 1
    bucket, prefix, _ = store.fs.split_path(store.key(directory))
    prefix = prefix.rstrip("/") + "/"
    names: dict[str, int] = {}
    pages = 0
    token: str | None = None
    doing = f"listing {store.name_of(directory)} after {start_after or 'its start'}"
    while True:
        arguments: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": PAGE_SIZE}
        if token is not None:
            arguments["ContinuationToken"] = token
        else:
            arguments["StartAfter"] = prefix + start_after
        try:
            page: dict[str, Any] = store._call(doing, partial(_list_page, store, arguments))
        except StorageNotFoundError:
            raise
        except FileNotFoundError as error:
            raise store.failure(error, doing) from error
        pages += 1
        found = [(str(entry["Key"])[len(prefix) :], int(entry.get("Size") or 0)) for entry in page.get("Contents", [])]
        names.update(found)
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or token is None:
            return names, pages
        if enough is not None and any(enough(name) for name, _ in found):
            return names, pages


def _list_page(store: ObjectStore, arguments: dict[str, Any], _: int) -> dict[str, Any]:
    page: dict[str, Any] = store.fs.call_s3("list_objects_v2", **arguments)
    return page


def read_at_most(store: ObjectStore, name: str, limit: int) -> tuple[bytes, int] | None:
    """The first ``limit`` bytes of an object and its whole size (one request on S3); None if it is absent."""
    doing = f"reading {store.name_of(name)}"
    if not store.conditional:
        try:
            size = int(store._call(doing, lambda _: store.fs.size(store.key(name))))
        except FileNotFoundError:
            return None
        data = store.read(name, 0, min(size, limit)) if size else b""
        return None if data is None else (data, size)
    from fsspec.asyn import sync

    bucket, key, _ = store.fs.split_path(store.key(name))

    async def request() -> tuple[bytes, int]:
        try:
            response = await store.fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{limit - 1}")
        except OSError as error:
            if "InvalidRange" in str(error) or "not satisfiable" in str(error):  # S3's answer to a range of nothing
                return b"", 0
            raise
        body = response["Body"]
        try:
            data = bytes(await body.read())
        finally:
            body.close()
        check_length(len(data), response, f"{bucket}/{key}")  # a body cut short is retried
        total = str(response.get("ContentRange") or "").rpartition("/")[2]
        return data, int(total) if total.isdigit() else len(data)

    try:
        found: tuple[bytes, int] = store._call(doing, lambda _: sync(store.fs.loop, request))
        return found
    except StorageNotFoundError:
        raise
    except FileNotFoundError:
        return None


def overwrite(store: ObjectStore, name: str, data: bytes) -> None:
    """Put ``data`` under ``name``, replacing what is there (a derived object: the last writer wins)."""
    doing = f"writing {store.name_of(name)}"
    if store.conditional:
        bucket, key, _ = store.fs.split_path(store.key(name))
        store._call(doing, lambda _: store.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data))
    else:
        store._call(doing, lambda _: store.fs.pipe_file(store.key(name), data))
