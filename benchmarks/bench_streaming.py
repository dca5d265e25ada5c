"""Streaming a corpus larger than the cache: the global shuffle against shuffle_window, per simulated machine.

    python -m benchmarks.bench_streaming [--shards 64] [--shard-mib 1] [--latency-ms 20] [--mb-per-s 25] [--spare 4]

A moto S3 server (``remote/s3_server.py``, counting the bytes it sends) holds a token storage of ``--shards``
shards of ``--shard-mib`` MiB of uint32 tokens; every read goes through ``remote/link_proxy.py`` (by default 20 ms a
request, 25 MB/s shared). Each simulated machine is one process with its own cache directory (one rank per machine,
``rank=machine``, ``world_size=machines``), run one after the other so the server's byte counter belongs to it. Per
machine count (1, 2, 4) and cache (100/50/25/10% of the machine's share, at least ``--spare`` + 1 shards): bytes
downloaded / the machine's share, the mix (distinct shards in a batch of 8, and in 128 consecutive samples of the
rank), the epoch's time against the link's limit (bytes / bandwidth) and the time to the first batch; the window is
the cache's shards less ``--spare`` (4: docs/object-storage.md). The global order is read at one machine, its first
sixteenth of an epoch when the cache is smaller than the corpus (bytes then scaled by 16: marked "est."). A mid-epoch
resume at 25%: half an epoch, a new process loads the state and finishes it with the same cache directory. Results:
``results/streaming.json``, ``.md`` and ``.png``. The peers (``--peers``, all by default: LitData, and MosaicML
Streaming in its default order and two settings tuned to the same window) read the same tokens from their own
formats in ``--peer-python`` (``remote/streaming_peers.py``), on the same machines and caches; a peer that fails
(a timeout of its own) has its error in its row, and the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    REPOSITORY,
    RESULTS,
    argument_parser,
    child_environment,
    free_port,
    machine,
    module_command,
    run_child,
    s3_counters,
    s3_server,
    wait_until_listening,
    write_results,
)
from benchmarks.remote.streaming_peers import corpus_tokens
from benchmarks.remote.streaming_report import plot, table

PEERS = ("litdata", "mosaic", "mosaic-py1e", "mosaic-py1s")  # Mosaic: its default, and two tuned settings

SEQUENCE, BATCH, SEED = 2049, 8, 0
PART = 16  # a global order below a full cache is read for 1 / PART of an epoch, its bytes scaled by PART ("est.")


@contextlib.contextmanager
def link_proxy(upstream: str, latency_ms: float, megabytes_per_second: float, log: Path) -> Iterator[str]:
    """``remote/link_proxy.py`` in front of the S3 server at ``upstream``: its endpoint, while the block runs."""
    port = free_port()
    with open(log, "wb") as errors:
        proxy = subprocess.Popen(
            module_command(
                "benchmarks.remote.link_proxy",
                upstream.rsplit(":", 1)[1],
                str(port),
                str(latency_ms),
                str(megabytes_per_second),
            ),
            cwd=REPOSITORY,
            env=child_environment(),
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    try:
        wait_until_listening(port, proxy, "the link proxy", log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proxy.kill()
        proxy.wait()


def machine_epoch(options: dict[str, Any]) -> dict[str, Any]:
    """One simulated machine's epoch (or the part of it ``options`` asks for), in this process."""
    from guideloom import StatefulDataLoader, TokenStorage

    storage = TokenStorage(
        options["url"],
        storage_options={"endpoint_url": options["endpoint"]},
        cache_dir=options["cache_dir"],
        cache_limit_bytes=options["cache_bytes"],
    )
    started = time.perf_counter()
    loader = StatefulDataLoader.from_storage(
        storage,
        device="cpu",
        local_batch_size=BATCH,
        sequence_length=SEQUENCE,
        shuffle=True,
        seed=SEED,
        shuffle_window=options["window"],
        rank=options["machine"],
        world_size=options["machines"],
        local_world_size=1,
    )
    if options.get("state") is not None:
        loader.load_state_dict(options["state"])
    mix = _mix(loader)
    first_batch = None
    batches = 0
    stop = options.get("stop_after")
    for _ in loader:
        batches += 1
        if first_batch is None:
            first_batch = time.perf_counter() - started
        if stop is not None and batches == stop:
            break
    seconds = time.perf_counter() - started
    state = loader.state_dict()
    loader.close()
    return {"first_batch_s": first_batch, "seconds": seconds, "batches": batches, "state": state, **mix}


def _mix(loader: Any) -> dict[str, float]:
    """Distinct shards in each batch of 8 and in each 128 consecutive samples of this rank, from its order."""
    from guideloom._loading.orders import epoch_order

    source, plan = loader._source, loader._steps(0).fixed
    order = epoch_order(source, loader._settings(), loader.epoch, 0)  # the loader's order, without its prefetching
    positions = plan.full_rank_positions(0, plan.full_batch_count, loader.rank).reshape(-1)
    indices = order.sample_at(positions)
    shards = np.searchsorted(source.reader.token_starts, indices * SEQUENCE, side="right") - 1
    per_batch = [len(set(shards[at : at + BATCH].tolist())) for at in range(0, len(shards) - BATCH + 1, BATCH)]
    per_128 = [len(set(shards[at : at + 128].tolist())) for at in range(0, len(shards) - 127, 128)]
    return {"mix_batch": float(np.mean(per_batch)), "mix_128": float(np.mean(per_128))}


def _run_machine(options: dict[str, Any], server: str) -> dict[str, Any]:
    """One machine's epoch in a fresh process; the bytes the server sent meanwhile are its downloads."""
    s3_counters(server, reset=True)
    _, printed = run_child(module_command("benchmarks.bench_streaming", "--machine-epoch", json.dumps(options)))
    result: dict[str, Any] = json.loads(printed.strip().splitlines()[-1])
    result["bytes"] = s3_counters(server)["get_bytes"]
    return result


def _write_corpus(url: str, endpoint: str, shards: int, shard_tokens: int) -> int:
    from guideloom import TokenStorage

    storage = TokenStorage(url, storage_options={"endpoint_url": endpoint})
    with storage.sync_writer() as writer:
        for shard, tokens in enumerate(corpus_tokens(shards, shard_tokens)):
            for piece in np.split(tokens, 8):
                writer.append(shard, piece)
            writer.commit(shard)
    return int(storage.snapshot().rows["size"].sum())


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--shard-mib", type=float, default=1.0)
    parser.add_argument("--latency-ms", type=float, default=20)
    parser.add_argument("--mb-per-s", type=float, default=25)
    parser.add_argument("--machines", default="1,2,4")
    parser.add_argument("--caches", default="100,50,25,10")
    parser.add_argument("--spare", type=int, default=4, help="the window: the cache's shards less this many")
    parser.add_argument("--peer-python", default=str(REPOSITORY / ".venv-bench" / "bin" / "python"))
    parser.add_argument("--peers", default=",".join(PEERS), help="peers to drive ('' for guideloom alone)")
    parser.add_argument("--out", type=Path, default=RESULTS / "streaming.json", help="the results file (.json)")
    parser.add_argument("--machine-epoch", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.machine_epoch:
        print(json.dumps(machine_epoch(json.loads(arguments.machine_epoch))))
        return
    work = Path(tempfile.mkdtemp(prefix="guideloom-streaming-bench-"))
    os.environ["GUIDELOOM_CACHE_DIR"] = str(work / "default-cache")
    rows: list[dict[str, Any]] = []
    peers: dict[str, Any] = {}
    try:
        with (
            s3_server(work / "server.log") as server,
            link_proxy(server, arguments.latency_ms, arguments.mb_per_s, work / "proxy.log") as proxy,
        ):
            import boto3

            boto3.client("s3", endpoint_url=server, region_name="us-east-1").create_bucket(Bucket="bench")
            url = "s3://bench/corpus"
            corpus_bytes = _write_corpus(url, server, arguments.shards, _shard_tokens(arguments))
            run = _Run(arguments, url, proxy, server, work, corpus_bytes)
            peers = run.peers = _write_peers(run)
            for machines in [int(value) for value in arguments.machines.split(",")]:
                for percent in [int(value) for value in arguments.caches.split(",")]:
                    rows += _cache_rows(run, machines, percent)
                    rows += _peer_rows(run, machines, percent)
            rows.append(_resume_row(run))
            rows += _peer_resume_rows(run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {"shards": arguments.shards, "shard_mib": arguments.shard_mib, "latency_ms": arguments.latency_ms}
    results.update({"mb_per_s": arguments.mb_per_s, "machine": machine(), "rows": rows})
    results["peer_versions"] = peers.get("versions", {})
    path = write_results("streaming", results, table(results), to=arguments.out)
    plot(results, path.with_suffix(".png"))
    print(table(results))


def _shard_tokens(arguments: argparse.Namespace) -> int:
    return int(arguments.shard_mib * (1 << 20)) // 4


@dataclass
class _Run:
    """What every row of one run shares: its arguments, the server, the proxy in front of it, and the corpus."""

    arguments: argparse.Namespace
    url: str
    proxy: str
    server: str
    work: Path
    corpus_bytes: int
    peers: dict[str, Any] = field(default_factory=dict)  # the peers' copies of the corpus ({} without peers)

    @property
    def shard_bytes(self) -> int:
        return self.corpus_bytes // self.arguments.shards + 1

    @property
    def epoch_batches(self) -> int:
        """Batches in one machine's whole epoch of the corpus."""
        return self.arguments.shards * _shard_tokens(self.arguments) // SEQUENCE // BATCH

    def cache_shards(self, machines: int, percent: int) -> int:
        """The shards a machine's cache holds at ``percent`` of its share."""
        return self.arguments.shards // machines * percent // 100

    def window(self, cache_shards: int) -> int:
        """The window that fits a cache of ``cache_shards``: the cache's shards less ``--spare``."""
        return max(1, cache_shards - self.arguments.spare)

    @property
    def smallest_cache(self) -> int:
        """The fewest shards a cache measured holds: a window of one and the ``--spare`` shards."""
        return self.arguments.spare + 1

    def per_machine(self, result: dict[str, Any], machines: int) -> dict[str, Any]:
        """A machine's result with its share of the corpus and the link's time for its bytes."""
        return result | {
            "share": self.corpus_bytes / machines,
            "link_s": result["bytes"] / (self.arguments.mb_per_s * 1e6),
        }


def _cache_rows(run: _Run, machines: int, percent: int) -> list[dict[str, Any]]:
    """The rows of one machine count and cache: the windowed order, and the global one on one machine."""
    cache_shards = run.cache_shards(machines, percent)
    if cache_shards < run.smallest_cache:
        return []
    orders: list[tuple[str, int | None]] = [("windowed", run.window(cache_shards))]
    if machines == 1:
        orders.insert(0, ("global", None))
    rows = []
    for order, window in orders:
        partial = order == "global" and percent < 100
        row: dict[str, Any] = {"order": order, "machines": machines, "cache_percent": percent}
        row.update({"window": window, "estimated": partial, "per_machine": []})
        for each in range(machines):
            options = {
                "url": run.url,
                "endpoint": run.proxy,
                "cache_dir": str(run.work / f"cache-{order}-{machines}-{percent}-{each}"),
                "cache_bytes": cache_shards * run.shard_bytes,
                "window": window,
                "machine": each,
                "machines": machines,
            }
            if partial:
                options["stop_after"] = run.epoch_batches // PART
            result = _run_machine(options, run.server)
            result.pop("state")
            result["bytes"] *= PART if partial else 1
            result = run.per_machine(result, machines)
            row["per_machine"].append(result)
            print(order, machines, percent, each, json.dumps(result), flush=True)
        rows.append(_summary(row))
    return rows


def _write_peers(run: _Run) -> dict[str, Any]:
    """The peers' copies of the corpus (their writers, in the peers' venv) on the server; {} without peers."""
    arguments = run.arguments
    peers = [name for name in arguments.peers.split(",") if name]
    if not peers:
        return {}
    options = _peer_options(run) | {"shard_bytes": run.shard_bytes}
    run_child(
        module_command("benchmarks.remote.streaming_peers", "write", json.dumps(options), python=arguments.peer_python)
    )
    index = json.loads((run.work / "mosaic" / "index.json").read_text())
    versions = run_child([arguments.peer_python, "-c", _VERSIONS])[1].strip()
    return {"names": peers, "samples_per_shard": index["shards"][0]["samples"], "versions": json.loads(versions)}


_VERSIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d: m.version(d) for d in ('litdata', 'mosaicml-streaming')}))"
)


def _peer_options(run: _Run) -> dict[str, Any]:
    shards, tokens = run.arguments.shards, _shard_tokens(run.arguments)
    return {"shards": shards, "shard_tokens": tokens, "work": str(run.work), "server": run.server}


def _peer_rows(
    run: _Run, machines: int, percent: int, names: list[str] | None = None, **extra: Any
) -> list[dict[str, Any]]:
    """Each peer's row (of ``names``, default all) at one machine count and cache: its machines one after the
    other, each in a fresh process."""
    cache_shards = run.cache_shards(machines, percent)
    if not run.peers or cache_shards < run.smallest_cache:
        return []
    rows = []
    for library in run.peers["names"] if names is None else names:
        window = run.window(cache_shards) if library != "mosaic" else None
        if window is None and machines > 1:  # Mosaic's default order thrashes as the global one: one machine
            continue
        partial = window is None and percent < 100 and not extra
        row: dict[str, Any] = {"order": library, "machines": machines, "cache_percent": percent}
        row.update({"window": window, "estimated": partial, "per_machine": []})
        try:
            _peer_machines(run, row, cache_shards, extra)
        except RuntimeError as error:  # the peer's own failure (a timeout of its own) is its row's result
            last_line = error.args[0].strip().splitlines()[-1].replace(str(run.work), "<work>")
            row["error"] = last_line.split(". ")[0][:300]  # its first sentence, without this run's directory
            print(library, machines, percent, "failed:", row["error"], flush=True)
            rows.append(row)
            continue
        rows.append(_summary(row))
    return rows


def _peer_machines(run: _Run, row: dict[str, Any], cache_shards: int, extra: dict[str, Any]) -> None:
    """A peer's epoch on each machine of ``row``, one after the other, each in a fresh process."""
    library, machines, percent = row["order"], row["machines"], row["cache_percent"]
    window, partial = row["window"], row["estimated"]
    for each in range(machines):
        options = _peer_options(run) | {
            "library": library,
            "endpoint": run.proxy,
            "cache_dir": str(run.work / f"cache-{library}-{machines}-{percent}-{each}-{len(extra)}"),
            "cache_bytes": cache_shards * run.shard_bytes,
            "window": window or 1,
            "samples_per_shard": run.peers["samples_per_shard"],
            "machine": each,
            "machines": machines,
            "state_path": str(run.work / f"state-{library}.pt"),
        }
        if partial:
            options["stop_after"] = run.epoch_batches // PART
        result = _peer_epoch(run.arguments, options | extra.get("first", {}))
        result["bytes"] *= PART if partial else 1
        if extra:  # a resume: the rest of the epoch in a new process, from the saved state
            rest = _peer_epoch(run.arguments, options | {"resume": True})
            result = _merged(result, rest)
        result = run.per_machine(result, machines)
        row["per_machine"].append(result)
        print(library, machines, percent, each, json.dumps(result), flush=True)


def _peer_epoch(arguments: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    command = module_command(
        "benchmarks.remote.streaming_peers", "epoch", json.dumps(options), python=arguments.peer_python
    )
    result: dict[str, Any] = json.loads(run_child(command)[1].strip().splitlines()[-1])
    return result


def _peer_resume_rows(run: _Run) -> list[dict[str, Any]]:
    """Each peer at one machine, cache 25%: half an epoch, then a new process resumes from its loader's state."""
    first = {"stop_after": run.epoch_batches // 2}
    names = [name for name in run.peers.get("names", []) if name != "mosaic"]  # its default order thrashes
    return [row | {"order": f"{row['order']}, resumed mid-epoch"} for row in _peer_rows(run, 1, 25, names, first=first)]


def _merged(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """A machine's epoch read in two processes, as one."""
    return {
        "bytes": first["bytes"] + second["bytes"],
        "seconds": first["seconds"] + second["seconds"],
        "first_batch_s": first["first_batch_s"],
        "batches": first["batches"] + second["batches"],
        "mix_batch": first["mix_batch"],
        "mix_128": first["mix_128"],
        "samples": first.get("samples", 0) + second.get("samples", 0),
        "distinct_samples": first.get("distinct_samples", 0) + second.get("distinct_samples", 0),
        "resumed_first_batch_s": second["first_batch_s"],
    }


def _resume_row(run: _Run) -> dict[str, Any]:
    """One machine, cache 25%: half an epoch, then a new process resumes from the state with the same cache."""
    cache_shards = max(run.smallest_cache, run.arguments.shards // 4)  # a quarter of the corpus, or a window of one
    options: dict[str, Any] = {
        "url": run.url,
        "endpoint": run.proxy,
        "cache_dir": str(run.work / "cache-resume"),
        "cache_bytes": cache_shards * run.shard_bytes,
        "window": run.window(cache_shards),
        "machine": 0,
        "machines": 1,
    }
    first = _run_machine({**options, "stop_after": run.epoch_batches // 2}, run.server)
    second = _run_machine({**options, "state": first.pop("state")}, run.server)
    second.pop("state")
    merged = run.per_machine(_merged(first, second), 1)
    row = {"order": "windowed, resumed mid-epoch", "machines": 1, "cache_percent": 25, "window": options["window"]}
    return _summary({**row, "estimated": False, "per_machine": [merged]})


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    machines = row["per_machine"]
    row["bytes_over_share_max"] = max(entry["bytes"] / entry["share"] for entry in machines)
    row["mix_batch"] = float(np.mean([entry["mix_batch"] for entry in machines]))
    row["mix_128"] = float(np.mean([entry["mix_128"] for entry in machines]))
    row["epoch_over_link_max"] = max(entry["seconds"] / max(entry["link_s"], 1e-9) for entry in machines)
    row["after_first_over_link_max"] = max(
        (entry["seconds"] - (entry["first_batch_s"] or 0.0)) / max(entry["link_s"], 1e-9) for entry in machines
    )
    row["first_batch_s_max"] = max(entry["first_batch_s"] or 0.0 for entry in machines)
    return row


if __name__ == "__main__":
    main()
