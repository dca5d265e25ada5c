"""Storage benchmark: TokenStorage write throughput and DocumentStorage random reads, against baselines.

(a) Writing ``--tokens`` uint32 tokens in documents of 100-4000 tokens through
    ``TokenStorage.sync_writer`` (one shard, committed: fsync + link), compared with
    writing the same concatenated array with ``numpy.ndarray.tofile``, alone and
    followed by ``fsync`` (our writer fsyncs for crash safety). A third baseline writes the
    same documents with one ``file.write`` call each, then fsyncs: the floor for appending
    document by document from Python.
(b) Random ``reader.read(i)`` over ``--records`` documents ``{"document_id", "tokens": 50-500 ints}``
    with the spec's custom struct/NumPy format, pickle, msgpack and json, compared with a flat
    file of pickled records plus an offsets array, read through mmap + ``pickle.loads``.

Every number is the median of ``--repeats`` runs made in this same process. Files live in a
temporary directory (``--dir``); reads come from the page cache (the files were just written).
Prints a Markdown table and writes JSON (default ``benchmarks/results/storage.json``).

    python -m benchmarks.bench_storage                       # full size: 100M tokens, 200k records
    python -m benchmarks.bench_storage --tokens 2000000 --records 5000   # a quick run
"""

from __future__ import annotations

import mmap
import os
import pickle
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import RESULTS, argument_parser, machine, timed, write_results
from benchmarks.ours import TokenDocumentFormat  # the custom format of spec/documents.txt
from guideloom import DocumentJsonFormat, DocumentMsgpackFormat, DocumentPickleFormat, DocumentStorage, TokenStorage
from guideloom.types import DocumentStorageFormat

VOCABULARY = 50_257
WRITE_GOAL = 0.8


def median_time(run: Callable[[], None], repeats: int, prepare: Callable[[], None] | None = None) -> float:
    """Median wall time of ``run`` over ``repeats`` runs; ``prepare`` runs untimed before each."""
    return timed(run, repeats, prepare).median


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


# --- (a) token writes --------------------------------------------------------------------------------


def token_documents(total: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``total`` uint32 tokens and the document boundaries (documents of 100-4000 tokens)."""
    tokens = rng.integers(0, VOCABULARY, size=total, dtype=np.uint32)
    lengths = rng.integers(100, 4001, size=total // 100 + 1)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    bounds = bounds[bounds < total]
    return tokens, np.append(bounds, total)


def bench_token_writes(directory: Path, total: int, repeats: int, rng: np.random.Generator) -> dict[str, Any]:
    tokens, bounds = token_documents(total, rng)
    storage_path, flat_path = directory / "tokens", directory / "tokens.bin"

    def write_storage() -> None:
        with TokenStorage(storage_path, "uint32").sync_writer() as writer:
            for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                writer.append(0, tokens[start:stop])

    def write_tofile() -> None:
        tokens.tofile(flat_path)

    def write_tofile_fsync() -> None:
        with open(flat_path, "wb") as file:
            tokens.tofile(file)
            file.flush()
            os.fsync(file.fileno())

    def write_per_document_fsync() -> None:
        """The floor for appending one document at a time from Python: a write call per document."""
        with open(flat_path, "wb") as file:
            for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                file.write(tokens[start:stop])
            file.flush()
            os.fsync(file.fileno())

    seconds = {
        "guideloom": median_time(write_storage, repeats, lambda: remove(storage_path)),
        "tofile": median_time(write_tofile, repeats, lambda: remove(flat_path)),
        "tofile+fsync": median_time(write_tofile_fsync, repeats, lambda: remove(flat_path)),
        "file.write per document+fsync": median_time(write_per_document_fsync, repeats, lambda: remove(flat_path)),
    }
    with TokenStorage(storage_path).sync_reader() as reader:
        assert reader.token_count == total and len(reader) == len(bounds) - 1
    remove(storage_path)
    remove(flat_path)
    rates = {name: total / value for name, value in seconds.items()}
    return {
        "tokens": total,
        "documents": len(bounds) - 1,
        "seconds": seconds,
        "tokens_per_second": rates,
        "ratio_to_tofile": rates["guideloom"] / rates["tofile"],
        "ratio_to_tofile_fsync": rates["guideloom"] / rates["tofile+fsync"],
    }


# --- (b) random document reads -----------------------------------------------------------------------


def records(count: int, rng: np.random.Generator) -> Iterator[dict[str, Any]]:
    """``count`` documents ``{"document_id": i, "tokens": [50-500 ints]}``, the same for every format."""
    lengths = rng.integers(50, 501, size=count)
    tokens = rng.integers(0, VOCABULARY, size=int(lengths.sum()), dtype=np.int32)
    start = 0
    for index, length in enumerate(lengths.tolist()):
        yield {"document_id": index, "tokens": tokens[start : start + length].tolist()}
        start += length


def write_flat_pickle(path: Path, count: int, seed: int) -> None:
    """The baseline file: pickled records back to back, then the uint64 offsets, then their count."""
    offsets = [0]
    with open(path, "wb") as file:
        for record in records(count, np.random.default_rng(seed)):
            encoded = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
            file.write(encoded)
            offsets.append(offsets[-1] + len(encoded))
        file.write(np.asarray(offsets, "<u8").tobytes())
        file.write(struct.pack("<Q", count))


def read_flat_pickle(path: Path, order: list[int]) -> Callable[[], None]:
    def run() -> None:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
            view = memoryview(mapping)
            (count,) = struct.unpack_from("<Q", mapping, len(mapping) - 8)
            offsets = np.frombuffer(mapping, "<u8", count + 1, len(mapping) - 8 - 8 * (count + 1)).tolist()
            loads = pickle.loads
            for index in order:
                loads(view[offsets[index] : offsets[index + 1]])
            del offsets
            view.release()

    return run


def read_storage(storage: DocumentStorage[Any, Any], order: list[int]) -> Callable[[], None]:
    def run() -> None:
        with storage.sync_reader() as reader:
            read = reader.read
            for index in order:
                read(index)

    return run


def bench_document_reads(directory: Path, count: int, repeats: int, seed: int) -> dict[str, Any]:
    formats: dict[str, DocumentStorageFormat[Any, Any]] = {
        "custom struct/NumPy": TokenDocumentFormat(),
        "pickle": DocumentPickleFormat(),
        "msgpack": DocumentMsgpackFormat(),
        "msgpack, tokens as a NumPy array": DocumentMsgpackFormat(numpy_arrays=True),
        "json": DocumentJsonFormat(),
    }
    order = np.random.default_rng(seed + 1).permutation(count).tolist()
    flat = directory / "flat.pickle"
    write_flat_pickle(flat, count, seed)
    seconds = {"flat pickle + offsets (baseline)": median_time(read_flat_pickle(flat, order), repeats)}
    sizes = {"flat pickle + offsets (baseline)": flat.stat().st_size}
    remove(flat)
    for name, document_format in formats.items():
        path = directory / name.replace("/", "-").replace(" ", "-")
        storage = DocumentStorage(path, document_format)
        with storage.sync_writer() as writer:
            for record in records(count, np.random.default_rng(seed)):
                if "NumPy array" in name:
                    record = {**record, "tokens": np.asarray(record["tokens"], np.int32)}
                writer.append(0, record)
        with storage.sync_reader() as reader:
            assert len(reader) == count and reader.read(count - 1)["document_id"] == count - 1
        seconds[name] = median_time(read_storage(storage, order), repeats)
        sizes[name] = sum(file.stat().st_size for file in (path / "shards").iterdir())
        remove(path)
    rates = {name: count / value for name, value in seconds.items()}
    baseline = rates["flat pickle + offsets (baseline)"]
    return {
        "records": count,
        "reads": len(order),
        "seconds": seconds,
        "records_per_second": rates,
        "ratio_to_flat_pickle": {name: rate / baseline for name, rate in rates.items()},
        "bytes_on_disk": sizes,
    }


# --- report ------------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    writes, reads = result["token_writes"], result["document_reads"]
    lines = [
        f"### Token writes: {writes['tokens']:,} uint32 tokens in {writes['documents']:,} documents "
        f"(median of {result['repeats']})",
        "",
        "| writer | tokens/s | seconds | guideloom ÷ this |",
        "|---|---:|---:|---:|",
    ]
    guideloom_rate = writes["tokens_per_second"]["guideloom"]
    for name, rate in writes["tokens_per_second"].items():
        lines.append(f"| {name} | {rate:,.0f} | {writes['seconds'][name]:.3f} | {guideloom_rate / rate:.2f} |")
    lines += [
        "",
        f"Goal: guideloom ≥ {WRITE_GOAL} × baseline. Ratio to tofile: {writes['ratio_to_tofile']:.2f}; "
        f"to tofile+fsync: {writes['ratio_to_tofile_fsync']:.2f}.",
        "",
        f"### Random `read(i)`: {reads['records']:,} documents of 50–500 tokens, "
        f"{reads['reads']:,} reads in random order (median of {result['repeats']})",
        "",
        "| reader | records/s | seconds | ÷ flat pickle | MB on disk |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, rate in reads["records_per_second"].items():
        lines.append(
            f"| {name} | {rate:,.0f} | {reads['seconds'][name]:.3f} | {reads['ratio_to_flat_pickle'][name]:.2f} "
            f"| {reads['bytes_on_disk'][name] / 1e6:,.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--tokens", type=int, default=100_000_000, help="tokens to write in (a)")
    parser.add_argument("--records", type=int, default=200_000, help="documents to read in (b)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (the median is reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="where to put the temporary files")
    parser.add_argument("--output", type=Path, default=RESULTS / "storage.json")
    arguments = parser.parse_args(argv)
    if arguments.tokens < 1 or arguments.records < 1 or arguments.repeats < 1:
        parser.error("--tokens, --records and --repeats must be positive")

    with tempfile.TemporaryDirectory(prefix="guideloom-bench-", dir=arguments.dir) as directory:
        token_writes = bench_token_writes(
            Path(directory), arguments.tokens, arguments.repeats, np.random.default_rng(arguments.seed)
        )
        document_reads = bench_document_reads(Path(directory), arguments.records, arguments.repeats, arguments.seed)
    result = {
        "benchmark": "storage",
        "repeats": arguments.repeats,
        "seed": arguments.seed,
        "environment": machine(),  # with the load average at the end: other work on the machine skews the numbers
        "token_writes": token_writes,
        "document_reads": document_reads,
    }
    print(markdown(result))
    write_results("storage", result, to=arguments.output)
    print(f"\nwrote {arguments.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
