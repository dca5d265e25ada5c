"""The interface every adapter module implements (the peers' and ``ours.py``), so the runner drives them alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

Record = dict[str, Any]
Collate = Callable[[list[Record]], Any]


class NotResumable(Exception):
    """Raised by :meth:`Adapter.resumable_token_loader` of a peer that keeps no iteration state; says why."""


class ResumableLoader(Protocol):
    """A token loader with the peer's own saved state: ``len`` batches an epoch, iterate, save, restore."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...

    def state_dict(self) -> Any:
        """The state after the batches taken so far from the iterator."""

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state`` (called before iterating)."""


@runtime_checkable
class Adapter(Protocol):
    """One adapter module: a library wrapped the way its own documentation recommends.

    Module attributes: ``NAME`` (display name), ``DIST`` (the pip distribution; ``None`` for the
    hand-written baseline), ``NOTES`` (one line on how the library is used), ``RESUME_NOTE`` (a
    caveat on its resume measurement, or ``None``), ``STATE_FORMAT`` (how its state is saved in a
    checkpoint: ``"pickle"`` or ``"json"``).
    """

    NAME: str
    DIST: str | None
    NOTES: str
    RESUME_NOTE: str | None
    STATE_FORMAT: str

    def version(self) -> str:
        """The version of the wrapped library."""

    def write_tokens(self, documents: Iterable[np.ndarray], out_dir: Path, *, sequence_length: int = 2048) -> None:
        """Write 1-D ``uint32`` token documents to ``out_dir`` (created if missing) in the library's format.

        The stream read back is the documents' concatenation. Formats that store fixed blocks cut
        them here, so reading must use the same ``sequence_length`` (``ValueError`` otherwise).
        """

    def token_batches(
        self, out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
    ) -> Iterator[torch.Tensor]:
        """One shuffled epoch of ``int64`` ``(batch_size, sequence_length)`` batches of non-overlapping windows.

        The last partial batch is dropped; ``num_workers`` is honoured by every peer but the naive baseline.
        """

    def write_documents(self, records: Iterable[Record], out_dir: Path) -> None:
        """Write records ``{"document_id": int, "tokens": list[int] | np.ndarray}`` in the library's format."""

    def document_batches(
        self,
        out_dir: Path,
        *,
        batch_size: int = 32,
        seed: int = 0,
        num_workers: int = 0,
        collate: Collate | None = None,
    ) -> Iterator[Any]:
        """One shuffled epoch of whole records, batched by ``collate`` (the last batch may be short).

        ``collate`` gets a list of ``{"document_id": int, "tokens": int64 1-D tensor}``; the default
        pads with ``pad_sequence`` (``pad_collate``). With workers it must pickle (module level).
        """

    def resumable_token_loader(
        self, out_dir: Path, *, sequence_length: int = 2048, batch_size: int = 8, seed: int = 0, num_workers: int = 0
    ) -> ResumableLoader:
        """The loader of :meth:`token_batches` with its saved state; :class:`NotResumable` if it keeps none."""
