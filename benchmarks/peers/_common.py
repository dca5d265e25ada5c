"""Pieces shared by the peer adapters: collate helpers, token blocks, flat files."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from .interface import Collate, Record

# --------------------------------------------------------------------------- records


def to_record(item: Mapping[str, Any]) -> Record:
    """Normalise one stored document to ``{"document_id": int, "tokens": int64 tensor}``."""
    tokens = item["tokens"]
    if isinstance(tokens, torch.Tensor):
        t = tokens.to(torch.int64)
    else:
        t = torch.from_numpy(np.asarray(tokens).astype(np.int64, copy=False))
    return {"document_id": int(item["document_id"]), "tokens": t.reshape(-1)}


def pad_collate(records: list[Record]) -> dict[str, torch.Tensor]:
    """Default collate: pad token lists with zeros to the longest in the batch."""
    tokens = [r["tokens"] for r in records]
    return {
        "document_id": torch.tensor([r["document_id"] for r in records], dtype=torch.int64),
        "tokens": pad_sequence(tokens, batch_first=True, padding_value=0),
        "lengths": torch.tensor([len(t) for t in tokens], dtype=torch.int64),
    }


class NormalizingCollate:
    """``collate_fn`` for torch-style loaders: normalise each item, then call ``collate``.

    A class rather than a closure so it pickles into worker processes.
    """

    def __init__(self, collate: Collate | None = None) -> None:
        self.collate = collate or pad_collate

    def __call__(self, items: list[Mapping[str, Any]]) -> Any:
        return self.collate([to_record(i) for i in items])


def record_arrays(records: Iterable[Mapping[str, Any]]) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(document_id, uint32 tokens)`` from input records."""
    for r in records:
        yield int(r["document_id"]), np.asarray(r["tokens"], dtype=np.uint32)


def token_blocks(documents: Iterable[np.ndarray], block: int) -> Iterator[np.ndarray]:
    """Cut the concatenation of ``documents`` into consecutive ``block``-token arrays.

    The trailing partial block is dropped (it can never fill a full window).
    """
    pending: list[np.ndarray] = []
    have = 0
    for doc in documents:
        doc = np.asarray(doc, dtype=np.uint32)
        pending.append(doc)
        have += len(doc)
        if have < block:
            continue
        flat = np.concatenate(pending)
        n = len(flat) // block
        yield from flat[: n * block].reshape(n, block)
        rest = flat[n * block :]
        pending, have = [rest], len(rest)


# --------------------------------------------------------------------------- flat files
# The layout shared by the hand-written baseline, torchdata and (without
# ArrayRecord) Grain: one raw uint32 token file, nanoGPT style, plus small
# numpy index files for whole documents.

TOKENS_BIN = "tokens.bin"
DOC_TOKENS_BIN = "doc_tokens.bin"
DOC_OFFSETS = "doc_offsets.npy"
DOC_IDS = "doc_ids.npy"


def write_flat_tokens(documents: Iterable[np.ndarray], out_dir: Path) -> int:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(out_dir / TOKENS_BIN, "wb") as f:
        for doc in documents:
            arr = np.asarray(doc, dtype=np.uint32)
            arr.tofile(f)
            n += len(arr)
    (out_dir / "meta.json").write_text(json.dumps({"n_tokens": n, "dtype": "uint32"}))
    return n


def open_flat_tokens(out_dir: Path) -> np.memmap:
    return np.memmap(Path(out_dir) / TOKENS_BIN, dtype=np.uint32, mode="r")


def write_flat_documents(records: Iterable[Mapping[str, Any]], out_dir: Path) -> int:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    offsets = [0]
    ids: list[int] = []
    with open(out_dir / DOC_TOKENS_BIN, "wb") as f:
        for doc_id, toks in record_arrays(records):
            toks.tofile(f)
            offsets.append(offsets[-1] + len(toks))
            ids.append(doc_id)
    np.save(out_dir / DOC_OFFSETS, np.asarray(offsets, dtype=np.int64))
    np.save(out_dir / DOC_IDS, np.asarray(ids, dtype=np.int64))
    return len(ids)


class FlatDocuments:
    """Random access to whole documents in the flat layout (opens lazily, fork-safe)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.offsets = np.load(self.out_dir / DOC_OFFSETS)
        self.ids = np.load(self.out_dir / DOC_IDS)
        self._tokens: np.memmap | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._tokens is None:
            self._tokens = np.memmap(self.out_dir / DOC_TOKENS_BIN, dtype=np.uint32, mode="r")
        a, b = self.offsets[i], self.offsets[i + 1]
        return {"document_id": int(self.ids[i]), "tokens": np.array(self._tokens[a:b])}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}


class FlatWindows:
    """Random access to non-overlapping ``sequence_length`` windows of the token file."""

    def __init__(self, out_dir: Path, sequence_length: int) -> None:
        self.out_dir = Path(out_dir)
        self.sequence_length = sequence_length
        n_tokens = json.loads((self.out_dir / "meta.json").read_text())["n_tokens"]
        self.n = n_tokens // sequence_length
        self._tokens: np.memmap | None = None

    def __len__(self) -> int:
        return self.n

    def window(self, i: int) -> np.ndarray:
        if self._tokens is None:
            self._tokens = open_flat_tokens(self.out_dir)
        s = int(i) * self.sequence_length
        return np.array(self._tokens[s : s + self.sequence_length])

    def __getitem__(self, i: int) -> np.ndarray:
        return self.window(i)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}
