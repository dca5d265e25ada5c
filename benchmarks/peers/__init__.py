"""Adapters that put other data-loading libraries behind one interface (:class:`interface.Adapter`).

Each adapter module wraps one peer library the way its own documentation recommends, so the
benchmark runner drives them all alike; they run in the benchmark venv made by
``benchmarks/install_peers.sh``. :func:`resume.resume_first_batch` measures any adapter's resume.
Load adapters through :func:`load_peer`, so that a peer that is missing or broken is reported
(:class:`PeerUnavailable`) instead of stopping the whole run.

Caveats for a runner: run each peer in its own process (as ``smoke.py`` does), since the libraries
keep process-wide state (Mosaic claims shared memory per dataset directory until the dataset is
garbage-collected; LitData's ``optimize`` switches the multiprocessing start method, which the
adapter restores); LitData's ``optimize`` and Grain's ``mp_prefetch`` start workers with ``spawn``,
so the calling script needs an ``if __name__ == "__main__":`` guard. ``install_status.json``
(written by the install script) records for each pip distribution ``"ok"`` or why it is unusable.
"""

from __future__ import annotations

import importlib
import json
import traceback
from dataclasses import dataclass
from pathlib import Path

from ._common import pad_collate
from .interface import Adapter, NotResumable, ResumableLoader
from .resume import ResumeResult, resume_first_batch

__all__ = [
    "PEERS",
    "Adapter",
    "NotResumable",
    "PeerInfo",
    "PeerUnavailable",
    "ResumableLoader",
    "ResumeResult",
    "install_status",
    "load_peer",
    "pad_collate",
    "resume_first_batch",
]

HERE = Path(__file__).resolve().parent
STATUS_FILE = HERE / "install_status.json"


class PeerUnavailable(RuntimeError):
    """The peer's adapter could not be imported (library missing or broken)."""


@dataclass(frozen=True)
class PeerInfo:
    key: str
    module: str  # adapter module inside this package
    dist: str | None  # pip distribution, None for the baseline


PEERS: dict[str, PeerInfo] = {
    p.key: p
    for p in (
        PeerInfo("naive", "naive_memmap", None),
        PeerInfo("torchdata", "torchdata_peer", "torchdata"),
        PeerInfo("litdata", "litdata_peer", "litdata"),
        PeerInfo("mosaic", "mosaic_peer", "mosaicml-streaming"),
        PeerInfo("hf", "hf_peer", "datasets"),
        PeerInfo("grain", "grain_peer", "grain"),
    )
}


def load_peer(key: str, *, use_recorded: bool = True) -> Adapter:
    """Import and return the adapter module for ``key``.

    Raises :class:`PeerUnavailable` with the reason (install failure recorded
    by the install script, or the import error) if it cannot be used;
    ``use_recorded=False`` leaves out the install script's record.
    """
    info = PEERS[key]
    try:
        module = importlib.import_module(f".{info.module}", __name__)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}".strip()
        recorded = install_status().get(info.dist or "", "") if use_recorded else ""
        if recorded and recorded != "ok":
            reason = f"{recorded} ({reason})"
        last = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" [at {Path(last[0].filename).name}:{last[0].lineno}]" if last else ""
        raise PeerUnavailable(reason + where) from exc
    if not isinstance(module, Adapter):
        raise PeerUnavailable(f"{info.module} does not implement the adapter interface (peers.interface.Adapter)")
    return module


def install_status() -> dict[str, str]:
    """The install script's record: distribution -> "ok" or the failure reason."""
    try:
        return dict(json.loads(STATUS_FILE.read_text()))
    except (OSError, ValueError):
        return {}
