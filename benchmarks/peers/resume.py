"""The resume measurement, the same for every adapter: fresh loader + saved state + first batch."""

from __future__ import annotations

import gc
import json
import pickle
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .interface import Adapter, NotResumable

# How a state is saved in a checkpoint and read back, per adapter's STATE_FORMAT.
CODECS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "pickle": (pickle.dumps, pickle.loads),
    "json": (lambda state: json.dumps(state).encode(), json.loads),
}


@dataclass
class ResumeResult:
    """Outcome of a resume measurement."""

    supported: bool
    reason: str | None = None  # why not supported, or a caveat when it is
    seconds: float | None = None  # fresh loader + restore state + first batch
    matches: bool | None = None  # first resumed batch == uninterrupted batch
    batches_before: int | None = None  # batches consumed before the state was taken
    state_bytes: int | None = None  # size of the saved state

    @classmethod
    def unsupported(cls, reason: str) -> ResumeResult:
        return cls(supported=False, reason=reason)


def as_tensor(batch: Any) -> torch.Tensor:
    """Token batch (tensor, numpy array, or dict with one token field) as int64 tensor."""
    if isinstance(batch, Mapping):
        batch = batch["input_ids"] if "input_ids" in batch else next(iter(batch.values()))
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch.astype(np.int64, copy=False))
    tensor: torch.Tensor = batch.to(torch.int64)
    return tensor


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def resume_first_batch(
    adapter: Adapter,
    out_dir: Path,
    fraction: float,
    *,
    sequence_length: int = 2048,
    batch_size: int = 8,
    seed: int = 0,
    num_workers: int = 0,
) -> ResumeResult:
    """Run the adapter's loader to ``fraction`` of the epoch and save its state; then time a fresh one resuming.

    The state goes through the adapter's checkpoint format (pickle or JSON). The interrupted
    loader (and any worker processes) is gone and garbage-collected before the clock starts;
    only building the fresh loader, loading the state and its first batch are timed. The result
    says whether that batch equals the one the uninterrupted run produced next.
    """
    options = {"sequence_length": sequence_length, "batch_size": batch_size, "seed": seed, "num_workers": num_workers}
    encode, decode = CODECS[adapter.STATE_FORMAT]
    gc.collect()  # a loader of an earlier step on the same files (some libraries claim them) is gone
    try:
        loader = adapter.resumable_token_loader(out_dir, **options)
    except NotResumable as reason:
        return ResumeResult.unsupported(str(reason))
    batches = len(loader)
    if batches < 2:
        return ResumeResult.unsupported("dataset too small for a resume test")
    taken = min(max(round(fraction * batches), 0), batches - 1)
    iterator = iter(loader)
    for _ in range(taken):
        next(iterator)
    saved = encode(loader.state_dict())
    expected = as_tensor(next(iterator)).clone()
    _close(loader)
    del loader, iterator
    gc.collect()
    state = decode(saved)
    started = time.perf_counter()
    fresh = adapter.resumable_token_loader(out_dir, **options)
    fresh.load_state_dict(state)
    got = as_tensor(next(iter(fresh)))
    seconds = time.perf_counter() - started
    _close(fresh)
    return ResumeResult(
        supported=True,
        reason=adapter.RESUME_NOTE,
        seconds=seconds,
        matches=bool(got.shape == expected.shape and torch.equal(got, expected)),
        batches_before=taken,
        state_bytes=len(saved),
    )
