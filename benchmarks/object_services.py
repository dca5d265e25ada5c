"""fsspec's clients beside obstore on each service's emulator (``bench_object_clients --services``)."""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import write_results

RANGE_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)
BIG = 16 << 20  # the object the ranged GETs read from
READS = 24  # ranged GETs a size, at random offsets
CREATES = 40  # conditional creates of new names, then as many refused
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # else gcsfs asks each bucket's layout over gRPC


class Client:
    """One client library's three requests on one bucket."""

    def __init__(
        self,
        ranged: Callable[[str, int, int], bytes],
        listing: Callable[[str], list[str]],
        create: Callable[[str, bytes], bool],
    ) -> None:
        self.ranged, self.listing, self.create = ranged, listing, create


def _fsspec_client(scheme: str, options: dict[str, Any], bucket: str) -> Client:
    import fsspec

    fs = fsspec.filesystem(scheme, skip_instance_cache=True, use_listings_cache=False, **options)

    def create(key: str, data: bytes) -> bool:
        try:
            fs.pipe_file(f"{bucket}/{key}", data, mode="create")
        except FileExistsError:
            return False
        return True

    return Client(
        lambda key, start, end: bytes(fs.cat_file(f"{bucket}/{key}", start=start, end=end)),
        lambda prefix: list(fs.ls(f"{bucket}/{prefix}", detail=False, refresh=True)),
        create,
    )


def _azure_sdk_client(options: dict[str, Any], bucket: str) -> Client:
    """azure-storage-blob's sync client as guideloom's Azure backend calls it (its retries off, requests counted)."""
    from guideloom._remote.azure_backend import AzureBackend
    from guideloom._remote.retries import Retrying, RetryPolicy

    backend = AzureBackend("az", options)
    retrying = Retrying(RetryPolicy(), backend)

    def listing(prefix: str) -> list[str]:
        names: list[str] = []
        page: str | None = None
        while True:
            found = backend.list_page(f"{bucket}/{prefix}", "", page)
            names.extend(found.names)
            page = found.next_page
            if page is None:
                return names

    return Client(
        lambda key, start, end: backend.read(f"{bucket}/{key}", start, end),
        listing,
        lambda key, data: backend.create(f"{bucket}/{key}", data, retrying, f"creating {key}") is True,
    )


def _obstore_client(service: str, options: dict[str, Any], bucket: str) -> Client:
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError
    from obstore.store import AzureStore, GCSStore, S3Store

    store: Any
    if service == "s3":
        store = S3Store(
            bucket,
            endpoint=options["endpoint_url"],
            access_key_id="testing",
            secret_access_key="testing",
            region="us-east-1",
            client_options={"allow_http": True},
        )
    elif service == "gcs":
        store = GCSStore(
            bucket,
            config={"base_url": options["endpoint_url"], "skip_signature": True},
            client_options={"allow_http": True},
        )
    else:
        fields = dict(part.split("=", 1) for part in options["connection_string"].strip(";").split(";"))
        store = AzureStore(
            bucket,
            config={
                "endpoint": fields["BlobEndpoint"],
                "account_name": fields["AccountName"],
                "account_key": fields["AccountKey"],
            },
            client_options={"allow_http": True},
        )

    def create(key: str, data: bytes) -> bool:
        try:
            obstore.put(store, key, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    return Client(
        lambda key, start, end: bytes(obstore.get_range(store, key, start=start, end=end)),
        lambda prefix: [item["path"] for batch in obstore.list(store, prefix + "/") for item in batch],
        create,
    )


@contextmanager
def _services(work: Path) -> Iterator[dict[str, Any]]:
    """The tests' three emulators behind their proxies, while the block runs."""
    from tests.helpers.processes import free_port
    from tests.remote.s3_support import DUMMY_CREDENTIALS, RequestLog, S3Server
    from tests.remote.services import AZURITE, start_azurite, start_gcs, start_s3_proxy

    os.environ.update(DUMMY_CREDENTIALS)
    moto = S3Server(free_port(), RequestLog())
    moto.start()
    running = {"s3": start_s3_proxy(moto.port), "gcs": start_gcs(free_port())}
    if AZURITE.exists():
        running["azure"] = start_azurite(free_port(), work / "azurite")
    try:
        yield running
    finally:
        for service in running.values():
            service.stop()
        moto.stop()


def _best_ms(repeats: int, run: Callable[[], object], per: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best * 1000 / per


def _measure(client: Client, bucket_prefix: str, objects: int, repeats: int) -> dict[str, Any]:
    generator = random.Random(0)
    measured: dict[str, Any] = {}
    for size in RANGE_SIZES:
        offsets = [generator.randrange(0, BIG - size) for _ in range(READS)]

        def reads(offsets: list[int] = offsets, size: int = size) -> None:
            for offset in offsets:
                got = len(client.ranged("big", offset, offset + size))
                assert got == size, f"a ranged GET of {size} bytes at {offset} gave {got}"

        measured[f"ranged_get_{size >> 10}_kib_ms"] = _best_ms(repeats, reads, READS)
    names = client.listing("many")
    assert len(names) == objects, f"listed {len(names)} of {objects}"
    measured["listing_ms"] = _best_ms(repeats, lambda: client.listing("many"), 1)
    keys = [f"{bucket_prefix}/created/{index:06d}" for index in range(CREATES)]
    started = time.perf_counter()
    assert all(client.create(key, b"x" * 1024) for key in keys), "a create of a new name was refused"
    measured["create_ms"] = (time.perf_counter() - started) * 1000 / CREATES
    started = time.perf_counter()
    assert not any(client.create(key, b"y" * 1024) for key in keys), "a create of an existing name succeeded"
    measured["refused_create_ms"] = (time.perf_counter() - started) * 1000 / CREATES
    return measured


def compare_services(objects: int, repeats: int, only: str | None = None) -> dict[str, Any]:
    """Each client on each service (or on the service ``only``); a client that fails against an emulator is
    recorded with its error."""
    results: dict[str, Any] = {"objects": objects, "repeats": repeats, "reads": READS, "creates": CREATES}
    with tempfile.TemporaryDirectory(prefix="guideloom-services-") as directory, _services(Path(directory)) as running:
        for name, service in running.items():
            if only is not None and name != only:
                continue
            for client_name, measured in _compare_on(name, service, objects, repeats).items():
                results[f"{name}/{client_name}"] = measured
                print(name, client_name, measured, flush=True)
    write_results("object_clients_services", results, _table(results))
    print(_table(results))
    return results


def _compare_on(name: str, service: Any, objects: int, repeats: int) -> dict[str, Any]:
    """fsspec's client and obstore on one service, in a fresh bucket of ``objects`` empty objects and a big one."""
    import fsspec

    bucket = service.new_bucket()
    fs = fsspec.filesystem(service.scheme, skip_instance_cache=True, **service.options)
    fs.pipe_file(f"{bucket}/big", os.urandom(BIG))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda index: fs.pipe_file(f"{bucket}/many/{index:012d}", b""), range(objects)))
    library = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs"}[name]
    clients = {
        library: lambda: _fsspec_client(service.scheme, service.options, bucket),
        "obstore": lambda: _obstore_client(name, service.options, bucket),
    }
    if name == "azure":  # the client guideloom's Azure backend uses
        clients["azure-storage-blob"] = lambda: _azure_sdk_client(service.options, bucket)
    measured: dict[str, Any] = {}
    for client_name, make in clients.items():
        try:
            measured[client_name] = _measure(make(), client_name, objects, repeats)
        except Exception as error:  # a client the emulator does not serve: said so in the results
            measured[client_name] = {"error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}
    return measured


def _table(results: dict[str, Any]) -> str:
    columns = [f"ranged_get_{size >> 10}_kib_ms" for size in RANGE_SIZES] + [
        "listing_ms",
        "create_ms",
        "refused_create_ms",
    ]
    heads = [f"GET {size >> 10} KiB" for size in RANGE_SIZES] + [
        f"list {results['objects']:,}",
        "create",
        "refused create",
    ]
    lines = [
        f"Each client on each service's emulator behind the tests' proxy, ms a request (best of {results['repeats']};"
        f" {results['reads']} ranged GETs a size, {results['creates']} creates), listing: ms for all objects.",
        "",
        "| service / client | " + " | ".join(heads) + " |",
        "|---|" + "---:|" * len(heads),
    ]
    for name, measured in results.items():
        if not isinstance(measured, dict):
            continue
        if "error" in measured:
            lines.append(f"| {name} | fails: {measured['error'][:150]} |" + " |" * (len(heads) - 1))
        else:
            lines.append(f"| {name} | " + " | ".join(f"{measured[column]:.1f}" for column in columns) + " |")
    return "\n".join(lines)
