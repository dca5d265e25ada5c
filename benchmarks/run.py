"""guideloom side by side with the peer libraries, in one run, reported as ratios.

    bash benchmarks/install_peers.sh              # once: .venv-bench with the peers and guideloom
    .venv-bench/bin/python -m benchmarks.run      # about 50 minutes on 2 cores; --quick for a smoke run

Every measurement runs in a fresh subprocess (clean peak RSS and CPU time), ``--repeats`` times;
the tables give medians. Results go to ``benchmarks/results/latest.{json,md,png}`` and the table
into ``benchmarks/README.md`` between its ``<!-- results -->`` markers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import BENCHMARKS, RESULTS, argument_parser, machine, module_command, run_json_child, timed

PEER_KEYS = ("naive", "torchdata", "litdata", "mosaic", "hf", "grain")
FORMATS = ("pickle", "msgpack", "struct")


# ----------------------------------------------------------------------------- data


def token_documents(total: int, seed: int = 0) -> Iterator[np.ndarray]:
    """Documents of 100–4000 uint32 tokens, ``total`` tokens in all, the same in every process."""
    rng = np.random.default_rng(seed)
    written = 0
    while written < total:
        length = min(int(rng.integers(100, 4001)), total - written)
        yield rng.integers(0, 50_000, length, dtype=np.uint32)
        written += length


def records(count: int, seed: int = 1) -> Iterator[dict[str, Any]]:
    """Records ``{"document_id", "tokens": 50–500 ints}``."""
    rng = np.random.default_rng(seed)
    for document_id in range(count):
        yield {"document_id": document_id, "tokens": rng.integers(0, 50_000, int(rng.integers(50, 501)))}


def adapter(library: str) -> Any:
    if library == "guideloom":
        from benchmarks import ours

        return ours
    from benchmarks.peers import load_peer

    return load_peer(library)


# ----------------------------------------------------------------------------- measurements (child side)


def _usage() -> dict[str, float]:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cpu": me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime,
        "peak_rss_mb": max(me.ru_maxrss, children.ru_maxrss) / 1024,
    }


def _timed(work: Callable[[], float]) -> dict[str, float]:
    """Run ``work`` (returns a count of units); wall and CPU seconds, peak RSS.

    A full garbage collection first, so that one left pending by the imports and data set-up (tens of
    milliseconds for torch's objects) does not land inside a short measurement of one library only."""
    gc.collect()
    before = _usage()
    started = time.perf_counter()
    units = work()
    wall = time.perf_counter() - started
    after = _usage()
    return {"units": units, "seconds": wall, "cpu_seconds": after["cpu"] - before["cpu"], **after}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    kind, library, data = spec["kind"], spec.get("library"), Path(spec["data"])
    if library not in (None, "tofile", "in-memory", "machine"):
        implementation = adapter(library)  # imported before any timing starts
    if kind == "write_tokens":
        documents = list(token_documents(spec["tokens"]))
        out = data / f"tokens-{library}"
        shutil.rmtree(out, ignore_errors=True)
        os.sync()  # no dirty pages of earlier steps may throttle this writer
        if library == "tofile":
            array = np.concatenate(documents)  # raw tofile: the tokens already in one array, before timing

            def write() -> float:
                out.mkdir(parents=True)
                with open(out / "tokens.bin", "wb") as file:
                    array.tofile(file)
                    if spec.get("fsync"):
                        file.flush()
                        os.fsync(file.fileno())
                return float(array.size)

            return _timed(write)

        def write_with_adapter() -> float:
            implementation.write_tokens(documents, out, sequence_length=2048)
            return float(sum(len(d) for d in documents))

        return _timed(write_with_adapter)
    if kind == "write_documents":
        items = list(records(spec["records"]))
        out = data / f"documents-{library}-{spec.get('format', '')}"
        shutil.rmtree(out, ignore_errors=True)
        os.sync()
        extra = {"format": spec["format"]} if library == "guideloom" else {}

        def write_records() -> float:
            implementation.write_documents(items, out, **extra)
            return float(len(items))

        return _timed(write_records)
    if kind == "token_epoch":
        import torch

        out = data / f"tokens-{library}"

        def read_epoch() -> float:
            tokens = 0
            extra = {"window_dtype": getattr(torch, spec["window_dtype"])} if spec.get("window_dtype") else {}
            for batch in implementation.token_batches(out, num_workers=spec["workers"], **extra):
                tokens += batch.numel()
            return float(tokens)

        return _timed(read_epoch)
    if kind == "document_epoch":
        out = data / f"documents-{library}-{spec.get('format', '')}"
        extra = {"format": spec["format"]} if library == "guideloom" else {}

        def read_documents() -> float:
            count = 0
            for batch in implementation.document_batches(out, num_workers=spec["workers"], **extra):
                count += len(batch["lengths"])
            return float(count)

        return _timed(read_documents)
    if kind == "documents_in_memory":
        import torch  # imported before timing, as the loaders' runs do

        from benchmarks.peers._common import NormalizingCollate

        # The collate every loader above is given (normalise each record, then pad), over the records
        # as they were written, already in memory: the rate no loader can beat.
        collate = NormalizingCollate()
        decoded = list(records(spec["records"]))
        order = np.random.default_rng(0).permutation(len(decoded))

        def collate_only() -> float:
            for start in range(0, len(order), 32):
                collate([decoded[i] for i in order[start : start + 32]])
            return float(len(decoded))

        return _timed(collate_only)
    if kind == "resume":
        from benchmarks.peers import resume_first_batch

        result = resume_first_batch(implementation, data / f"tokens-{library}", spec["fraction"])
        return dict(vars(result))
    if kind == "resume_windows":
        return _resume_at_scale(data / "tokens-guideloom", spec["fraction"])
    if kind == "limits":
        return _limits(data / "tokens-tofile" / "tokens.bin")
    raise ValueError(f"unknown measurement {kind!r}")


def _resume_at_scale(path: Path, fraction: float) -> dict[str, Any]:
    """Resume latency in an epoch of 10**7 windows (S = 10 over 100M tokens): flat in position?"""
    from guideloom import StatefulDataLoader, TokenStorage

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            TokenStorage(path), device="cpu", local_batch_size=8, sequence_length=10, shuffle=True
        )

    with loader() as original:
        windows = original.sample_count
        target = int(fraction * len(original))
        iterator = iter(original)
        for _ in range(target):
            next(iterator)
        state = json.dumps(original.state_dict())
        expected = next(iterator)
    started = time.perf_counter()
    with loader() as resumed:
        resumed.load_state_dict(json.loads(state))
        first = next(iter(resumed))
        seconds = time.perf_counter() - started
    return {
        "windows": windows,
        "seconds": seconds,
        "matches": bool((first == expected).all()),
        "state_bytes": len(state),
    }


def _limits(token_file: Path) -> dict[str, Any]:
    """This machine's memcpy, page-cache read and uint32→int64 conversion bandwidths, in tokens/s."""
    source = np.fromfile(token_file, dtype=np.uint32)
    target = np.empty_like(source)
    wide = np.empty(source.size, np.int64)

    def best(work: Callable[[], None]) -> float:
        return timed(work, repeats=3).best

    def read_file() -> None:
        with open(token_file, "rb", buffering=0) as file:
            file.readinto(memoryview(target).cast("B"))

    return {
        "memcpy_tokens_per_s": source.size / best(lambda: np.copyto(target, source)),
        "page_cache_tokens_per_s": source.size / best(read_file),
        "convert_tokens_per_s": source.size / best(lambda: np.copyto(wide, source)),
        "tokens": int(source.size),
    }


# ----------------------------------------------------------------------------- orchestration (parent side)


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One measurement in a fresh interpreter; failures are reported, not raised."""
    return run_json_child(module_command("benchmarks.run", "--measure", json.dumps(spec)), timeout)


def median_of(spec: dict[str, Any], repeats: int, timeout: float, log: Callable[[str], None]) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        result = run_child(spec, timeout)
        if "error" in result:
            log(f"  {spec['kind']} {spec.get('library')} {spec.get('format', '')}: {result['error']}")
            return result
        runs.append(result)
    keys = [key for key, value in runs[0].items() if isinstance(value, int | float) and not isinstance(value, bool)]
    merged = {key: statistics.median(run[key] for run in runs) for key in keys}
    merged.update({key: value for key, value in runs[0].items() if key not in merged})
    log(f"  {spec['kind']:<18} {spec.get('library', ''):<10} {spec.get('format', '')!s:<8} {_short(merged)}")
    return merged


def _short(result: dict[str, Any]) -> str:
    if "units" in result and result.get("seconds"):
        return f"{result['units'] / result['seconds'] / 1e6:8.2f} M/s  ({result['seconds']:.2f} s)"
    return json.dumps({k: v for k, v in result.items() if not isinstance(v, float) or v < 1e6})[:120]


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--tokens", type=int, default=100_000_000)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", default=",".join(PEER_KEYS))
    parser.add_argument("--sections", default="writes,tokens,documents,resume,limits")
    parser.add_argument("--data", type=Path, default=BENCHMARKS / ".data")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--quick", action="store_true", help="10M tokens, 20k records, 1 repeat")
    parser.add_argument("--only", help="re-measure these kinds (e.g. documents_in_memory) into results/latest.json")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.measure:
        print(json.dumps(measure(json.loads(arguments.measure))))
        return 0
    if arguments.quick:
        arguments.tokens, arguments.records, arguments.repeats = 10_000_000, 20_000, 1
    peers = [key for key in arguments.peers.split(",") if key]
    sections = set(arguments.sections.split(","))
    libraries = ["guideloom", *peers]
    arguments.data.mkdir(parents=True, exist_ok=True)
    common = {"data": str(arguments.data), "tokens": arguments.tokens, "records": arguments.records}
    results: dict[str, Any] = {"machine": machine_with_versions(), "tokens": arguments.tokens}
    results["records"] = arguments.records
    results["unavailable"] = unavailable(peers)
    libraries = [library for library in libraries if library not in results["unavailable"]]

    def measure_all(kind: str, variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
        print(f"{kind}:", flush=True)
        rows = []
        for variant in variants:
            spec = {**common, "kind": kind, **variant}
            rows.append({**variant, **median_of(spec, arguments.repeats, arguments.timeout, print)})
        return rows

    document_variants = [{"library": "guideloom", "format": f} for f in FORMATS] + [
        {"library": library} for library in libraries if library != "guideloom"
    ]
    plan: dict[str, tuple[str, list[dict[str, Any]]]] = {  # kind: (section, variants), in running order
        "write_tokens": (
            "writes",
            [{"library": "tofile"}, {"library": "tofile", "fsync": True}] + [{"library": lib} for lib in libraries],
        ),
        "write_documents": ("writes", document_variants),
        "token_epoch": (
            "tokens",
            [{"library": lib, "workers": w} for w in (0, 2) for lib in libraries]
            + [{"library": "guideloom", "workers": 0, "window_dtype": "int32"}],
        ),
        "documents_in_memory": ("documents", [{"library": "in-memory"}]),
        "document_epoch": ("documents", [{**v, "workers": w} for w in (0, 2) for v in document_variants]),
        "resume": ("resume", [{"library": lib, "fraction": f} for f in (0.1, 0.9) for lib in libraries]),
        "resume_windows": ("resume", [{"library": "guideloom", "fraction": f} for f in (0.1, 0.9)]),
        "limits": ("limits", [{"library": "machine"}]),
    }
    if arguments.only:
        # Re-measure some kinds over the data of an earlier full run, keeping its other results.
        results = {**json.loads((RESULTS / "latest.json").read_text()), "machine": results["machine"]}
        kinds = arguments.only.split(",")
    else:
        # The read sections read what the writes wrote, so writes always run in a full run.
        kinds = [kind for kind, (section, _) in plan.items() if section in sections or section == "writes"]
    for kind in kinds:
        results[kind] = measure_all(kind, plan[kind][1])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=1, default=str))
    from benchmarks.report import write_report

    write_report(results, RESULTS, BENCHMARKS / "README.md")
    print((RESULTS / "latest.md").read_text())
    return 0


def unavailable(peers: list[str]) -> dict[str, str]:
    """Peers whose adapters cannot import here, with the reason."""
    missing = {}
    for key in peers:
        done = subprocess.run(
            [sys.executable, "-c", f"from benchmarks.peers import load_peer; load_peer({key!r})"],
            capture_output=True,
            text=True,
            cwd=BENCHMARKS.parent,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            missing[key] = lines[-1] if lines else "import failed"
    return missing


def machine_with_versions() -> dict[str, Any]:
    """The machine, with the versions of torch and NumPy that every measurement ran with."""
    import torch

    return {**machine(), "torch": torch.__version__, "numpy": np.__version__}


if __name__ == "__main__":
    raise SystemExit(main())
