"""Import benchmark: Parquet of text and token columns, and images in WebDataset tars, into a storage, in one run.

For the same input, with 1 and 2 processes, MB of input per second (medians of ``--rounds`` rounds,
each way a fresh process timed from outside, start-up included) and peak resident memory (of the process
or of its largest worker process):

* the limit: pyarrow reading the input into Arrow batches, plus writing the same bytes (fsynced);
* a user's loop: ``iter_batches``, rows as dicts, ``DocumentStorage.sync_writer(shard_size="256MiB")``
  (one process only);
* ``guideloom import --workers N``;
* Hugging Face ``datasets``: ``Dataset.from_parquet`` + ``save_to_disk(num_proc=N)``, when installed;
* for the tars: tarfile reading the members plus writing their bytes (the limit), and ``guideloom import``.

Mosaic's ``MDSWriter``, LitData's ``optimize`` and WebDataset's ``ShardWriter`` run where their
libraries are installed in this interpreter (``benchmarks/install_peers.sh``). Prints a Markdown
table and writes ``benchmarks/results/import.json``.

    python -m benchmarks.bench_import                      # 8 Parquet files, 1 GiB in all; 10,000 images
    python -m benchmarks.bench_import --mib 64 --images 1000 --rounds 1   # a quick run
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from benchmarks.harness import argument_parser, machine, run_json_child, write_results

MEASURE = """
import json, os, resource, sys, time
started = time.perf_counter()
{body}
seconds = time.perf_counter() - started
# VmHWM: this process's own peak (ru_maxrss would carry the parent's across exec); its worker processes' too
own = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
peak = max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({{"seconds": seconds, "peak_rss_mb": peak / 1024}}))
"""

WAYS = {
    "limit": """
import pyarrow.parquet as pq
inputs, out = json.loads(sys.argv[1]), sys.argv[2]
with open(out, "wb") as sink:
    for path in inputs:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for buffer in batch.to_struct_array().buffers():
                if buffer is not None:
                    sink.write(buffer)
    sink.flush()
    os.fsync(sink.fileno())
""",
    "user loop": """
import pyarrow.parquet as pq
from guideloom import DocumentMsgpackFormat, DocumentStorage
inputs, out = json.loads(sys.argv[1]), sys.argv[2]
with DocumentStorage(out, DocumentMsgpackFormat(numpy_arrays=True)).sync_writer(shard_size="256MiB") as writer:
    for path in inputs:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                writer.append(row)
""",
    "guideloom import": """
from guideloom.importing import import_records
inputs, out, workers = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
import_records(inputs, out, workers=workers)
""",
    "datasets": """
import datasets
datasets.disable_progress_bars()
inputs, out, workers = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dataset = datasets.Dataset.from_parquet(inputs, cache_dir=out + ".cache", num_proc=workers if workers > 1 else None)
dataset.save_to_disk(out, num_proc=workers if workers > 1 else None)
""",
    "Mosaic MDSWriter": """
import numpy
import pyarrow.parquet as pq
from streaming import MDSWriter
inputs, out = json.loads(sys.argv[1]), sys.argv[2]
with MDSWriter(out=out, columns={"text": "str", "input_ids": "ndarray:int32"}, size_limit="256mb") as writer:
    for path in inputs:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                writer.write({"text": row["text"], "input_ids": numpy.asarray(row["input_ids"], numpy.int32)})
""",
    "tar limit": """
import tarfile
inputs, out = json.loads(sys.argv[1]), sys.argv[2]
with open(out, "wb") as sink:
    for path in inputs:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                if member.isfile():
                    sink.write(tar.extractfile(member).read())
    sink.flush()
    os.fsync(sink.fileno())
""",
}
PEER_MODULES = {"datasets": "datasets", "Mosaic MDSWriter": "streaming"}
PARQUET_WAYS = ("limit", "user loop", "guideloom import", "datasets", "Mosaic MDSWriter")
TAR_WAYS = ("tar limit", "guideloom import")
PROCESSES = {"limit": (1,), "user loop": (1,), "Mosaic MDSWriter": (1,), "tar limit": (1,)}


def make_parquet(folder: Path, files: int, mib: int) -> list[Path]:
    """``files`` Parquet files of about ``mib`` MiB in all: a text column and a column of token ids."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    words = np.array("the of and to in is was for data model train token loader shard storage".split())
    rows = mib * 2**20 // (1200 * files)  # about 1.2 KB of compressed input a row
    paths = []
    for number in range(files):
        lengths = rng.integers(200, 400, rows)
        texts = [" ".join(rng.choice(words, 150)) for _ in range(rows)]
        ids = pa.array([rng.integers(0, 50_000, length).astype(np.int32) for length in lengths], pa.list_(pa.int32()))
        path = folder / f"part-{number:02d}.parquet"
        pq.write_table(pa.table({"text": texts, "input_ids": ids}), path, compression="zstd")
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


def measure(way: str, inputs: list[Path], out: Path, workers: int) -> dict[str, Any]:
    """One fresh process doing ``way`` with ``workers`` processes: its seconds and peak resident memory."""
    _remove(out)
    code = MEASURE.format(body=textwrap.dedent(WAYS[way]))
    command = [sys.executable, "-c", code, json.dumps([str(path) for path in inputs]), str(out), str(workers)]
    result = run_json_child(command, timeout=3600)
    _remove(out)
    _remove(Path(f"{out}.cache"))
    return result


def run_ways(
    ways: tuple[str, ...], inputs: list[Path], scratch: Path, rounds: int, processes: tuple[int, ...]
) -> dict[str, Any]:
    size = sum(path.stat().st_size for path in inputs)
    found: dict[str, Any] = {}
    for way in ways:
        module = PEER_MODULES.get(way)
        if module is not None and importlib.util.find_spec(module) is None:
            found[way] = {"error": f"{module} is not installed"}
            continue
        for workers in PROCESSES.get(way, processes):
            runs = [measure(way, inputs, scratch / "out", workers) for _ in range(rounds)]
            errors = [run["error"] for run in runs if "error" in run]
            if errors:
                found[f"{way} ({workers})"] = {"error": errors[0]}
                continue
            seconds = statistics.median(run["seconds"] for run in runs)
            found[f"{way} ({workers})"] = {
                "mb_per_s": size / 1e6 / seconds,
                "seconds": [run["seconds"] for run in runs],
                "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
            }
    return {"input_mb": size / 1e6, "ways": found}


def table(title: str, results: dict[str, Any]) -> str:
    lines = [
        f"### {title} ({results['input_mb']:.0f} MB of input)",
        "",
        "| way (processes) | MB/s | peak RSS (MB) |",
        "|---|---:|---:|",
    ]
    for name, result in results["ways"].items():
        if "error" in result:
            lines.append(f"| {name} | {result['error']} | |")
        else:
            lines.append(f"| {name} | {result['mb_per_s']:.1f} | {result['peak_rss_mb']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=1024, help="MiB of Parquet in all (default 1024)")
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", default="1,2", help="process counts to run the parallel ways with")
    arguments = parser.parse_args()
    processes = tuple(int(count) for count in arguments.processes.split(","))
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        (scratch / "parquet").mkdir()
        (scratch / "tars").mkdir()
        parquet = run_ways(
            PARQUET_WAYS,
            make_parquet(scratch / "parquet", arguments.files, arguments.mib),
            scratch,
            arguments.rounds,
            processes,
        )
        tars = run_ways(TAR_WAYS, make_tars(scratch / "tars", arguments.images), scratch, arguments.rounds, processes)
    markdown = "\n\n".join([table("Parquet, text and token columns", parquet), table("JPEGs in WebDataset tars", tars)])
    print(markdown)
    write_results("import", {"machine": machine(), "parquet": parquet, "tars": tars}, markdown)


if __name__ == "__main__":
    main()
