"""Object storage: guideloom, LitData and MosaicML Streaming reading the same tokens from one local S3 server.

    python -m benchmarks.bench_remote [--tokens N] [--peer-python .venv-bench/bin/python] [--part speed|bytes|all]

Runs with an interpreter that has guideloom's ``remote`` and ``test`` extras (moto, boto3, s3fs); the
peers run under ``--peer-python``. A moto server (``remote/s3_server.py``, counting the bytes it sends)
holds each library's copy of the same documents. Every reader runs in a fresh process with an empty
cache directory and reads three shuffled epochs of (8, 2048) int64 batches in the main process: the
first epoch cold (everything downloaded), then two warm ones (from the library's local cache; the faster
counts). guideloom on local disk is the reference for the warm epoch. Results go to
``results/remote.json`` and ``results/remote.md``.

``--part bytes`` (also in ``all``): for the token corpus and the document corpus, each library's
copy without and with zstd (guideloom's ``compression="zstd"``, LitData's ``optimize(compression=
"zstd")``, Mosaic's ``MDSWriter(compression="zstd")``): bytes stored, bytes downloaded by one cold
epoch and its rate; then guideloom's zstd token copy read cold through the fault proxy of the tests
(``tests/remote/fault_proxy.py``) with no faults and with 5% of requests answered 503 SlowDown.
Results go to ``results/remote_bytes.json`` and ``.md``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    REPOSITORY,
    S3_CREDENTIALS,
    argument_parser,
    child_environment,
    free_port,
    module_command,
    read_results,
    run_child,
    s3_server,
    wait_until_listening,
    write_results,
)

READERS = [("guideloom", "guideloom"), ("litdata", "LitData"), ("mosaic", "MosaicML Streaming")]


def _run(python: str, *args: str, environment: dict[str, str]) -> str:
    """One step of ``remote/worker.py`` under ``python``; what it printed."""
    return run_child(module_command("benchmarks.remote.worker", *args, python=python), env=environment)[1]


def _upload(client: Any, directory: Path, bucket: str, prefix: str) -> int:
    total = 0
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(directory).as_posix()}")
            total += path.stat().st_size
    return total


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--tokens", type=int, default=32 << 20)
    parser.add_argument("--peer-python", default=str(REPOSITORY / ".venv-bench" / "bin" / "python"))
    parser.add_argument("--part", choices=("speed", "bytes", "faults", "all"), default="all")
    arguments = parser.parse_args()
    if arguments.part in ("bytes", "faults", "all"):
        bytes_and_faults(arguments.tokens, arguments.peer_python, only_faults=arguments.part == "faults")
    if arguments.part in ("bytes", "faults"):
        return
    import boto3

    work = Path(tempfile.mkdtemp(prefix="guideloom-remote-bench-"))
    try:
        with s3_server(work / "server.log") as endpoint:
            results = speed(
                boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1"), endpoint, work, arguments
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)  # every library's copy and cache: hundreds of MB
    write_results("remote", results, _table(results))
    print(_table(results))


def speed(client: Any, endpoint: str, work: Path, arguments: Any) -> dict[str, Any]:
    """Each library's copy written, then read for three epochs (cold, then warm) by a fresh process each."""
    environment = _environment(work, endpoint)
    client.create_bucket(Bucket="bench")
    sources: dict[str, str] = {}
    stored: dict[str, int] = {}
    tokens = str(arguments.tokens)
    started = time.perf_counter()
    _run(sys.executable, "write", "guideloom", "s3://bench/guideloom", tokens, environment=environment)
    write_seconds = {"guideloom": time.perf_counter() - started}
    sources["guideloom"] = "s3://bench/guideloom"
    _run(sys.executable, "write", "guideloom", str(work / "local"), tokens, environment=environment)
    for library, _ in READERS[1:]:
        started = time.perf_counter()
        _run(
            arguments.peer_python,
            "write",
            library,
            str(work / library),
            str(arguments.tokens),
            environment=environment,
        )
        stored[library] = _upload(client, work / library, "bench", library)
        write_seconds[library] = time.perf_counter() - started  # local write + upload
        sources[library] = f"s3://bench/{library}"
    listing = client.list_objects_v2(Bucket="bench", Prefix="guideloom/")
    stored["guideloom"] = sum(item["Size"] for item in listing.get("Contents", []))
    results: dict[str, Any] = {"tokens": arguments.tokens, "stored_bytes": stored, "write_seconds": write_seconds}
    runs = [(library, sources[library]) for library, _ in READERS] + [("guideloom-local", str(work / "local"))]
    for name, source in runs:
        library = name.removesuffix("-local")
        python = sys.executable if library == "guideloom" else arguments.peer_python
        out = _run(python, "read", library, source, str(work / f"cache-{name}"), endpoint, "3", environment=environment)
        results[name] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        print(name, results[name], flush=True)
    return results


def _environment(work: Path, endpoint: str) -> dict[str, str]:
    """The workers' environment: the server's endpoint and credentials, and where a writer builds its shards."""
    return child_environment(**S3_CREDENTIALS, BENCH_ENDPOINT=endpoint, GUIDELOOM_CACHE_DIR=str(work / "default-cache"))


def _stored(client: Any, prefix: str) -> int:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=f"{prefix}/")
    return sum(item["Size"] for page in pages for item in page.get("Contents", []))


def _start_proxy(upstream: int, rates: dict[str, float], log: Path, seed: int) -> tuple[subprocess.Popen[bytes], str]:
    """The tests' fault proxy (``tests/remote/fault_proxy.py``) in front of the server, in its own process."""
    port = free_port()
    with open(log, "wb") as errors:
        proxy = subprocess.Popen(
            module_command("tests.remote.fault_proxy", str(upstream), str(port), str(seed), json.dumps(rates)),
            cwd=REPOSITORY,
            env=child_environment(),
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    wait_until_listening(port, proxy, "the fault proxy", log)
    return proxy, f"http://127.0.0.1:{port}"


def _fault_runs(port: int, work: Path, environment: dict[str, str]) -> list[dict[str, Any]]:
    """guideloom's zstd token copy read cold directly, through the proxy, and through it with 5% 503s.

    Five rounds, interleaved, each with another seed of the proxy (so other requests meet the 503s);
    the mean rate of each run counts, with the retries of all five.
    """
    endpoint = f"http://127.0.0.1:{port}"
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_number in range(5):
        for label, rates in (("direct", None), ("proxy, no faults", {}), ("proxy, 5% 503", {"slow_down": 0.05})):
            url, proxy = endpoint, None
            if rates is not None:
                proxy, url = _start_proxy(port, rates, work / "proxy.log", seed=round_number)
            try:
                arguments = ["s3://bench/tokens-guideloom-zstd", str(work / "cache-faults"), url, "1", "tokens"]
                out = _run(
                    sys.executable,
                    "read",
                    "guideloom",
                    *arguments,
                    environment={**environment, "BENCH_COUNTERS": endpoint},
                )
            finally:
                if proxy is not None:
                    proxy.kill()
                    proxy.wait()
                shutil.rmtree(work / "cache-faults", ignore_errors=True)
            epoch = next(json.loads(line) for line in out.splitlines() if line.startswith("{"))
            runs.setdefault(label, []).append(epoch)
            print(label, epoch, flush=True)
    return [
        {
            "run": label,
            "tokens": sum(epoch["tokens"] for epoch in epochs),
            "seconds": sum(epoch["seconds"] for epoch in epochs),
            "retries": sum(epoch["retries"] for epoch in epochs),
            "epochs": epochs,
        }
        for label, epochs in runs.items()
    ]


def bytes_and_faults(tokens: int, peer_python: str, only_faults: bool = False) -> None:
    """Bytes stored and downloaded per cold epoch with and without zstd, and a cold epoch under 503s."""
    import boto3

    work = Path(tempfile.mkdtemp(prefix="guideloom-remote-bytes-"))
    results: dict[str, Any] = {"tokens": tokens, "rows": []}
    saved = read_results("remote_bytes")
    if only_faults and saved is not None:  # keep the bytes measured by an earlier run
        results["rows"] = saved["rows"]
    try:
        with s3_server(work / "server.log") as endpoint:
            environment = _environment(work, endpoint)
            port = int(endpoint.rsplit(":", 1)[1])
            client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
            client.create_bucket(Bucket="bench")
            for corpus in () if only_faults else ("tokens", "documents"):
                for library, _ in READERS:
                    for compression in ("none", "zstd"):
                        name = f"{corpus}-{library}-{compression}"
                        python = sys.executable if library == "guideloom" else peer_python
                        if library == "guideloom":
                            source = f"s3://bench/{name}"
                            _run(
                                python,
                                "write",
                                library,
                                source,
                                str(tokens),
                                corpus,
                                compression,
                                environment=environment,
                            )
                        else:
                            _run(
                                python,
                                "write",
                                library,
                                str(work / name),
                                str(tokens),
                                corpus,
                                compression,
                                environment=environment,
                            )
                            _upload(client, work / name, "bench", name)
                            shutil.rmtree(work / name)
                            source = f"s3://bench/{name}"
                        out = _run(
                            python,
                            "read",
                            library,
                            source,
                            str(work / f"cache-{name}"),
                            endpoint,
                            "1",
                            corpus,
                            environment=environment,
                        )
                        shutil.rmtree(work / f"cache-{name}", ignore_errors=True)
                        epoch = next(json.loads(line) for line in out.splitlines() if line.startswith("{"))
                        row = {
                            "corpus": corpus,
                            "library": library,
                            "compression": compression,
                            "stored_bytes": _stored(client, name),
                            **epoch,
                        }
                        results["rows"].append(row)
                        print(row, flush=True)
            if only_faults:
                source = "s3://bench/tokens-guideloom-zstd"
                _run(
                    sys.executable, "write", "guideloom", source, str(tokens), "tokens", "zstd", environment=environment
                )
            results["faults"] = _fault_runs(port, work, environment)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_results("remote_bytes", results, _bytes_table(results))
    print(_bytes_table(results))


def _bytes_table(results: dict[str, Any]) -> str:
    names = dict(READERS)
    lines = [
        f"{results['tokens'] / 1e6:.0f}M uint32 tokens (and the same tokens as records of 50-500), one cold "
        "shuffled epoch per copy, main process.",
        "",
        "| corpus | library | compression | MB stored | MB downloaded, cold epoch | cold rate (M/s) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for row in results["rows"]:
        unit = "Mtok/s" if row["corpus"] == "tokens" else "k records/s"
        rate = row["tokens"] / row["seconds"] / (1e6 if row["corpus"] == "tokens" else 1e3)
        lines.append(
            f"| {row['corpus']} | {names[row['library']]} | {row['compression']} | {row['stored_bytes'] / 1e6:.1f} | "
            f"{row['get_bytes'] / 1e6:.1f} | {rate:.1f} {unit} |"
        )
    faults = results.get("faults", [])
    if faults:
        base = faults[0]["tokens"] / faults[0]["seconds"]
        lines += [
            "",
            "guideloom, zstd tokens, a cold epoch (5 runs each, mean rate, retries of all 5):",
            "",
            "| run | Mtok/s | × direct | retries |",
            "|---|---:|---:|---:|",
        ]
        for row in faults:
            rate = row["tokens"] / row["seconds"]
            lines.append(f"| {row['run']} | {rate / 1e6:.1f} | {rate / base:.2f} | {row['retries']} |")
    return "\n".join(lines) + "\n"


def _rate(epoch: dict[str, Any]) -> float:
    return float(epoch["tokens"] / epoch["seconds"])


def _cold_warm(epochs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first epoch, and the faster of the warm ones (a shared machine's noise only ever slows an epoch)."""
    return epochs[0], max(epochs[1:], key=_rate)


def _table(results: dict[str, Any]) -> str:
    local_rate = _rate(_cold_warm(results["guideloom-local"])[1])
    ours = _cold_warm(results["guideloom"])
    lines = [
        f"{results['tokens'] / 1e6:.0f}M uint32 tokens, (8, 2048) int64 batches, shuffled, main process; "
        f"guideloom on local disk, warm: {local_rate / 1e6:.1f} Mtok/s.",
        "",
        "| library | first batch (s) | cold Mtok/s | warm Mtok/s | MB downloaded, cold epoch | warm epoch | "
        "guideloom × (first batch / cold / warm) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for library, name in READERS:
        cold, warm = _cold_warm(results[library])
        ratios = (
            cold["first_batch_s"] / ours[0]["first_batch_s"],
            (ours[0]["tokens"] / ours[0]["seconds"]) / (cold["tokens"] / cold["seconds"]),
            (ours[1]["tokens"] / ours[1]["seconds"]) / (warm["tokens"] / warm["seconds"]),
        )
        lines.append(
            f"| {name} | {cold['first_batch_s']:.2f} | {cold['tokens'] / cold['seconds'] / 1e6:.1f} | "
            f"{warm['tokens'] / warm['seconds'] / 1e6:.1f} | {cold['get_bytes'] / 1e6:.0f} | "
            f"{warm['get_bytes'] / 1e6:.0f} | {' / '.join(f'{ratio:.2f}' for ratio in ratios)} |"
        )
    warm_ratio = (ours[1]["tokens"] / ours[1]["seconds"]) / local_rate
    lines += ["", f"guideloom's warm epoch from object storage: {warm_ratio:.2f}× its local-disk figure."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
