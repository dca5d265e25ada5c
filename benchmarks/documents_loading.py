"""``bench_documents --parts records,large,transport``: guideloom's loader against torch's over the same data.

Each measurement runs in a fresh interpreter (``python -m benchmarks.bench_documents --child``), the
libraries interleaved, ``--repeats`` times; the medians are reported, and as guideloom's ratio to each
row the median of the ratios of neighbouring runs (the load of a shared machine moves them alike).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import harness
from benchmarks.documents_data import (
    BATCH,
    FIELDS,
    TRANSPORT_RECORDS,
    FeatureFormat,
    PreferenceFormat,
    stack_features,
    write_large,
    write_records,
    write_transport,
)
from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader
from guideloom.collate import pad

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


TRANSPORT_SIZES = (256 * 1024, 2**20, 4 * 2**20)


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
    served, start, start_cpu = 0, time.perf_counter(), time.process_time()
    for batch in batches:
        served += len(batch["id"])
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    resident_mapped, peak = memory_mb("RssFile"), memory_mb("VmHWM")  # ru_maxrss would count the parent's peak
    if hasattr(loader, "close"):
        loader.close()
    # Without workers the epoch runs on this process's CPU time alone, which other work on the machine does not
    # take from it: records per CPU second compare the main-process rows on a shared machine.
    per_cpu_s = served / cpu if workers == 0 else float("nan")
    return {
        "records_per_s": served / elapsed,
        "records_per_cpu_s": per_cpu_s,
        "peak_rss_mb": peak,
        "mapped_file_mb": resident_mapped,
    }


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
            row["records_per_cpu_s_runs"] = [round(run["records_per_cpu_s"]) for run in runs] if workers == 0 else []
        rows.append(row)
    for row in rows:
        size = row["library"][row["library"].find("@") :] if "@" in row["library"] else ""
        ours = next(r for r in rows if r["library"] == f"guideloom{size}" and r["workers"] == row["workers"])
        if "error" not in row and "error" not in ours:  # repeat by repeat: neighbours share the machine's load
            pairs = zip(ours["records_per_s_runs"], row["records_per_s_runs"], strict=True)
            row["guideloom_ratio_runs"] = [round(mine / theirs, 2) for mine, theirs in pairs]
            row["guideloom_ratio"] = statistics.median(row["guideloom_ratio_runs"])
            if row["workers"] == 0:
                pairs = zip(ours["records_per_cpu_s_runs"], row["records_per_cpu_s_runs"], strict=True)
                row["guideloom_cpu_ratio_runs"] = [round(mine / theirs, 2) for mine, theirs in pairs]
                row["guideloom_cpu_ratio"] = statistics.median(row["guideloom_cpu_ratio_runs"])
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print("| part | reader | workers | records/s | guideloom x | guideloom x, CPU | peak RSS MB | mapped file MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        if "error" in row:
            print(f"| {row['part']} | {row['label']} | {row['workers']} | {row['error']} | | | | |")
            continue
        cpu = f"{row['guideloom_cpu_ratio']:.2f}" if "guideloom_cpu_ratio" in row else ""
        print(
            f"| {row['part']} | {row['label']} | {row['workers']} | {row['records_per_s']:,.0f} | "
            f"{row['guideloom_ratio']:.2f} | {cpu} | {row['peak_rss_mb']:.0f} | {row['mapped_file_mb']:.0f} |"
        )


def worker_counts(arguments: argparse.Namespace) -> list[int]:
    return [int(count) for count in arguments.workers.split(",")]


def records_part(arguments: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Preference records padded by ``pad``: guideloom against flat-memmap Datasets, records/s."""
    write_records(root, arguments.records)
    rows = run_part("records", root, arguments.repeats, worker_counts(arguments))
    print_rows(rows)
    return {"settings": {"records": arguments.records, "repeats": arguments.repeats}, "rows": rows}


def large_part(arguments: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Records of 100 KB: guideloom against plain files, records/s and the main process's memory."""
    write_large(root, arguments.large_records)
    rows = run_part("large", root, arguments.repeats, worker_counts(arguments))
    print_rows(rows)
    return {"settings": {"large_records": arguments.large_records, "repeats": arguments.repeats}, "rows": rows}


def transport_part(arguments: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Batches of 256 KiB to 4 MiB from 2 workers: guideloom's hand-over against torch's."""
    write_transport(root)
    rows = run_part("transport", root, arguments.repeats, [2])
    print_rows(rows)
    return {"settings": {"records": TRANSPORT_RECORDS, "repeats": arguments.repeats}, "rows": rows}
