"""Scale: start-up, state, descriptors, mappings and memory against the shard and document counts.

    python -m benchmarks.bench_scale [--quick] [--data DIR] [--peer-python .venv-bench/bin/python]

Runs with an interpreter that has guideloom and its ``test`` extra (moto, for the remote row); LitData
and MosaicML Streaming run under ``--peer-python``. Four parts, every measurement in a fresh process:

1. **Shards**: local storages of 10^2 .. 10^5 shards (``--quick``: 10^2, 10^3) of 4,096 uint32 tokens
   each (two documents of 2,048), the same tokens written by guideloom, LitData (``BinaryWriter``
   chunks of 4,096 tokens, ``TokensLoader``) and MosaicML Streaming (``MDSWriter`` shards of four
   1,024-token samples). Each library builds a shuffled loader of (8, 1024) batches in the main
   process; measured: construction, first batch, ``state_dict()``, a fresh loader +
   ``load_state_dict`` + first batch (the median of five in a row), and what the first loader
   holds after its first batch: descriptors (``/proc/self/fd``), mappings (``/proc/self/maps``)
   and anonymous memory (``RssAnon``), each counted against the process before the loader.
2. **Documents**: guideloom storages of 10^6 .. 10^8 documents of 8 uint16 tokens (``--quick``:
   10^5, 10^6) in 100 shards, read as plain windows, with ``document_boundaries=True`` and with
   ``pack_documents=True``: the same rows.
3. **Remote**: a storage of 10^3 shards (``--quick``: 10^2) on a local S3 API server (moto), opened
   by 4 ranks with and without a ``torch.distributed`` gloo process group: the list requests the
   server answered, per rank.

Generated storages are kept in ``--data`` (default ``benchmarks/.data/scale``) and reused by later
runs. Results go to ``results/scale.json``, ``results/scale.md`` and ``results/scale.png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    BENCHMARKS,
    REPOSITORY,
    RESULTS,
    argument_parser,
    child_environment,
    free_port,
    module_command,
    run_json_child,
    s3_counters,
    s3_server,
    write_results,
)

SHARD_TOKENS, DOCUMENT_TOKENS = 4096, 2048  # tokens per shard, and per document in the shard storages
SEQUENCE, BATCH = 1024, 8
TINY_DOCUMENT = 8  # tokens per document in the document storages
DOCUMENT_SHARDS = 100
PEERS = ("litdata", "mosaic")
NAMES = {"guideloom": "guideloom", "litdata": "LitData", "mosaic": "MosaicML Streaming"}
MODES = ("plain", "document_boundaries", "pack_documents")
RANKS = 4
RESUMES = 5  # fresh loader + load_state_dict + first batch, repeated in the process: the median is reported
LIST_PAGE = 1000  # keys per S3 list page

# ----------------------------------------------------------------------------- data (cached in --data)


def shard_tokens(shard: int) -> np.ndarray:
    """The tokens of one shard, the same in every library and every process."""
    return np.random.default_rng(shard).integers(0, 50_000, SHARD_TOKENS, dtype=np.uint32)


def _generate(library: str, path: Path, shards: int) -> None:
    """Write ``shards`` shards of :func:`shard_tokens` in ``library``'s own format at ``path``."""
    if library == "guideloom":
        from guideloom import TokenStorage

        with TokenStorage(path, dtype="uint32").sync_writer() as writer:
            for shard in range(shards):
                tokens = shard_tokens(shard)
                writer.append(shard, tokens[:DOCUMENT_TOKENS])
                writer.append(shard, tokens[DOCUMENT_TOKENS:])
                writer.commit(shard)
    elif library == "litdata":
        from litdata import TokensLoader
        from litdata.streaming.writer import BinaryWriter

        writer = BinaryWriter(str(path), chunk_size=SHARD_TOKENS, item_loader=TokensLoader())
        for shard in range(shards):
            writer[shard] = shard_tokens(shard)
        writer.done()
        writer.merge()
    else:
        from benchmarks.peers.mosaic_peer import MDSWriter  # Mosaic's, after the adapter's torchvision stub

        # four fixed-size samples per shard file: the limit covers them and the shard's own header
        limit = 4 * SEQUENCE * 4 + 300
        with MDSWriter(out=str(path), columns={"tokens": f"ndarray:uint32:{SEQUENCE}"}, size_limit=limit) as writer:
            for shard in range(shards):
                for block in shard_tokens(shard).reshape(-1, SEQUENCE):
                    writer.write({"tokens": block})


def _generate_documents(path: Path, documents: int) -> None:
    from guideloom import TokenStorage

    per_shard = documents // DOCUMENT_SHARDS
    rng = np.random.default_rng(0)
    with TokenStorage(path, dtype="uint16").sync_writer() as writer:
        for shard in range(DOCUMENT_SHARDS):
            tokens = rng.integers(0, 50_000, per_shard * TINY_DOCUMENT, dtype=np.uint16).reshape(per_shard, -1)
            for document in tokens:
                writer.append(shard, document)
            writer.commit(shard)


def ensure(path: Path, make: Callable[[Path], None]) -> Path:
    """``path``, made by ``make`` unless an earlier run completed it (a ``.complete`` marker beside it)."""
    marker = path.with_name(path.name + ".complete")
    if marker.exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    make(path)
    marker.touch()
    return path


# ----------------------------------------------------------------------------- measurements (child side)


def process_counts() -> dict[str, float]:
    """Descriptors, mappings and anonymous memory (MB) of this process now."""
    with open("/proc/self/maps", "rb") as maps:
        mappings = sum(1 for _ in maps)
    anonymous_kb = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                anonymous_kb = int(line.split()[1])
    return {"descriptors": len(os.listdir("/proc/self/fd")), "mappings": mappings, "anon_mb": anonymous_kb / 1024}


def _loader_factory(spec: dict[str, Any]) -> Callable[[], Any]:
    """A function that builds the spec's loader (dataset included), its imports done beforehand."""
    library, path = spec["library"], spec["path"]
    if library == "guideloom":
        from guideloom import StatefulDataLoader, TokenStorage

        mode = spec.get("mode", "plain")
        options = {mode: True} if mode != "plain" else {}
        return lambda: StatefulDataLoader.from_storage(
            TokenStorage(path),
            device="cpu",
            local_batch_size=BATCH,
            sequence_length=SEQUENCE,
            shuffle=True,
            drop_last=True,
            **options,
        )
    if library == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

        def litdata_loader() -> Any:
            dataset = StreamingDataset(
                input_dir=path, item_loader=TokensLoader(block_size=SEQUENCE), shuffle=True, drop_last=True, seed=0
            )
            return StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0, drop_last=True)

        return litdata_loader
    import torch

    from benchmarks.peers.mosaic_peer import StreamingDataLoader, StreamingDataset  # after its torchvision stub

    def stack(samples: list[dict[str, np.ndarray]]) -> Any:
        return torch.from_numpy(np.stack([sample["tokens"] for sample in samples]).astype(np.int64))

    def mosaic_loader() -> Any:
        dataset = StreamingDataset(local=path, remote=None, shuffle=True, shuffle_seed=0, batch_size=BATCH)
        return StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0, collate_fn=stack, drop_last=True)

    return mosaic_loader


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Every row of one library over one storage, in this (fresh) process."""
    build = _loader_factory(spec)
    gc.collect()
    before = process_counts()
    started = time.perf_counter()
    loader = build()
    constructed = time.perf_counter()
    next(iter(loader))
    first_batch = time.perf_counter()
    held = process_counts()
    state = loader.state_dict()
    state_seconds = time.perf_counter() - first_batch
    _close(loader)
    del loader
    resumes = []
    for _ in range(RESUMES):
        gc.collect()  # MosaicML Streaming claims its directory until its dataset is collected
        resumed_at = time.perf_counter()
        fresh = build()
        fresh.load_state_dict(state)
        next(iter(fresh))
        resumes.append(time.perf_counter() - resumed_at)
        _close(fresh)
        del fresh
    return {
        "construction_s": constructed - started,
        "first_batch_s": first_batch - constructed,
        "state_dict_s": state_seconds,
        "resume_s": float(np.median(resumes)),
        "resume_spread_s": [min(resumes), max(resumes)],
        **{key: held[key] - before[key] for key in held},
    }


def run_child(python: str, arguments: list[str], timeout: float) -> dict[str, Any]:
    """Run this benchmark in a fresh interpreter; its last stdout line is JSON. Failures are returned."""
    return run_json_child(module_command("benchmarks.bench_scale", *arguments, python=python), timeout)


# ----------------------------------------------------------------------------- remote: list requests per rank


def rank_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank: (with a process group) join it, then build the loader and take its first batch."""
    import torch.distributed as dist

    from guideloom import StatefulDataLoader, TokenStorage

    rank, world_size = spec["rank"], spec["world_size"]
    if spec["process_group"]:
        dist.init_process_group("gloo", init_method=spec["init_method"], rank=rank, world_size=world_size)
    storage = TokenStorage(spec["url"], storage_options={"endpoint_url": spec["endpoint"]}, cache_dir=spec["cache"])
    placement = {} if spec["process_group"] else {"rank": rank, "world_size": world_size}
    started = time.perf_counter()
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=BATCH, sequence_length=SEQUENCE, **placement
    ) as loader:
        next(iter(loader))
    seconds = time.perf_counter() - started
    if spec["process_group"]:
        dist.barrier()
        dist.destroy_process_group()
    return {"seconds": seconds}


def remote_rows(shards: int, work: Path, timeout: float, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """List requests at the server while ``RANKS`` ranks open one remote storage, with and without a group."""
    rows = []
    with s3_server(work / "server.log") as endpoint:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        from guideloom import TokenStorage

        url = "s3://bench/scale"
        storage = TokenStorage(url, dtype="uint32", storage_options={"endpoint_url": endpoint}, cache_dir=work / "w")
        with storage.sync_writer() as writer:
            for shard in range(shards):
                writer.append(shard, shard_tokens(shard))
        for process_group in (False, True):
            s3_counters(endpoint, reset=True)
            init_method = f"tcp://127.0.0.1:{free_port()}"
            children = []
            for rank in range(RANKS):
                spec = {
                    "rank": rank,
                    "world_size": RANKS,
                    "process_group": process_group,
                    "init_method": init_method,
                    "url": url,
                    "endpoint": endpoint,
                    "cache": str(work / f"cache-{process_group}-{rank}"),
                }
                children.append(
                    subprocess.Popen(
                        module_command("benchmarks.bench_scale", "--rank-child", json.dumps(spec)),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                        cwd=REPOSITORY,
                        env=child_environment(),
                    )
                )
            errors = []
            for child in children:
                _, err = child.communicate(timeout=timeout)
                if child.returncode != 0:
                    errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {child.returncode}")
            counters = s3_counters(endpoint)
            row: dict[str, Any] = {"shards": shards, "ranks": RANKS, "process_group": process_group, **counters}
            if errors:
                row["error"] = errors[0]
            rows.append(row)
            log(f"  remote, process group {process_group}: {row}")
    return rows


# ----------------------------------------------------------------------------- report


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:,.1f}"


def _row_cells(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['error']} | | | | | | | "
    return (
        f"{_ms(row.get('first_open_s'))} | {_ms(row['construction_s'])} | {_ms(row['first_batch_s'])} | "
        f"{_ms(row['resume_s'])} | "
        f"{_ms(row['state_dict_s'])} | {row['descriptors']:+.0f} | {row['mappings']:+.0f} | {row['anon_mb']:+.1f}"
    )


def table(results: dict[str, Any]) -> str:
    heading = (
        "| first construction (ms) | construction (ms) | first batch (ms) "
        "| fresh + `load_state_dict` + first batch (ms) | `state_dict()` (ms) "
        "| descriptors | mappings | anonymous MB |"
    )
    rule = "---:|---:|---:|---:|---:|---:|---:|---:|"
    limits = results.get("machine", {})
    lines = [
        f"Shards of {SHARD_TOKENS:,} uint32 tokens, shuffled ({BATCH}, {SEQUENCE}) batches, main process; "
        "descriptors, mappings and anonymous memory: what the loader holds after its first batch. "
        "Each row in a fresh process after one that opened the storage first (its construction: "
        '"first construction"; guideloom builds a storage\'s shard index there when its writer kept none); '
        "fresh + `load_state_dict` + first batch: the median of five in a row in that process (rows measured "
        "before the benchmark repeated it: one). "
        f"{limits.get('cpus')} CPUs (shared), open files limit {limits.get('open_files_limit')}, "
        f"vm.max_map_count {limits.get('max_map_count')}.",
        "",
        f"| shards | library {heading} resume: library / guideloom |",
        f"|---:|---|{rule}---:|",
    ]
    for count in results["shard_counts"]:
        rows = [row for row in results["shards"] if row["shards"] == count]
        ours = next((row for row in rows if row["library"] == "guideloom" and "error" not in row), None)
        for row in rows:
            ratio = "—"
            if ours and "error" not in row and row["library"] != "guideloom":
                ratio = f"{row['resume_s'] / ours['resume_s']:.1f}×"
            lines.append(f"| {count:,} | {NAMES[row['library']]} | {_row_cells(row)} | {ratio} |")
    lines += [
        "",
        f"Documents of {TINY_DOCUMENT} uint16 tokens in {DOCUMENT_SHARDS} shards, guideloom only, the same rows:",
        "",
        f"| documents | windows {heading}",
        f"|---:|---|{rule}",
    ]
    for row in results["documents"]:
        lines.append(f"| {row['documents']:,} | {row['mode']} | {_row_cells(row)} |")
    lines += goals(results)
    if results.get("remote"):
        lines += [
            "",
            "Remote: one storage on a local S3 API server (moto), opened by ranks on this machine; "
            "list requests counted at the server:",
            "",
            "| shards | ranks | process group | list requests | per rank | object GETs |",
            "|---:|---:|---|---:|---:|---:|",
        ]
        for row in results["remote"]:
            note = f" ({row['error']})" if "error" in row else ""
            lines.append(
                f"| {row['shards']:,} | {row['ranks']} | {'yes' if row['process_group'] else 'no'}{note} | "
                f"{row['list_requests']} | {row['list_requests'] / row['ranks']:.2f} | {row['get_requests']} |"
            )
    return "\n".join(lines) + "\n"


def goals(results: dict[str, Any]) -> list[str]:
    """The issue's goals, each with what this run measured."""
    ours = {row["shards"]: row for row in results["shards"] if row["library"] == "guideloom" and "error" not in row}
    lines = ["", "Goals (from this run):", ""]
    counts = sorted(ours)
    if len(counts) >= 2:
        low, high = ours[counts[0]], ours[counts[-1]]
        lines.append(
            f"- fresh loader + `load_state_dict` + first batch at {counts[-1]:,} shards: {_ms(high['resume_s'])} ms "
            f"(goal under 100 ms), {high['resume_s'] / low['resume_s']:.1f}× the {counts[0]:,}-shard figure "
            "(goal within 2×)"
        )
        lines.append(
            f"- descriptors / mappings held: {low['descriptors']:+.0f} / {low['mappings']:+.0f} at {counts[0]:,} "
            f"shards, {high['descriptors']:+.0f} / {high['mappings']:+.0f} at {counts[-1]:,} (goal: flat)"
        )
    behind = [
        f"{NAMES[row['library']]} at {row['shards']:,}"
        for row in results["shards"]
        if row["library"] != "guideloom" and "error" not in row and row["shards"] in ours
        if row["resume_s"] < ours[row["shards"]]["resume_s"]
    ]
    if ours:
        lines.append(
            f"- resume ahead of both peers at every shard count: {'yes' if not behind else 'no, ' + ', '.join(behind)}"
        )
    bounded = [row for row in results["documents"] if row["mode"] == "document_boundaries" and "error" not in row]
    if len(bounded) >= 2:
        lines.append(
            f"- anonymous memory with `document_boundaries`: {bounded[0]['anon_mb']:+.1f} MB at "
            f"{bounded[0]['documents']:,} documents, {bounded[-1]['anon_mb']:+.1f} MB at {bounded[-1]['documents']:,} "
            "(goal: flat)"
        )
    return lines


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    colours = {"guideloom": "tab:green", "litdata": "tab:purple", "mosaic": "tab:orange"}
    for library in ("guideloom", *PEERS):
        rows = [row for row in results["shards"] if row["library"] == library and "error" not in row]
        if not rows:
            continue
        counts = [row["shards"] for row in rows]
        axes[0].plot(
            counts, [row["resume_s"] * 1e3 for row in rows], "o-", color=colours[library], label=NAMES[library]
        )
        axes[1].plot(counts, [row["descriptors"] for row in rows], "o-", color=colours[library], label=NAMES[library])
        axes[1].plot(counts, [row["mappings"] for row in rows], "s--", color=colours[library], alpha=0.6)
    axes[0].set(
        xscale="log", yscale="log", xlabel="shards", ylabel="ms", title="fresh loader + load_state_dict + first batch"
    )
    axes[1].set(
        xscale="log",
        yscale="symlog",
        xlabel="shards",
        title="held after the first batch: descriptors (o), mappings (s)",
    )
    for mode, marker in zip(MODES, "o^s", strict=True):
        rows = [row for row in results["documents"] if row["mode"] == mode and "error" not in row]
        if rows:
            axes[2].plot([row["documents"] for row in rows], [row["anon_mb"] for row in rows], marker + "-", label=mode)
    axes[2].set(xscale="log", xlabel="documents", ylabel="MB", title="anonymous memory held (guideloom)")
    for axis in axes:
        axis.grid(True, which="major", alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


# ----------------------------------------------------------------------------- orchestration


def machine() -> dict[str, Any]:
    """What bounds the rows: CPUs, the descriptor limit the children inherit, the kernel's mapping limit."""
    import platform
    import resource

    with open("/proc/sys/vm/max_map_count") as limit:
        max_map_count = int(limit.read())
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "open_files_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "max_map_count": max_map_count,
    }


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="10^2 and 10^3 shards, 10^5 and 10^6 documents")
    parser.add_argument("--data", type=Path, default=BENCHMARKS / ".data" / "scale", help="generated storages, kept")
    parser.add_argument("--peer-python", default=str(REPOSITORY / ".venv-bench" / "bin" / "python"))
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--parts", default="shards,documents,remote", help="or 'generate': only make the storages")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--generate", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--rank-child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.measure:
        print(json.dumps(measure(json.loads(arguments.measure))))
        return 0
    if arguments.rank_child:
        print(json.dumps(rank_child(json.loads(arguments.rank_child))))
        return 0
    if arguments.generate:
        library, path, count = arguments.generate
        if library == "documents":
            _generate_documents(Path(path), int(count))
        else:
            _generate(library, Path(path), int(count))
        print(json.dumps({}))
        return 0
    shard_counts = [10**2, 10**3] if arguments.quick else [10**2, 10**3, 10**4, 10**5]
    document_counts = [10**5, 10**6] if arguments.quick else [10**6, 10**7, 10**8]
    parts = set(arguments.parts.split(","))
    data = arguments.data
    results: dict[str, Any] = {"shard_counts": shard_counts, "shards": [], "documents": [], "remote": []}
    results["machine"] = machine()
    earlier = RESULTS / "scale.json"
    if earlier.exists() and parts != {"shards", "documents", "remote"}:  # a partial run keeps the other parts
        kept = json.loads(earlier.read_text())
        results.update({part: kept.get(part, []) for part in ("shards", "documents", "remote") if part not in parts})
        if "shards" not in parts:
            results["shard_counts"] = kept.get("shard_counts", shard_counts)

    def python_for(library: str) -> str:
        return sys.executable if library in ("guideloom", "documents") else arguments.peer_python

    def storage(library: str, count: int) -> Path | None:
        path = data / f"{library}-{count}"
        marker = path.with_name(path.name + ".complete")
        if not marker.exists():
            print(f"  generating {path.name}", flush=True)
            generated = run_child(python_for(library), ["--generate", library, str(path), str(count)], 4 * 3600)
            if "error" in generated:
                print(f"  {path.name}: {generated['error']}", flush=True)
                return None
            marker.touch()
        return path

    def measured(python: str, spec: dict[str, Any]) -> dict[str, Any]:
        """The rows in a fresh process, after a first one that opened the storage before (its construction kept).

        The first opening of a storage may build what later ones reuse (guideloom's shard index for a
        storage written without one, its packing caches) and reads the files into the page cache.
        """
        first = run_child(python, ["--measure", json.dumps(spec)], arguments.timeout)
        if "error" in first:
            return first
        return {
            **run_child(python, ["--measure", json.dumps(spec)], arguments.timeout),
            "first_open_s": first["construction_s"],
        }

    if "generate" in parts:  # only make the storages that later runs measure
        for count in shard_counts:
            for library in ("guideloom", *PEERS):
                storage(library, count)
        for count in document_counts:
            storage("documents", count)
        return 0
    if "shards" in parts:
        print("shards:", flush=True)
        for count in shard_counts:
            for library in ("guideloom", *PEERS):
                path = storage(library, count)
                spec = {"library": library, "path": str(path)}
                row = {"error": "not generated"} if path is None else measured(python_for(library), spec)
                results["shards"].append({"library": library, "shards": count, **row})
                print(f"  {count:>7} {library:<10} {row}", flush=True)
    if "documents" in parts:
        print("documents:", flush=True)
        for count in document_counts:
            path = storage("documents", count)
            for mode in MODES:
                spec = {"library": "guideloom", "path": str(path), "mode": mode}
                row = {"error": "not generated"} if path is None else measured(sys.executable, spec)
                results["documents"].append({"documents": count, "mode": mode, **row})
                print(f"  {count:>10} {mode:<20} {row}", flush=True)
    if "remote" in parts:
        print("remote:", flush=True)
        with tempfile.TemporaryDirectory(prefix="guideloom-scale-remote-") as work:
            results["remote"] = remote_rows(10**2 if arguments.quick else 10**3, Path(work), arguments.timeout, print)
    write_results("scale", results, table(results))
    chart(results, RESULTS / "scale.png")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
