"""Adapters that put other data-loading libraries behind one small interface.

Each adapter module in this package wraps one peer library the way its own
documentation recommends, so the benchmark runner can drive them all alike.
They run in the benchmark venv made by ``benchmarks/install_peers.sh``.

Every adapter module defines:

``NAME: str``
    Display name, e.g. ``"LitData"``.
``DIST: str | None``
    The pip distribution it wraps (``None`` for the hand-written baseline).
``version() -> str``
    Version of the wrapped library.
``NOTES: str``
    One line on how the adapter uses the library (format, sampler, resume).

``write_tokens(documents, out_dir, *, sequence_length=2048) -> None``
    ``documents`` is an iterable of 1-D ``uint32`` numpy arrays (token
    documents). Writes them to ``out_dir`` (created if missing) in the peer's
    own format. The stream read back is the concatenation of the documents.
    Peers whose format stores fixed blocks (Mosaic, HF, Grain) cut them here,
    so ``token_batches`` must then be called with the same ``sequence_length``
    (they raise ``ValueError`` otherwise); LitData sizes its chunks from it;
    the flat-file peers ignore it.
``token_batches(out_dir, *, sequence_length=2048, batch_size=8, seed=0, num_workers=0)``
    Iterator over one shuffled epoch of ``int64`` tensors of shape
    ``(batch_size, sequence_length)``. Each row is a window of the concatenated
    token stream; windows do not overlap; the last partial batch is dropped.
``write_documents(records, out_dir) -> None``
    ``records`` is an iterable of ``{"document_id": int, "tokens": list[int] |
    np.ndarray}`` (50-500 tokens each).
``document_batches(out_dir, *, batch_size=32, seed=0, num_workers=0, collate=None)``
    Iterator over one shuffled epoch of batches of whole records (the last
    batch may be short). ``collate`` receives a list of
    ``{"document_id": int, "tokens": torch.Tensor (int64, 1-D)}`` and its result
    is yielded; the default is :func:`peers._common.pad_collate`, which pads with
    ``torch.nn.utils.rnn.pad_sequence``. With ``num_workers > 0`` collate runs
    in worker processes, so it must be picklable (a module-level function).
``resume_first_batch(out_dir, fraction, *, sequence_length=2048, batch_size=8, seed=0, num_workers=0)``
    Returns a :class:`peers._common.ResumeResult`. On the token stream: runs the
    loader uninterrupted to ``fraction`` of the epoch and takes the peer's own
    saved state there; then times building a fresh loader, restoring that state
    and getting the first batch; and says whether that batch equals the one the
    uninterrupted run produced next. A peer without resumable state returns
    ``ResumeResult(supported=False, reason=...)``.

Use the registry rather than importing adapters directly, so that a peer that
is missing or broken is reported instead of stopping the whole run::

    from peers import PEERS, load_peer          # or benchmarks.peers
    for key in PEERS:
        try:
            mod = load_peer(key)
        except PeerUnavailable as exc:
            print(key, "unavailable:", exc)

Caveats for a runner:

* Run each peer in its own process (as ``smoke.py`` does). The libraries
  keep process-wide state: Mosaic claims shared memory per dataset directory
  until the dataset is garbage-collected, LitData's ``optimize`` switches the
  multiprocessing start method (the adapter restores it), Grain and LitData
  start worker processes of their own.
* LitData's ``optimize`` and Grain's ``mp_prefetch`` start workers with
  ``spawn``, so the calling script needs an ``if __name__ == "__main__":``
  guard; without it LitData writes an empty dataset (the adapter raises).
* ``num_workers`` is honoured by every peer except the naive baseline, which
  always reads in the calling process.

``install_status.json`` (written by the install script) records for each pip
distribution ``"ok"`` or the reason it is unusable; :func:`install_status`
reads it.
"""

from __future__ import annotations

import importlib
import json
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ._common import ResumeResult, pad_collate

__all__ = [
    "PEERS",
    "PeerInfo",
    "PeerUnavailable",
    "ResumeResult",
    "install_status",
    "load_peer",
    "pad_collate",
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


def load_peer(key: str, *, use_recorded: bool = True) -> ModuleType:
    """Import and return the adapter module for ``key``.

    Raises :class:`PeerUnavailable` with the reason (install failure recorded
    by the install script, or the import error) if it cannot be used;
    ``use_recorded=False`` leaves out the install script's record.
    """
    info = PEERS[key]
    try:
        return importlib.import_module(f".{info.module}", __name__)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}".strip()
        recorded = install_status().get(info.dist or "", "") if use_recorded else ""
        if recorded and recorded != "ok":
            reason = f"{recorded} ({reason})"
        last = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" [at {Path(last[0].filename).name}:{last[0].lineno}]" if last else ""
        raise PeerUnavailable(reason + where) from exc


def install_status() -> dict[str, str]:
    """The install script's record: distribution -> "ok" or the failure reason."""
    try:
        return dict(json.loads(STATUS_FILE.read_text()))
    except (OSError, ValueError):
        return {}
