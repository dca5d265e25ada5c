"""Object-store clients side by side on the local S3 server: whole-object downloads and listings.

    python -m benchmarks.bench_object_clients [--megabytes 64] [--objects 10000] [--repeats 3]
    python -m benchmarks.bench_object_clients --services [--objects 1000] [--repeats 3] [--only azure]

What guideloom needs from a client is a whole shard streamed into a cache file, and one listing of
a ``shards/`` prefix with many objects. Compared: guideloom's S3 backend (s3fs's client, its GET's body
streamed; its listing in ``ListObjectsV2`` pages), s3fs's ``cat_file`` and ``ls``, obstore (Rust,
object_store), and boto3 as the straightforward baseline.
The server is ``remote/s3_server.py`` in its own process. The best of ``--repeats`` runs counts (a
shared machine only ever slows a run). Results go to ``results/object_clients.json`` and ``.md``.

``--services``: fsspec's client for each service (s3fs, gcsfs, adlfs) beside obstore on the emulators
the tests run on (moto, gcp-storage-emulator, Azurite, each behind the tests' recording proxy, which
answers GCS's 412 for the emulator), and on Azure the SDK's own client (azure-storage-blob, as guideloom's
Azure backend calls it): ranged GETs of 4 KiB to 4 MiB, a listing of ``--objects`` objects (in pages
where the client pages), and conditional creates (new names, then the same names refused); ``--only``
one service. Results go to ``results/object_clients_services.json`` and ``.md``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.harness import argument_parser, s3_server, timed, write_results

BUCKET = "clients"


def _best(repeats: int, run: Callable[[], object]) -> float:
    return timed(run, repeats).best


def _guideloom(endpoint: str) -> Any:
    from guideloom._remote.object_store import ObjectStore

    return ObjectStore(f"s3://{BUCKET}", {"endpoint_url": endpoint})


def _s3fs(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True, use_listings_cache=False)


def _obstore(endpoint: str) -> Any:
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id="bench",
        secret_access_key="bench",
        region="us-east-1",
        client_options={"allow_http": True},
    )


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--services", action="store_true", help="compare the clients on each service's emulator")
    parser.add_argument("--only", choices=("s3", "gcs", "azure"), help="with --services: on this service only")
    arguments = parser.parse_args()
    if arguments.services:
        from benchmarks.object_services import compare_services

        compare_services(arguments.objects, arguments.repeats, arguments.only)
        return
    import boto3
    import obstore

    with (
        tempfile.TemporaryDirectory(prefix="guideloom-clients-") as directory,
        s3_server(Path(directory) / "server.log") as endpoint,
    ):
        work = Path(directory)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        size = arguments.megabytes << 20
        client.put_object(Bucket=BUCKET, Key="big.shard", Body=os.urandom(size))

        def put_empty(index: int) -> None:
            client.put_object(Bucket=BUCKET, Key=f"many/{index:012d}.shard", Body=b"")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put_empty, range(arguments.objects)))
        store, filesystem, object_store = _guideloom(endpoint), _s3fs(endpoint), _obstore(endpoint)
        target = work / "download"

        def obstore_download() -> None:
            with open(target, "wb") as file:
                for chunk in obstore.get(object_store, "big.shard").stream(min_chunk_size=4 << 20):
                    file.write(chunk)

        downloads: dict[str, Callable[[], None]] = {
            "s3fs, guideloom's streaming GET": lambda: store.download("big.shard", target),
            "s3fs cat_file": lambda: target.write_bytes(filesystem.cat_file(f"{BUCKET}/big.shard")),
            "obstore get, streamed": obstore_download,
            "boto3 download_fileobj": lambda: client.download_file(BUCKET, "big.shard", str(target)),
        }
        listings: dict[str, Callable[[], None]] = {
            "s3fs, guideloom's listing pages": lambda: store.listing("many"),
            "s3fs ls": lambda: filesystem.ls(f"{BUCKET}/many", refresh=True),
            "obstore list": lambda: [item for batch in obstore.list(object_store, "many/") for item in batch],
            "boto3 list_objects_v2 pages": lambda: [
                page for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="many/")
            ],
        }
        results: dict[str, Any] = {"megabytes": arguments.megabytes, "objects": arguments.objects}
        results["download_mb_per_s"] = {
            name: size / 1e6 / _best(arguments.repeats, run) for name, run in downloads.items()
        }
        results["listing_s"] = {name: _best(arguments.repeats, run) for name, run in listings.items()}
    lines = [
        f"One {arguments.megabytes} MB object, streamed into a file (MB/s, best of {arguments.repeats}):",
        "",
        "| client | MB/s |",
        "|---|---:|",
        *(f"| {name} | {rate:.0f} |" for name, rate in results["download_mb_per_s"].items()),
        "",
        f"Listing {arguments.objects:,} objects under one prefix (s, best of {arguments.repeats}):",
        "",
        "| client | s |",
        "|---|---:|",
        *(f"| {name} | {seconds:.2f} |" for name, seconds in results["listing_s"].items()),
    ]
    write_results("object_clients", results, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
