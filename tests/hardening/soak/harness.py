"""Soak: a loader with workers runs epoch after epoch; memory and descriptors must stay flat, batches exact.

Shared by ``test_soak.py`` (a few thousand batches) and ``tests/stress/run_soak.py`` (tens of
thousands, with a CSV, a chart and a summary). Every batch is compared with a loader without
workers running in lockstep (``num_workers=0``, the same configuration); for token windows the
first epoch is also checked against a recomputation from the token stream itself (every window
``stream[k*S:(k+1)*S]`` exactly once). Every ``resume_every`` batches the loader is closed and a
new one resumes from its state dict, so leaks across loader lifetimes show too.

Memory is the anonymous resident memory (``RssAnon``) of this process plus that of its children
(the workers). Mapped file pages are the page cache's and not counted. Descriptors are watched in
this process across the whole run, and in each worker over its own life: a worker starts with the
descriptors open when it was forked, which include pipes of the loader closed just before (torch's
queues close them from a background thread), so totals across loaders depend on timing, not on leaks.
"""

from __future__ import annotations

import gc
import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader, TokenStorage
from tests.hardening.processes import descendants, open_descriptors, pss_anon_kib, rss_anon_kib

SEQUENCE = 65


def make_storage(path: Path, kind: str, size: int) -> Any:
    rng = np.random.default_rng(1)
    if kind == "tokens":
        storage: Any = TokenStorage(path, "uint32")
        with storage.sync_writer() as writer:
            for document in range(size):
                writer.append(document % 5, rng.integers(0, 2**32, int(rng.integers(1, 400)), dtype=np.uint32))
        return storage
    storage = DocumentStorage(path, DocumentJsonFormat())
    with storage.sync_writer() as writer:
        for index in range(size):
            writer.append(index % 7, {"id": index, "text": "w" * int(rng.integers(0, 300)), "score": index / 7})
    return storage


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Tensors and Python objects, so both travel from the workers."""
    return {
        "ids": torch.tensor([sample["id"] for sample in samples]),
        "lengths": torch.tensor([len(sample["text"]) for sample in samples], dtype=torch.int32),
        "texts": [sample["text"] for sample in samples],
    }


def comparable(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.numpy().tobytes()
    return (batch["ids"].tolist(), batch["lengths"].tolist(), batch["texts"])


@dataclass
class SoakResult:
    kind: str
    batches: int = 0
    epochs: int = 0
    resumes: int = 0
    seconds: float = 0.0
    samples: list[dict[str, float]] = field(default_factory=list)
    mismatches: int = 0
    # processes below this one before the run (an earlier test's, still exiting): not the loaders'
    earlier_processes: set[int] = field(default_factory=descendants)
    worker_descriptors: dict[int, list[int]] = field(default_factory=dict)  # each worker's, sample after sample

    def column(self, name: str) -> list[float]:
        return [sample[name] for sample in self.samples]

    def growth(self, name: str) -> float:
        """Median of the last quarter minus the median of the first quarter after warm-up (first 20%)."""
        values = self.column(name)[len(self.samples) // 5 :]
        quarter = max(1, len(values) // 4)
        return statistics.median(values[-quarter:]) - statistics.median(values[:quarter])

    def worker_descriptor_growth(self) -> int:
        """The most descriptors any one worker gained over its life."""
        return max((counts[-1] - counts[0] for counts in self.worker_descriptors.values()), default=0)

    def spread_after_warmup(self, name: str) -> float:
        values = self.column(name)[len(self.samples) // 5 :]
        return max(values) - min(values)

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "batches": self.batches,
            "epochs": self.epochs,
            "resumes": self.resumes,
            "seconds": round(self.seconds, 1),
            "mismatches": self.mismatches,
            "rss_anon_mib_start": round(self.samples[0]["rss_anon_kib"] / 1024, 1),
            "rss_anon_mib_end": round(self.samples[-1]["rss_anon_kib"] / 1024, 1),
            "rss_anon_growth_mib": round(self.growth("rss_anon_kib") / 1024, 2),
            "rss_anon_spread_mib": round(self.spread_after_warmup("rss_anon_kib") / 1024, 2),
            "pss_anon_mib_end": round(self.samples[-1]["pss_anon_kib"] / 1024, 1),
            "pss_anon_growth_mib": round(self.growth("pss_anon_kib") / 1024, 2),
            "descriptors_start": self.samples[0]["descriptors"],
            "descriptors_end": self.samples[-1]["descriptors"],
            "descriptors_growth": self.growth("descriptors_main"),
            "worker_descriptors_growth": self.worker_descriptor_growth(),
        }


def _digest(rows: np.ndarray) -> tuple[int, int]:
    """(row count, sum of the rows' 64-bit hashes mod 2**64): equal for equal multisets of rows."""
    total = 0
    for row in rows:
        total += int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little")
    return len(rows), total % 2**64


def _measure(result: SoakResult, started: float) -> None:
    workers = descendants() - result.earlier_processes
    per_worker = {pid: open_descriptors(pid) for pid in workers}
    descriptors = open_descriptors()
    for pid, count in per_worker.items():
        result.worker_descriptors.setdefault(pid, []).append(count)
    result.samples.append(
        {
            "batch": result.batches,
            "seconds": round(time.perf_counter() - started, 3),
            "rss_anon_kib": rss_anon_kib() + sum(rss_anon_kib(pid) for pid in workers),
            "rss_anon_main_kib": rss_anon_kib(),
            "pss_anon_kib": pss_anon_kib() + sum(pss_anon_kib(pid) for pid in workers),
            "descriptors": descriptors + sum(per_worker.values()),
            "descriptors_main": descriptors,
            "processes": len(workers),
        }
    )


def run(
    storage: Any,
    kind: str,
    batches: int,
    *,
    workers: int = 2,
    sample_every: int = 50,
    resume_every: int | None = None,
    local_batch_size: int = 8,
) -> SoakResult:
    options: dict[str, Any] = {"local_batch_size": local_batch_size, "shuffle": True, "seed": 7, "device": "cpu"}
    if kind == "tokens":
        options["sequence_length"] = SEQUENCE
    else:
        options["collate"] = collate

    def open_loader(worker_count: int, state: dict[str, Any] | None = None) -> StatefulDataLoader:
        loader = StatefulDataLoader.from_storage(storage, num_workers=worker_count, **options)
        if state is not None:
            loader.load_state_dict(state)
        return loader

    windows = None
    if kind == "tokens":  # every window once per epoch, as a multiset digest (O(1) memory while soaking)
        with storage.sync_reader() as reader:
            count = reader.window_count(SEQUENCE)
            stream = reader.read_tokens(0, count * SEQUENCE).astype(np.int64)
        windows = _digest(stream.reshape(count, SEQUENCE))
    first_epoch = (0, 0)
    result = SoakResult(kind)
    reference, loader = open_loader(0), open_loader(workers)
    started = time.perf_counter()
    _measure(result, started)
    try:
        while result.batches < batches:
            expected_iterator = iter(reference)
            for batch in loader:
                expected = next(expected_iterator)
                if comparable(batch) != comparable(expected):
                    result.mismatches += 1
                if windows is not None and result.epochs == 0:
                    digest = _digest(batch.numpy())
                    first_epoch = (first_epoch[0] + digest[0], (first_epoch[1] + digest[1]) % 2**64)
                result.batches += 1
                if result.batches % sample_every == 0:
                    gc.collect()
                    _measure(result, started)
                if resume_every and result.batches % resume_every == 0:
                    state = json.loads(json.dumps(loader.state_dict()))
                    loader.close()
                    loader = open_loader(workers, state)
                    result.resumes += 1
                    break
                if result.batches >= batches:
                    break
            else:
                result.epochs += 1
                if windows is not None and result.epochs == 1 and first_epoch != windows:
                    result.mismatches += 1  # the first epoch is not every window exactly once
            if resume_every and result.batches % resume_every == 0 and result.batches < batches:
                # the reference loader was left mid-epoch: a fresh iter() continues it, as the resumed one does
                continue
    finally:
        loader.close()
        reference.close()
    result.seconds = time.perf_counter() - started
    return result
