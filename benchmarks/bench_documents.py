"""Document storages read by the loader, side by side with torch Datasets over flat files, as ratios in one run.

Named parts (``--parts``, all by default):

* ``records``: preference (DPO-style) records, prompt, chosen and rejected int32 token lists of 20-600
  tokens each and an id, in a struct format whose fields decode as NumPy views (``unpack_many``);
  one shuffled epoch of batches of 32 padded by ``guideloom.collate.pad``, records/s, against a
  flat-memmap torch ``Dataset`` (one token file and an offsets array, records as NumPy views) read by
  torch's ``DataLoader``, fetched one by one and, tuned, a batch at a time (``__getitems__``), and by
  torchdata's ``StatefulDataLoader``, all with the same collate; main process and 2 workers. One more row: the
  flat-memmap Dataset whose collate hands NumPy arrays over instead of tensors, which shows what
  torch's tensor transport (shared memory) is worth with workers.
* ``large``: records of 100 KB (an id and 25,600 float32 features), batches of 32 (3.2 MB),
  guideloom against plain files (one file a record) read by a torch ``Dataset`` with torch's
  ``DataLoader`` and its default collate (which stacks a batch straight into shared memory in a
  worker); main process and 2 workers; records/s, and the main process's peak resident memory
  (``VmHWM``) and its resident mapped file pages at the end of the epoch.
* ``transport``: the hand-over alone, with 2 workers: batches of one float32 tensor of 256 KiB, 1 MiB
  and 4 MiB (and the ids), built by guideloom's workers from a storage of small records, against a
  torch ``Dataset`` whose items are the same batches, read by torch's ``DataLoader`` (which sends
  every tensor through shared memory). guideloom pipes arrays under 1 MiB and sends larger ones
  through shared memory too.

Every measurement runs in a fresh interpreter (``benchmarks/harness.py``), the libraries interleaved,
``--repeats`` times; the medians are reported, and as guideloom's ratio to each row the median of the
ratios of neighbouring runs (the load of a shared machine moves them alike). Writes ``results/documents.json``.

    python -m benchmarks.bench_documents                          # 20,000 records, 1,000 large (minutes)
    python -m benchmarks.bench_documents --records 100_000 --large-records 5_000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import harness
from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader
from guideloom.collate import pad
from guideloom.types import DocumentStorageFormat

BATCH = 32
RECORDS_PER_SHARD = 10_000
FIELDS = ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")
FEATURES = 25_600  # float32: 100 KB a record
LARGE_PER_SHARD = 1_000


# --- the data ---------------------------------------------------------------------------------------------------


class PreferenceFormat(DocumentStorageFormat[dict[str, Any], dict[str, Any]]):
    """An id and three lengths (uint32), then the three fields' int32 tokens; decoded as NumPy views."""

    name = "bench-preference-v1"
    head = struct.Struct("<4I")

    def pack(self, data: dict[str, Any]) -> bytes:
        fields = [np.asarray(data[name], "<i4") for name in FIELDS]
        return self.head.pack(data["id"], *map(len, fields)) + b"".join(field.tobytes() for field in fields)

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        return self.unpack_many([encoded_data], [shard])[0]

    def unpack_many(self, encoded_data: list[memoryview], shards: list[int]) -> list[dict[str, Any]]:
        records = []
        for data in encoded_data:
            record_id, first, second, _ = self.head.unpack_from(data)
            tokens = np.frombuffer(data, "<i4", offset=self.head.size)
            records.append(
                {
                    "id": record_id,
                    FIELDS[0]: tokens[:first],
                    FIELDS[1]: tokens[first : first + second],
                    FIELDS[2]: tokens[first + second :],
                }
            )
        return records


class FeatureFormat(DocumentStorageFormat[tuple[int, np.ndarray], tuple[int, np.ndarray]]):
    """An id (uint32), then float32 features; decoded as a NumPy view of the mapped shard."""

    name = "bench-features-v1"

    def pack(self, data: tuple[int, np.ndarray]) -> bytes:
        return struct.pack("<I", data[0]) + np.asarray(data[1], "<f4").tobytes()

    def unpack(self, encoded_data: memoryview, shard: int) -> tuple[int, np.ndarray]:
        return struct.unpack_from("<I", encoded_data)[0], np.frombuffer(encoded_data, "<f4", offset=4)


def stack_features(records: list[tuple[int, np.ndarray]]) -> dict[str, torch.Tensor]:
    """The large records' collate: ids and a (32, 25,600) float32 tensor."""
    return {
        "id": torch.tensor([record_id for record_id, _ in records]),
        "features": torch.from_numpy(np.stack([features for _, features in records])),
    }


def write_records(root: Path, count: int) -> None:
    """``count`` preference records as a guideloom storage and as the flat files of the baseline."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 601, (count, 3))
    tokens = rng.integers(0, 32_000, int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths.reshape(-1))
    starts = ends - lengths.reshape(-1)
    storage = DocumentStorage(root / "guideloom-records", PreferenceFormat())
    with storage.sync_writer() as writer:
        for index in range(count):
            fields = [tokens[starts[3 * index + k] : ends[3 * index + k]] for k in range(3)]
            writer.append(index // RECORDS_PER_SHARD, {"id": index, **dict(zip(FIELDS, fields, strict=True))})
    flat = root / "flat-records"
    flat.mkdir()
    tokens.tofile(flat / "tokens.bin")
    np.save(flat / "bounds.npy", np.stack([starts, ends], 1).reshape(count, 3, 2))


def write_large(root: Path, count: int) -> None:
    """``count`` records of 100 KB as a guideloom storage and as one plain file per record."""
    rng = np.random.default_rng(1)
    storage = DocumentStorage(root / "guideloom-large", FeatureFormat())
    files = root / "files-large"
    files.mkdir()
    with storage.sync_writer() as writer:
        for index in range(count):
            features = rng.standard_normal(FEATURES, dtype=np.float32)
            writer.append(index // LARGE_PER_SHARD, (index, features))
            features.tofile(files / f"{index:07d}.bin")


# --- the baselines ----------------------------------------------------------------------------------------------


class FlatRecords(torch.utils.data.Dataset[dict[str, Any]]):
    """The flat-memmap Dataset: one mapped token file, records as NumPy views, fetched one by one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bounds = np.load(path / "bounds.npy")
        self._tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.bounds)

    def _mapped(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.memmap(self.path / "tokens.bin", np.int32, mode="r").view(np.ndarray)
        return self._tokens

    def __getitem__(self, index: int) -> dict[str, Any]:
        tokens, spans = self._mapped(), self.bounds[index].tolist()
        return {"id": index, **{name: tokens[a:b] for name, (a, b) in zip(FIELDS, spans, strict=True)}}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}


class BatchedFlatRecords(FlatRecords):
    """The tuned flat-memmap Dataset: the same, a batch at a time (``__getitems__``, which torch's loaders call)."""

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        tokens, bounds = self._mapped(), self.bounds[indices].tolist()
        return [
            {"id": index, **{name: tokens[a:b] for name, (a, b) in zip(FIELDS, spans, strict=True)}}
            for index, spans in zip(indices, bounds, strict=True)
        ]


class PadToNumpy:
    """``pad``, with the batch's tensors handed over as NumPy arrays (torch's pipe instead of its shared memory)."""

    def __init__(self) -> None:
        self.pad = pad()

    def __call__(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {name: value.numpy() for name, value in self.pad(records).items()}


class FeatureFiles(torch.utils.data.Dataset[dict[str, Any]]):
    """One plain file per 100 KB record, read whole with each access."""

    def __init__(self, path: Path) -> None:
        self.files = sorted(path.iterdir())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"id": index, "features": torch.from_numpy(np.fromfile(self.files[index], np.float32))}


# --- one measurement, in a fresh interpreter -------------------------------------------------------------------


def memory_mb(field: str) -> float:
    """A line of ``/proc/self/status`` in MB: ``RssFile`` (resident pages of mapped files), ``VmHWM`` (peak RSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class FilledBatch:
    """A batch of ``size`` bytes: the ids, and a float32 tensor filled with the first one."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, records: list[int]) -> dict[str, torch.Tensor]:
        return {"id": torch.tensor(records), "payload": torch.full((self.size // 4,), float(records[0]))}


class ReadyBatches(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """The same batches as items of a torch Dataset (read with ``batch_size=None``)."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.fill = count, FilledBatch(size)

    def __len__(self) -> int:
        return self.count // BATCH

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.fill(list(range(index * BATCH, (index + 1) * BATCH)))


TRANSPORT_RECORDS = 20_000
TRANSPORT_SIZES = (256 * 1024, 2**20, 4 * 2**20)


def write_transport(root: Path) -> None:
    with DocumentStorage(root / "transport", DocumentJsonFormat()).sync_writer() as writer:
        for index in range(TRANSPORT_RECORDS):
            writer.append(index // RECORDS_PER_SHARD, index)


def loader_of(part: str, library: str, root: Path, workers: int) -> Any:
    generator = torch.Generator().manual_seed(0)
    if part == "transport":
        name, size = library.split("@")
        if name == "guideloom":
            storage = DocumentStorage(root / "transport", DocumentJsonFormat())
            return StatefulDataLoader.from_storage(
                storage, FilledBatch(int(size)), device="cpu", local_batch_size=BATCH, num_workers=workers
            )
        dataset = ReadyBatches(TRANSPORT_RECORDS, int(size))
        return torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=True, num_workers=workers)
    torch_options: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "generator": generator}
    torch_options["num_workers"] = workers
    if part == "records":
        if library == "guideloom":
            storage = DocumentStorage(root / "guideloom-records", PreferenceFormat())
            return StatefulDataLoader.from_storage(
                storage, pad(), device="cpu", local_batch_size=BATCH, shuffle=True, num_workers=workers
            )
        flat = root / "flat-records"
        dataset = FlatRecords(flat) if library == "torch-items" else BatchedFlatRecords(flat)
        collate = PadToNumpy() if library == "torch-numpy" else pad()
        if library == "torchdata":
            from torchdata.stateful_dataloader import StatefulDataLoader as TorchdataLoader

            return TorchdataLoader(dataset, collate_fn=collate, **torch_options)
        return torch.utils.data.DataLoader(dataset, collate_fn=collate, **torch_options)
    if library == "guideloom":
        storage = DocumentStorage(root / "guideloom-large", FeatureFormat())
        return StatefulDataLoader.from_storage(
            storage, stack_features, device="cpu", local_batch_size=BATCH, shuffle=True, num_workers=workers
        )
    return torch.utils.data.DataLoader(FeatureFiles(root / "files-large"), **torch_options)


def measure(part: str, library: str, root: Path, workers: int) -> dict[str, Any]:
    """One shuffled epoch after a first batch; records/s, and the main process's memory."""
    loader = loader_of(part, library, root, workers)
    batches = iter(loader)
    next(batches)
    served, start = 0, time.perf_counter()
    for batch in batches:
        served += len(batch["id"])
    elapsed = time.perf_counter() - start
    resident_mapped, peak = memory_mb("RssFile"), memory_mb("VmHWM")  # ru_maxrss would count the parent's peak
    if hasattr(loader, "close"):
        loader.close()
    return {"records_per_s": served / elapsed, "peak_rss_mb": peak, "mapped_file_mb": resident_mapped}


# --- the run ----------------------------------------------------------------------------------------------------

ROWS = {
    "records": [
        (library, workers)
        for workers in (0, 2)
        for library in ("guideloom", "torch", "torch-items", "torchdata", *(("torch-numpy",) if workers else ()))
    ],
    "large": [(library, workers) for workers in (0, 2) for library in ("guideloom", "files")],
    "transport": [(f"{library}@{size}", 2) for size in TRANSPORT_SIZES for library in ("guideloom", "torch")],
}
LABELS = {
    "guideloom": "guideloom",
    "torch": "flat-memmap Dataset (__getitems__), torch DataLoader",
    "torch-items": "flat-memmap Dataset (__getitem__ per record), torch DataLoader",
    "torchdata": "flat-memmap Dataset (__getitems__), torchdata StatefulDataLoader",
    "torch-numpy": "flat-memmap Dataset (__getitems__), torch DataLoader, collate returns NumPy",
    "files": "plain files, torch Dataset + DataLoader",
}


def label(library: str) -> str:
    if "@" not in library:
        return LABELS[library]
    name, size = library.split("@")
    reader = "guideloom" if name == "guideloom" else "torch Dataset of ready batches, torch DataLoader"
    return f"{reader}, batches of {int(size) // 1024:,} KiB"


def run_part(part: str, root: Path, repeats: int, worker_counts: list[int]) -> list[dict[str, Any]]:
    chosen = [row for row in ROWS[part] if row[1] in worker_counts]
    results: dict[tuple[str, int], list[dict[str, Any]]] = {row: [] for row in chosen}
    for _ in range(repeats):
        for library, workers in chosen:  # interleaved: load on the machine moves every row alike
            arguments = json.dumps([part, library, str(root), workers])
            child = harness.module_command("benchmarks.bench_documents", "--child", arguments)
            results[(library, workers)].append(harness.run_json_child(child, timeout=1800))
    rows = []
    for (library, workers), runs in results.items():
        failed = [run["error"] for run in runs if "error" in run]
        row: dict[str, Any] = {"part": part, "library": library, "label": label(library), "workers": workers}
        if failed:
            row["error"] = failed[0]
        else:
            for key in runs[0]:
                row[key] = statistics.median(run[key] for run in runs)
            row["records_per_s_runs"] = [round(run["records_per_s"]) for run in runs]
        rows.append(row)
    for row in rows:
        size = row["library"][row["library"].find("@") :] if "@" in row["library"] else ""
        ours = next(r for r in rows if r["library"] == f"guideloom{size}" and r["workers"] == row["workers"])
        if "error" not in row and "error" not in ours:  # repeat by repeat: neighbours share the machine's load
            pairs = zip(ours["records_per_s_runs"], row["records_per_s_runs"], strict=True)
            row["guideloom_ratio_runs"] = [round(mine / theirs, 2) for mine, theirs in pairs]
            row["guideloom_ratio"] = statistics.median(row["guideloom_ratio_runs"])
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print("| part | reader | workers | records/s | guideloom x | peak RSS MB | mapped file pages MB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        if "error" in row:
            print(f"| {row['part']} | {row['label']} | {row['workers']} | {row['error']} | | | |")
            continue
        print(
            f"| {row['part']} | {row['label']} | {row['workers']} | {row['records_per_s']:,.0f} | "
            f"{row['guideloom_ratio']:.2f} | {row['peak_rss_mb']:.0f} | {row['mapped_file_mb']:.0f} |"
        )


def main() -> None:
    parser = harness.argument_parser(__doc__)
    parser.add_argument("--parts", default="records,large,transport", help="comma-separated: records, large, transport")
    parser.add_argument("--records", type=harness.count, default=20_000)
    parser.add_argument("--large-records", type=harness.count, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts to measure (0, 2)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        part, library, root, workers = json.loads(arguments.child)
        print(json.dumps(measure(part, library, Path(root), workers)))
        return
    parts = arguments.parts.split(",")
    worker_counts = [int(count) for count in arguments.workers.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-documents-") as directory:
        root = Path(directory)
        if "records" in parts:
            write_records(root, arguments.records)
            rows += run_part("records", root, arguments.repeats, worker_counts)
        if "transport" in parts:
            write_transport(root)
            rows += run_part("transport", root, arguments.repeats, [2])
        if "large" in parts:
            write_large(root, arguments.large_records)
            rows += run_part("large", root, arguments.repeats, worker_counts)
    print_rows(rows)
    settings = {"records": arguments.records, "large_records": arguments.large_records, "repeats": arguments.repeats}
    earlier = harness.read_results("documents") or {"rows": []}
    kept = [row for row in earlier["rows"] if row["part"] not in parts]  # the parts not measured this time stay
    for row in kept:
        row.setdefault("measured", earlier.get("settings"))
    harness.write_results("documents", {"machine": harness.machine(), "settings": settings, "rows": kept + rows})


if __name__ == "__main__":
    main()
