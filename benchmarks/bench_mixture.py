"""Mixture benchmark: a 3-component token mixture against one storage and against the peers' mixtures.

(a) Throughput: ``--tokens`` uint32 tokens in documents of 100-4000 tokens, split 50/30/20 into three
    corpora, read as ``(8, 2048)`` int64 batches, shuffled, in the main process, with weights
    0.5/0.3/0.2. Rows: guideloom reading the three corpora as one ``TokenStorage`` (the baseline) and
    as a ``Mixture``; Grain's ``MapDataset.mix`` over ArrayRecord sources; LitData's
    ``CombinedStreamingDataset`` over ``TokensLoader`` datasets; MosaicML Streaming's ``Stream``
    proportions. Each library reads the same ``--batches`` batches' worth of tokens, after writing the
    data in its own format; every library reads in a fresh subprocess, ``--repeats`` runs of ``--batches``
    consecutive batches, and the median run counts.
(b) State: a mixture of 10 components with a 5-stage schedule: the state dict's JSON size, and the
    time a fresh loader takes to load it and yield its first batch (median of ``--repeats``), checked
    against the uninterrupted run's batch.

    .venv-bench/bin/python -m benchmarks.bench_mixture                 # 30M tokens, 5 runs of 3,000 batches
    .venv-bench/bin/python -m benchmarks.bench_mixture --tokens 4000000 --batches 50    # a quick run

Prints a Markdown table and writes JSON (default ``benchmarks/results/mixture.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import RESULTS, argument_parser, module_command, run_json_child, write_results
from benchmarks.run import token_documents  # the same documents as the main benchmark

WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
SEQUENCE_LENGTH = 2048
BATCH = 8
LIBRARIES = ("guideloom-single", "guideloom-mixture", "grain", "litdata", "mosaic")


def corpora(tokens: int) -> dict[str, Iterator[np.ndarray]]:
    """The three corpora, sized as their weights."""
    return {name: token_documents(int(tokens * weight), seed) for seed, (name, weight) in enumerate(WEIGHTS.items())}


# --- writing ------------------------------------------------------------------------------------------


def write(library: str, root: Path, tokens: int) -> None:
    """The corpora in ``library``'s format under ``root / library``."""
    out = root / library
    if library.startswith("guideloom"):
        from guideloom import TokenStorage

        for shard_base, (name, docs) in enumerate(corpora(tokens).items()):
            single = TokenStorage(out / "single") if library == "guideloom-single" else TokenStorage(out / name)
            with single.sync_writer() as writer:
                for doc in docs:
                    writer.append(shard_base if library == "guideloom-single" else 0, doc)
        return
    peer = _peer(library)
    for name, docs in corpora(tokens).items():
        peer.write_tokens(docs, out / name, sequence_length=SEQUENCE_LENGTH)


def _peer(library: str) -> Any:
    if library == "grain":
        from benchmarks.peers import grain_peer

        return grain_peer
    if library == "litdata":
        from benchmarks.peers import litdata_peer

        return litdata_peer
    from benchmarks.peers import mosaic_peer

    return mosaic_peer


# --- reading ------------------------------------------------------------------------------------------


def batches(library: str, root: Path) -> Iterator[Any]:
    """Endless shuffled ``(8, 2048)`` batches of the mixture (or the single storage) in ``library``."""
    out = root / library
    if library.startswith("guideloom"):
        from guideloom import Mixture, StatefulDataLoader, TokenStorage

        if library == "guideloom-single":
            storage: Any = TokenStorage(out / "single")
        else:
            storage = Mixture({name: TokenStorage(out / name) for name in WEIGHTS}, weights=WEIGHTS)
        loader = StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=BATCH, sequence_length=SEQUENCE_LENGTH, shuffle=True, drop_last=True
        )
        while True:
            yield from loader
    if library == "grain":
        import grain

        from benchmarks.peers.grain_peer import TOKENS_FILE, decode_block

        parts = [
            grain.MapDataset.source(grain.sources.ArrayRecordDataSource(str(out / name / TOKENS_FILE))).shuffle(seed=k)
            for k, name in enumerate(WEIGHTS)
        ]
        mixed = grain.MapDataset.mix(parts, list(WEIGHTS.values())).map(decode_block).batch(BATCH, drop_remainder=True)
        for batch in mixed.repeat().to_iter_dataset():
            yield np.asarray(batch).astype(np.int64)
    if library == "litdata":
        from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader

        datasets = [
            StreamingDataset(str(out / name), item_loader=TokensLoader(block_size=SEQUENCE_LENGTH), shuffle=True)
            for name in WEIGHTS
        ]
        combined = CombinedStreamingDataset(datasets, weights=list(WEIGHTS.values()), iterate_over_all=False)
        while True:
            for batch in StreamingDataLoader(combined, batch_size=BATCH, num_workers=0, drop_last=True):
                if len(batch) == BATCH:  # the combined dataset still ends a pass with a short batch
                    yield batch.to("cpu").long()
    if library == "mosaic":
        from benchmarks.peers.mosaic_peer import Stream, StreamingDataLoader, StreamingDataset, stack_tokens

        streams = [Stream(local=str(out / name), proportion=weight) for name, weight in WEIGHTS.items()]
        dataset = StreamingDataset(streams=streams, shuffle=True, batch_size=BATCH)
        while True:
            yield from StreamingDataLoader(dataset, batch_size=BATCH, collate_fn=stack_tokens, drop_last=True)


def measure(library: str, root: Path, count: int, segments: int) -> dict[str, Any]:
    """Tokens per second: the median of ``segments`` runs of ``count`` consecutive batches, after the first
    batch (which pays each loader's start)."""
    begin = time.perf_counter()
    stream = batches(library, root)
    next(stream)
    first = time.perf_counter() - begin
    rates = []
    for _ in range(segments):
        start = time.perf_counter()
        for _ in range(count):
            batch = next(stream)
            assert tuple(batch.shape) == (BATCH, SEQUENCE_LENGTH), batch.shape
        rates.append(count * BATCH * SEQUENCE_LENGTH / (time.perf_counter() - start) / 1e6)
    return {"first_batch_s": first, "mtok_per_s": statistics.median(rates), "runs": rates}


# --- state of a 10 x 5 mixture ------------------------------------------------------------------------


def state_measure(root: Path, repeats: int) -> dict[str, Any]:
    """State size and resume latency of a mixture of 10 components with a 5-stage schedule."""
    from guideloom import Mixture, StatefulDataLoader, TokenStorage

    names = [f"corpus{k}" for k in range(10)]
    for k, name in enumerate(names):
        with TokenStorage(root / "state" / name).sync_writer() as writer:
            for shard in range(4):
                for doc in token_documents(50_000, 100 * k + shard):
                    writer.append(shard, doc)
    rng = np.random.default_rng(0)
    schedule = [(stage * 8192, {name: float(rng.random()) for name in names}) for stage in range(5)]

    def loader() -> Any:
        mixture = Mixture({name: TokenStorage(root / "state" / name) for name in names}, schedule)
        return StatefulDataLoader.from_storage(
            mixture, device="cpu", local_batch_size=BATCH, sequence_length=128, shuffle=True
        )

    with loader() as first:
        iterator = iter(first)
        for _ in range(50):
            next(iterator)
        state = first.state_dict()
        expected = next(iterator)
    text = json.dumps(state)
    times, equal = [], True
    for _ in range(repeats):
        begin = time.perf_counter()
        with loader() as resumed:
            resumed.load_state_dict(json.loads(text))
            batch = next(iter(resumed))
            times.append(time.perf_counter() - begin)
        equal = equal and bool((batch == expected).all())
    return {"state_bytes": len(text), "resume_ms": 1000 * statistics.median(times), "resume_matches": equal}


# --- driver -------------------------------------------------------------------------------------------


def run_child(arguments: list[str]) -> dict[str, Any]:
    """This benchmark with ``arguments`` in a fresh interpreter; its result, or the error it ended with."""
    return run_json_child(module_command("benchmarks.bench_mixture", *arguments), timeout=4 * 3600)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--tokens", type=int, default=30_000_000)
    parser.add_argument("--batches", type=int, default=3000, help="batches per timed run (median of --repeats runs)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default=",".join(LIBRARIES))
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "mixture.json")
    parser.add_argument("--child", nargs=2, metavar=("ACTION", "LIBRARY"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        action, library = arguments.child
        root = arguments.dir
        if action == "write":
            write(library, root, arguments.tokens)
            print(json.dumps({}))
        elif action == "read":
            print(json.dumps(measure(library, root, arguments.batches, arguments.repeats)))
        else:
            print(json.dumps(state_measure(root, arguments.repeats)))
        return
    with tempfile.TemporaryDirectory(dir=arguments.dir, prefix="guideloom-mix-bench-") as directory:
        common = ["--dir", directory, "--tokens", str(arguments.tokens), "--batches", str(arguments.batches)]
        rows = []
        for library in arguments.only.split(","):
            written = run_child([*common, "--child", "write", library])
            reading = [*common, "--repeats", str(arguments.repeats), "--child", "read", library]
            row = written if "error" in written else run_child(reading)
            rows.append({"library": library, **row})
            print(json.dumps(rows[-1]), file=sys.stderr)
        state = run_child([*common, "--repeats", str(arguments.repeats), "--child", "state", "-"])
    report(rows, state, arguments)


def report(rows: list[dict[str, Any]], state: dict[str, Any], arguments: argparse.Namespace) -> None:
    single = next((row.get("mtok_per_s") for row in rows if row["library"] == "guideloom-single"), None)
    mixture = next((row.get("mtok_per_s") for row in rows if row["library"] == "guideloom-mixture"), None)
    print(f"Measured on {platform.platform()}, Python {platform.python_version()}.\n")
    runs = f"median of {arguments.repeats} runs of {arguments.batches} batches"
    print(f"{arguments.tokens:,} tokens in 3 corpora (50/30/20), (8, 2048) batches, shuffled, {runs}\n")
    print("| library | Mtok/s | first batch (s) | guideloom mixture × |")
    print("|---|---:|---:|---:|")
    for row in rows:
        if "error" in row:
            print(f"| {row['library']} | — ({row['error'][:80]}) | — | — |")
            continue
        ratio = f"{mixture / row['mtok_per_s']:.2f}" if mixture else "—"
        print(f"| {row['library']} | {row['mtok_per_s']:.1f} | {row['first_batch_s']:.2f} | {ratio} |")
    if single and mixture:
        print(f"\nmixture / single storage: {mixture / single:.2f}× (goal ≥ 0.9×)")
    if "error" in state:
        print(f"\n10 components × 5 stages: {state['error']}")
    else:
        equal = "equals" if state["resume_matches"] else "DIFFERS from"
        print(
            f"\n10 components × 5 stages: state {state['state_bytes']} bytes of JSON (goal ≤ 1 KB), resume "
            f"{state['resume_ms']:.1f} ms (goal ≤ 10 ms); the first resumed batch {equal} the uninterrupted run's"
        )
    write_results("mixture", {"rows": rows, "state": state, "tokens": arguments.tokens}, to=arguments.out)


if __name__ == "__main__":
    main()
