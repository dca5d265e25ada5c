"""Import benchmark: Parquet of text and token columns, and images in WebDataset tars, into a storage, in one run.

For the same input, with 1 and 2 processes, MB of input per second (medians of ``--rounds`` rounds, the
ways taking turns, each a fresh process timed from its start, imports included, guideloom's modules compiled
to bytecode first as its wheel's install does) and peak resident memory per process (of the process or of its
largest worker process):

* the limit: pyarrow reading the input into Arrow batches (tarfile reading the members), plus writing the
  same bytes (fsynced), each process a share of the files;
* a user's loop: ``iter_batches``, rows as dicts, ``DocumentStorage.sync_writer(shard_size="256MiB")``
  (one process only);
* ``guideloom import --workers N``;
* the peers' writers, where their libraries are installed in this interpreter
  (``benchmarks/install_peers.sh``): Hugging Face ``datasets`` (``from_parquet`` or ``load_dataset("webdataset")``,
  then ``save_to_disk(num_proc=N)``), Mosaic's ``MDSWriter`` (a writer per process, then ``merge_index``),
  LitData's ``optimize(num_workers=N)``, WebDataset's ``ShardWriter`` (a writer per process), each given
  rows as its documentation shows (dicts with a NumPy array of the token ids; the tars' bytes as they are).

Prints Markdown tables with the ratios of guideloom to the fastest peer and to the limit, and writes
``benchmarks/results/import.json`` and ``import.md``. ``--big`` runs only the memory check: 10 GiB of
Parquet in 32 files of one row group each, ``guideloom import`` once (``import_big.*``).

    python -m benchmarks.bench_import              # 8 Parquet files, 1 GiB in all; 10,000 images; 3 rounds
    python -m benchmarks.bench_import --quick      # one round of 128 MiB and 1,000 images
    python -m benchmarks.bench_import --big --processes 2
    python -m benchmarks.bench_import --ways "limit,guideloom import,datasets"   # some of the ways only
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import argument_parser, machine, run_json_child, write_results

SCRIPT = """
import json, os, resource, sys, time
started = time.perf_counter()  # imports included
from multiprocessing import Pool

inputs, out, workers = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])


def in_processes(function):
    # function(share, number) over the inputs cut into ``workers`` shares of whole files: here with one process
    if workers == 1:
        return [function(inputs, 0)]
    with Pool(workers) as pool:
        return pool.starmap(function, [(inputs[number::workers], number) for number in range(workers)])

{body}

if __name__ == "__main__":
    run()
    seconds = time.perf_counter() - started
    # VmHWM: this process's own peak (ru_maxrss would carry the parent's across exec); its workers' too
    own = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    peak = max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({{"seconds": seconds, "peak_rss_mb": peak / 1024}}))
"""

# Parquet rows for the peers, as their writers take them; tar samples likewise
PARQUET_ROWS = """
import numpy
import pyarrow.parquet as pq


def parquet_rows(path):
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield {"text": row["text"], "input_ids": numpy.asarray(row["input_ids"], numpy.int32)}
"""
TAR_SAMPLES = """
import tarfile


def tar_samples(path):
    with tarfile.open(path, "r:") as tar:
        sample = {}
        for member in tar:
            data = tar.extractfile(member).read()
            if member.name.endswith(".jpg"):
                sample = {"jpg": data}
            else:
                sample["txt"] = data.decode()
                yield sample
"""
MDS_WRITER = """
from benchmarks.peers.mosaic_peer import MDSWriter  # Mosaic's, after the adapter's torchvision stub
from streaming.base.util import merge_index


def write(share, number):
    with MDSWriter(out=f"{out}/{number}", columns=COLUMNS, size_limit="256mb") as writer:
        for path in share:
            for sample in SAMPLES(path):
                writer.write(sample)


def run():
    in_processes(write)
    if workers > 1:
        merge_index([f"{out}/{number}/index.json" for number in range(workers)], out)
"""
LITDATA = """
from litdata import optimize


def run():
    optimize(fn=SAMPLES, inputs=inputs, output_dir=out, num_workers=workers, chunk_bytes="256MB", mode="overwrite")
"""
WEBDATASET_WRITER = """
import webdataset


def write(share, number):
    os.makedirs(out, exist_ok=True)
    with webdataset.ShardWriter(f"{out}/{number}-%06d.tar", maxsize=256 << 20, verbose=0) as writer:
        for path in share:
            for sample in SAMPLES(path):
                writer.write({"__key__": f"{writer.count:09d}", **sample})


def run():
    in_processes(write)
"""
GUIDELOOM_IMPORT = """
from guideloom.importing import import_records


def run():
    import_records(inputs, out, workers=workers)
"""
DATASETS = """
import datasets


def run():
    datasets.disable_progress_bars()
    processes = workers if workers > 1 else None
    dataset = LOAD(processes)
    dataset.save_to_disk(out, num_proc=processes)
"""

# Each way is a script of ``run()``: read ``inputs`` (a JSON list of files), write under ``out``, in ``workers``
# processes.
PARQUET = {
    "limit": """
import pyarrow.parquet as pq


def copy(share, number):
    with open(f"{out}.{number}", "wb") as sink:
        for path in share:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
                for buffer in batch.to_struct_array().buffers():
                    if buffer is not None:
                        sink.write(buffer)
        sink.flush()
        os.fsync(sink.fileno())


def run():
    in_processes(copy)
""",
    "user loop": """
import pyarrow.parquet as pq
from guideloom import DocumentMsgpackFormat, DocumentStorage


def run():
    with DocumentStorage(out, DocumentMsgpackFormat(numpy_arrays=True)).sync_writer(shard_size="256MiB") as writer:
        for path in inputs:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    writer.append(row)
""",
    "guideloom import": GUIDELOOM_IMPORT,
    "datasets": DATASETS.replace(
        "LOAD(processes)", 'datasets.Dataset.from_parquet(inputs, cache_dir=out + ".cache", num_proc=processes)'
    ),
    "Mosaic MDSWriter": PARQUET_ROWS
    + MDS_WRITER.replace("COLUMNS", '{"text": "str", "input_ids": "ndarray:int32"}').replace("SAMPLES", "parquet_rows"),
    "LitData optimize": PARQUET_ROWS + LITDATA.replace("SAMPLES", "parquet_rows"),
    "WebDataset ShardWriter": PARQUET_ROWS
    + WEBDATASET_WRITER.replace("**sample", '"txt": sample["text"], "ids.npy": sample["input_ids"]').replace(
        "SAMPLES", "parquet_rows"
    ),
}
TARS = {
    "limit": """
import tarfile


def copy(share, number):
    with open(f"{out}.{number}", "wb") as sink:
        for path in share:
            with tarfile.open(path, "r:") as tar:
                for member in tar:
                    if member.isfile():
                        sink.write(tar.extractfile(member).read())
        sink.flush()
        os.fsync(sink.fileno())


def run():
    in_processes(copy)
""",
    "guideloom import": GUIDELOOM_IMPORT,
    "datasets": DATASETS.replace(
        "LOAD(processes)",
        'datasets.load_dataset("webdataset", data_files={"train": inputs}, split="train", cache_dir=out + ".cache", '
        "num_proc=processes)",
    ),
    "Mosaic MDSWriter": TAR_SAMPLES
    + MDS_WRITER.replace("COLUMNS", '{"jpg": "bytes", "txt": "str"}').replace("SAMPLES", "tar_samples"),
    "LitData optimize": TAR_SAMPLES + LITDATA.replace("SAMPLES", "tar_samples"),
    "WebDataset ShardWriter": TAR_SAMPLES + WEBDATASET_WRITER.replace("SAMPLES", "tar_samples"),
}
PEER_MODULES = {
    "datasets": "datasets",
    "Mosaic MDSWriter": "streaming",
    "LitData optimize": "litdata",
    "WebDataset ShardWriter": "webdataset",
}
PROCESSES = {"user loop": (1,)}  # a user's own loop is one process


def make_parquet(folder: Path, files: int, mib: int) -> list[Path]:
    """``files`` Parquet files of about ``mib`` MiB in all, one row group each: a text column (about 1,300 characters
    of words) and a column of 300 to 700 token ids, about 1.6 KB of zstd-compressed input a row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(["".join(rng.choice(letters, size)) for size in rng.integers(2, 10, 5000)])
    corpus = " ".join(rng.choice(words, 2_000_000).tolist())  # each row's text a random stretch of it
    rows = mib * 2**20 // (1600 * files)
    paths = []
    for number in range(files):
        starts, sizes = rng.integers(0, len(corpus) - 2000, rows).tolist(), rng.integers(1000, 1600, rows).tolist()
        texts = [corpus[start : start + size] for start, size in zip(starts, sizes, strict=True)]
        offsets = np.zeros(rows + 1, np.int32)
        np.cumsum(rng.integers(300, 700, rows), out=offsets[1:])
        ids = pa.ListArray.from_arrays(offsets, rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32))
        path = folder / f"part-{number:02d}.parquet"
        pq.write_table(pa.table({"text": texts, "input_ids": ids}), path, compression="zstd", row_group_size=rows)
        paths.append(path)
    return paths


def make_tars(folder: Path, images: int, per_tar: int = 1000) -> list[Path]:
    """WebDataset tars of ``images`` 256x256 JPEGs with captions."""
    import tarfile

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    paths = []
    for number, first in enumerate(range(0, images, per_tar)):
        path = folder / f"images-{number:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for index in range(first, min(images, first + per_tar)):
                out = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (256, 256, 3), np.uint8)).save(out, format="JPEG", quality=80)
                for extension, data in (("jpg", out.getvalue()), ("txt", f"caption {index}".encode())):
                    info = tarfile.TarInfo(f"{index:08d}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def measure(script: str, inputs: list[Path], out: Path, workers: int) -> dict[str, Any]:
    """One fresh process running ``script`` with ``workers`` processes: its seconds and peak resident memory."""
    _remove(out)
    path = out.parent / "way.py"  # a file, not ``-c``: peers that start processes by spawning import it again
    path.write_text(SCRIPT.format(body=script))
    command = [sys.executable, str(path), json.dumps([str(path) for path in inputs]), str(out), str(workers)]
    result = run_json_child(command, timeout=3600)
    for leftover in [out, Path(f"{out}.cache"), *out.parent.glob(f"{out.name}.*")]:
        _remove(leftover)
    return result


def run_ways(
    ways: dict[str, str], inputs: list[Path], scratch: Path, rounds: int, processes: tuple[int, ...]
) -> dict[str, Any]:
    """Each way with each process count, ``rounds`` times (the ways taking turns within a round)."""
    size = sum(path.stat().st_size for path in inputs)
    found: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for way, script in ways.items():
            module = PEER_MODULES.get(way)
            if module is not None and importlib.util.find_spec(module) is None:
                found[way] = {"error": f"{module} is not installed"}
                continue
            for workers in PROCESSES.get(way, processes):
                measured = measure(script, inputs, scratch / "out", workers)
                runs.setdefault(f"{way} ({workers})", []).append(measured)
                print(f"{way} ({workers}): {json.dumps(measured)}", file=sys.stderr, flush=True)
    for name, measured in runs.items():
        errors = [run["error"] for run in measured if "error" in run]
        if errors:
            found[name] = {"error": errors[0]}
            continue
        seconds = statistics.median(run["seconds"] for run in measured)
        found[name] = {
            "mb_per_s": size / 1e6 / seconds,
            "seconds": [run["seconds"] for run in measured],
            "peak_rss_mb": max(run["peak_rss_mb"] for run in measured),
        }
    return {"input_mb": size / 1e6, "rounds": rounds, "ways": found}


def ratios(results: dict[str, Any], processes: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """guideloom import's rate over the fastest peer's and over the limit's, per process count."""
    ways = results["ways"]
    found = {}
    for workers in processes:
        ours = ways.get(f"guideloom import ({workers})", {}).get("mb_per_s")
        limit = ways.get(f"limit ({workers})", {}).get("mb_per_s")
        peers = [ways.get(f"{peer} ({workers})", {}).get("mb_per_s") for peer in PEER_MODULES]
        fastest = max((rate for rate in peers if rate), default=None)
        if ours:
            found[str(workers)] = {
                **({"over_fastest_peer": ours / fastest} if fastest else {}),
                **({"over_limit": ours / limit} if limit else {}),
            }
    return found


def table(title: str, results: dict[str, Any]) -> str:
    lines = [
        f"### {title} ({results['input_mb']:.0f} MB of input, medians of {results['rounds']} rounds)",
        "",
        "| way (processes) | MB/s | peak RSS per process (MB) |",
        "|---|---:|---:|",
    ]
    for name, result in results["ways"].items():
        if "error" in result:
            lines.append(f"| {name} | {result['error']} | |")
        else:
            lines.append(f"| {name} | {result['mb_per_s']:.1f} | {result['peak_rss_mb']:.0f} |")
    for workers, found in results.get("ratios", {}).items():
        described = ", ".join(f"{name.replace('_', ' ')} {value:.2f}x" for name, value in found.items())
        lines.append(f"\nguideloom import with {workers} process{'es' if workers != '1' else ''}: {described}")
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=1024, help="MiB of Parquet in all (default 1024)")
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round of 128 MiB of Parquet and 1,000 images")
    parser.add_argument("--big", action="store_true", help="only the memory check: 10 GiB of Parquet (32 files)")
    parser.add_argument("--processes", default="1,2", help="process counts to run the parallel ways with")
    parser.add_argument("--ways", help="only these ways, comma-separated (default: all): limit,guideloom import,...")
    arguments = parser.parse_args()
    processes = tuple(int(count) for count in arguments.processes.split(","))
    if arguments.quick:
        arguments.rounds, arguments.mib, arguments.images = 1, 128, 1000
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        (scratch / "parquet").mkdir()
        if arguments.big:
            big = run_ways(
                {"guideloom import": PARQUET["guideloom import"]},
                make_parquet(scratch / "parquet", 32, 10 * 1024),
                scratch,
                1,
                processes,
            )
            markdown = table("Memory: 10 GiB of Parquet, 32 files of one row group each", big)
            print(markdown)
            write_results("import_big", {"machine": machine(), "parquet": big}, markdown)
            return
        chosen = set(arguments.ways.split(",")) if arguments.ways else set(PARQUET) | set(TARS)
        inputs = make_parquet(scratch / "parquet", arguments.files, arguments.mib)
        parquet_ways = {way: script for way, script in PARQUET.items() if way in chosen}
        parquet = run_ways(parquet_ways, inputs, scratch, arguments.rounds, processes)
        shutil.rmtree(scratch / "parquet")
        (scratch / "tars").mkdir()
        tar_ways = {way: script for way, script in TARS.items() if way in chosen}
        tars = run_ways(tar_ways, make_tars(scratch / "tars", arguments.images), scratch, arguments.rounds, processes)
    parquet["ratios"], tars["ratios"] = ratios(parquet, processes), ratios(tars, processes)
    markdown = "\n\n".join(
        [table("Parquet, text and token columns", parquet), table("JPEGs with captions in WebDataset tars", tars)]
    )
    print(markdown)
    write_results("import", {"machine": machine(), "parquet": parquet, "tars": tars}, markdown)


if __name__ == "__main__":
    main()
