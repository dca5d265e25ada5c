"""Opening a remote storage of 10^5 shards behind 50 ms a request: with its index object, and without.

    python -m benchmarks.bench_remote_index [--shards 100000] [--latency-ms 50] [--cases indexed,listed]

A moto S3 server runs in this process; a latency proxy on 127.0.0.1 in front of it
(``tests/remote/fault_proxy.py`` with every request delayed by ``--latency-ms``) serves each rank, so
the requests of rank 0 are counted apart. The storage's tiny shards (64 uint16 tokens each) and their
markers are put straight into moto's backend, and its index object is built from the same facts
(``guideloom index URL`` would list them: at this size that costs a listing of 2·10^5 objects, 200
pages). Then, per case, two gloo ranks in fresh processes (each with its own cache directory, as on
two machines) time ``TokenStorage(url)`` + ``StatefulDataLoader.from_storage`` + the first batch.
``indexed``: the index object is current; ``listed``: it is deleted, so rank 0 lists every object.

The 10^6 figure is given by request count: a current index costs the same requests whatever the
count (its bytes, 40 per shard, grow: 40 MB at 10^6), a full listing a page per 1,000 objects.
Results: ``results/remote_index.json`` and ``results/remote_index.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from guideloom import TokenStorage
from guideloom._remote.index_object import INDEX_OBJECT, index_object_bytes
from guideloom._remote.object_backend import PAGE_SIZE
from guideloom._remote.remote_files import marker_name
from guideloom._shards.checkpoints import checkpoints_of
from guideloom._shards.layout import SHARDS_DIR, ShardInfo, shard_file_name, shard_trailer
from guideloom._shards.shard_table import ShardTable
from tests.remote.fault_proxy import FaultProxy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

TOKENS = 256
RANK = """
import json, os, sys, time
import torch.distributed as dist
rank, world, port, url, endpoint, cache = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
from guideloom import StatefulDataLoader, TokenStorage
import guideloom._loading.loader, s3fs  # imports are not timed: a training process has paid for them already
dist.barrier()
started = time.perf_counter()
storage = TokenStorage(url, storage_options={"endpoint_url": endpoint}, cache_dir=cache)
with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=8, sequence_length=16, seed=1) as loader:
    opened = time.perf_counter()
    batch = next(iter(loader))
    done = time.perf_counter()
print(json.dumps({"rank": rank, "open_s": opened - started, "first_batch_s": done - started}))
dist.barrier()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _populate(bucket: str, prefix: str, shards: int, storage: TokenStorage) -> ShardTable:
    """Put ``shards`` tiny shards and their markers straight into moto's backend; their facts."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    header = storage.header_for_reading()
    rows = []
    for shard in range(shards):
        data = ((np.arange(TOKENS) + shard) % 50_000).astype(np.uint16).tobytes()
        offsets = [0, TOKENS // 2, TOKENS]
        checkpoints = checkpoints_of(data, header.checkpoint_bytes)
        body = data + shard_trailer(shard, offsets, len(data), zlib.crc32(data), header, checkpoints=checkpoints)
        info = ShardInfo(shard, len(offsets) - 1, TOKENS, zlib.crc32(data), len(body))
        backend.put_object(bucket, f"{prefix}/{SHARDS_DIR}/{shard_file_name(shard)}", body)
        backend.put_object(bucket, f"{prefix}/{SHARDS_DIR}/{marker_name(info)}", b"")
        rows.append(info)
    return ShardTable.of(rows)


def _with_earlier_rows(rows: list[dict[str, Any]], earlier: Path) -> list[dict[str, Any]]:
    """``rows``, after the rows of cases this run did not measure from an earlier run's results (``--cases``)."""
    try:
        kept = json.loads(earlier.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        kept = []
    measured = {row["case"] for row in rows}
    return [row for row in kept if row["case"] not in measured and row["shards"] == rows[0]["shards"]] + rows


def _median_seconds(call: Any, runs: int = 3) -> float:
    """Median wall time of ``call()`` (moto's own time to answer, straight, without the proxy)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def _run_ranks(url: str, proxies: list[FaultProxy], caches: Path) -> list[dict[str, Any]]:
    port = str(_free_port())
    environment = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), port, url, proxies[rank].endpoint, str(caches / f"rank{rank}")],
            stdout=subprocess.PIPE,
            env=environment,
        )
        for rank in range(2)
    ]
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=1800)
        if process.returncode:
            raise RuntimeError(f"a rank failed with exit status {process.returncode}")
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return sorted(results, key=lambda result: int(result["rank"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--cases", default="indexed,listed")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    arguments = parser.parse_args()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    bucket, prefix = "bench-index", "corpus"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/{prefix}"
    storage = TokenStorage(url, "uint16", storage_options={"endpoint_url": endpoint}, cache_dir=tempfile.mkdtemp())
    storage.create()
    started = time.perf_counter()
    table = _populate(bucket, prefix, arguments.shards, storage)
    populated_s = time.perf_counter() - started
    index = index_object_bytes(table, storage.header_for_reading(), storage.location)
    last_key = f"{prefix}/{SHARDS_DIR}/{arguments.shards - 1:012d}"
    moto_page_s = _median_seconds(
        lambda: client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{SHARDS_DIR}/", StartAfter=last_key)
    )
    rows = []
    try:
        for case in arguments.cases.split(","):
            if case == "indexed":
                client.put_object(Bucket=bucket, Key=f"{prefix}/{INDEX_OBJECT}", Body=index)
            else:
                client.delete_object(Bucket=bucket, Key=f"{prefix}/{INDEX_OBJECT}")
            seen: list[list[str]] = [[], []]
            proxies = [
                FaultProxy(
                    port,
                    {"delay": 1.0},
                    delay_s=arguments.latency_ms / 1000,
                    max_in_a_row=10**9,
                    applies=lambda method, target, seen=seen[rank]: seen.append(f"{method} {target}") is None,
                ).start()
                for rank in range(2)
            ]
            try:
                with tempfile.TemporaryDirectory() as caches:
                    ranks = _run_ranks(url, proxies, Path(caches))
            finally:
                for proxy in proxies:
                    proxy.stop()
            if os.environ.get("BENCH_SHOW_REQUESTS"):
                print("\n".join(seen[0]), file=sys.stderr)
            opening = [len([line for line in lines if not line.endswith(".shard")]) for lines in seen]
            listing_pages = len([line for line in seen[0] if "list-type=2" in line])
            rows.append(
                {
                    "case": case,
                    "shards": arguments.shards,
                    "latency_ms": arguments.latency_ms,
                    "rank0_requests": opening[0],
                    "rank1_requests": opening[1],
                    "rank0_shard_downloads": len(seen[0]) - opening[0],
                    "listing_pages": listing_pages,
                    "moto_listing_page_s": round(moto_page_s, 3),
                    "first_batch_s": [round(rank["first_batch_s"], 3) for rank in ranks],
                    "open_s": [round(rank["open_s"], 3) for rank in ranks],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
    listing_pages = math.ceil(2 * arguments.shards / PAGE_SIZE)
    million_pages = math.ceil(2 * 10**6 / PAGE_SIZE)
    result = {
        "rows": _with_earlier_rows(rows, arguments.out / "remote_index.json"),
        "populated_s": round(populated_s, 1),
        "moto_listing_page_s": round(moto_page_s, 3),
        "index_bytes": len(index),
        "listing_pages": listing_pages,
        "at_10_6": {
            "indexed_requests": next((row["rank0_requests"] for row in rows if row["case"] == "indexed"), None),
            "listed_requests_estimate": million_pages + 3,
            "index_bytes": 40 * (10**6 + 1),
        },
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "remote_index.json").write_text(json.dumps(result, indent=2) + "\n")
    (arguments.out / "remote_index.md").write_text(_markdown(result, arguments.latency_ms))
    print(_markdown(result, arguments.latency_ms))


def _markdown(result: dict[str, Any], latency_ms: float) -> str:
    lines = [
        "| case | shards | requests by rank 0 (listing pages) | construction + first batch, rank 0 / rank 1 (s) "
        "| the same less moto's own time per listing page (s) |",
        "|---|---:|---:|---|---|",
    ]
    for row in result["rows"]:
        seconds = " / ".join(f"{value:.2f}" for value in row["first_batch_s"])
        pages, page = row["listing_pages"], row["moto_listing_page_s"]
        less = " / ".join(f"{value - pages * page:.2f}" for value in row["first_batch_s"])
        less += f" ({page:.2f} s a page)"
        what = "current index object" if row["case"] == "indexed" else "no index"
        lines.append(f"| {what} | {row['shards']:,} | {row['rank0_requests']} ({pages}) | {seconds} | {less} |")
    million = result["at_10_6"]
    lines.append(
        f"| current index object | 1,000,000 | {million['indexed_requests']} (1) | by count: the same requests, "
        f"and an index object of {million['index_bytes'] / 1e6:.0f} MB | |"
    )
    listed = million["listed_requests_estimate"]
    lines.append(
        f"| no index | 1,000,000 | about {listed:,} ({listed - 3:,}) "
        f"| by count: {(listed - 3) * latency_ms / 1000:.0f} s of latency alone | |"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
