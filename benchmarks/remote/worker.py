"""One step of the object-storage benchmark, in a fresh process of the right environment.

``python -m benchmarks.remote.worker write LIBRARY OUT TOKENS [CORPUS [COMPRESSION]]``: write the benchmark's
documents in LIBRARY's format (``guideloom`` writes to OUT, a URL or a directory; the peers write a
local directory). CORPUS is ``tokens`` (the token stream, default) or ``documents`` (records of a
document id and its tokens, TOKENS / 275 of them); COMPRESSION ``zstd`` or ``none`` (default).
``python -m benchmarks.remote.worker read LIBRARY SOURCE CACHE_DIR ENDPOINT EPOCHS [CORPUS]``: read SOURCE (a URL or a
local directory) for EPOCHS shuffled epochs (tokens: (8, 2048) int64 batches; documents: 32 records)
and print one JSON object per epoch: time to the first batch (from opening the dataset, for the first
epoch), seconds, tokens (documents: records), and the object bytes the server sent meanwhile, read
from ``$BENCH_COUNTERS`` if set (the server behind a fault proxy), else from ENDPOINT.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.run import records, token_documents  # the main benchmark's documents

SEQUENCE, BATCH, DOCUMENT_BATCH = 2048, 8, 32
OPENED: list[Any] = []  # the guideloom storage read, for its retry count
TOKENS_PER_RECORD = 275  # the mean length of run.records


def write(library: str, out: str, tokens: int, corpus: str = "tokens", compression: str = "none") -> None:
    if corpus == "documents":
        _write_documents(library, out, tokens // TOKENS_PER_RECORD, None if compression == "none" else compression)
        return
    documents = token_documents(tokens)
    zstd = {} if compression == "none" else {"compression": compression}
    if library == "guideloom":
        from guideloom import TokenStorage

        endpoint = os.environ.get("BENCH_ENDPOINT")
        options = {"storage_options": {"endpoint_url": endpoint}} if "://" in out else {}
        storage = TokenStorage(out, **options, **zstd)  # type: ignore[arg-type]
        with storage.sync_writer() as writer:
            shard_tokens = 0
            shard = 0
            for document in documents:  # shards of about 16M tokens (64 MB), as the peers' chunks
                writer.append(shard, document)
                shard_tokens += len(document)
                if shard_tokens >= 16 << 20:
                    writer.commit(shard)
                    shard, shard_tokens = shard + 1, 0
        return
    if library == "litdata":
        from litdata import TokensLoader

        from benchmarks.peers import litdata_peer

        chunk = SEQUENCE * litdata_peer.CHUNK_BLOCKS
        rows = ({"document_id": i, "tokens": d} for i, d in enumerate(documents))
        # LitData compresses token chunks whole (its "batch" frames are for pytree items only)
        level = {"compression_level": "chunk"} if zstd else {}
        litdata_peer._optimize(rows, Path(out), False, chunk_size=chunk, item_loader=TokensLoader(), **zstd, **level)
    else:
        from benchmarks.peers import mosaic_peer

        columns = {"tokens": f"ndarray:uint32:{SEQUENCE}"}
        with mosaic_peer.MDSWriter(out=out, columns=columns, size_limit=mosaic_peer.SHARD_BYTES, **zstd) as writer:
            for block in mosaic_peer.token_blocks(documents, SEQUENCE):
                writer.write({"tokens": block})


def _write_documents(library: str, out: str, count: int, compression: str | None) -> None:
    """Records of a document id and its tokens (as uint32 / int32 bytes in every library)."""
    zstd = {} if compression is None else {"compression": compression}
    if library == "guideloom":
        from benchmarks.ours import RECORDS_PER_SHARD, TokenDocumentFormat
        from guideloom import DocumentStorage

        endpoint = os.environ.get("BENCH_ENDPOINT")
        options = {"storage_options": {"endpoint_url": endpoint}, **zstd} if "://" in out else {}
        storage = DocumentStorage(out, TokenDocumentFormat(), **options)  # type: ignore[arg-type]
        with storage.sync_writer() as writer:
            for record in records(count):
                writer.append(record["document_id"] // (RECORDS_PER_SHARD * 4), record)  # ~64 MB shards
    elif library == "litdata":
        from benchmarks.peers import litdata_peer

        litdata_peer._optimize(records(count), Path(out), True, chunk_bytes="64MB", **zstd)
    else:
        from benchmarks.peers import mosaic_peer

        columns = {"document_id": "int64", "tokens": "ndarray:uint32"}
        with mosaic_peer.MDSWriter(out=out, columns=columns, size_limit=mosaic_peer.SHARD_BYTES, **zstd) as writer:
            for document_id, tokens in mosaic_peer.record_arrays(records(count)):
                writer.write({"document_id": document_id, "tokens": tokens})


def _counters(endpoint: str) -> dict[str, int]:
    endpoint = os.environ.get("BENCH_COUNTERS", endpoint)
    with urllib.request.urlopen(f"{endpoint}/_bench/counters", timeout=30) as response:
        counters: dict[str, int] = json.loads(response.read())
        return counters


def _epochs(library: str, source: str, cache: str, endpoint: str, corpus: str) -> Iterator[Iterable[Any]]:
    """The same loader's epochs, one iterable after the other."""
    if corpus == "documents":
        yield from _document_epochs(library, source, cache, endpoint)
        return
    if library == "guideloom":
        from guideloom import StatefulDataLoader, TokenStorage

        if "://" in source:
            storage = TokenStorage(source, storage_options={"endpoint_url": endpoint}, cache_dir=cache)
        else:
            storage = TokenStorage(source)
        OPENED.append(storage)
        loader = StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=BATCH, sequence_length=SEQUENCE, shuffle=True, drop_last=True
        )
        while True:
            yield loader
    elif library == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
        from litdata.streaming import downloader

        # LitData downloads through obstore, which refuses plain-http endpoints unless told to allow them.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"

        dataset = StreamingDataset(
            input_dir=source,
            cache_dir=cache,
            item_loader=TokensLoader(block_size=SEQUENCE),
            shuffle=True,
            drop_last=True,
            storage_options={"endpoint_url": endpoint},
        )
        loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0, drop_last=True)
        while True:
            yield loader
    else:
        os.environ["S3_ENDPOINT_URL"] = endpoint
        from benchmarks.peers.mosaic_peer import StreamingDataLoader, StreamingDataset, stack_tokens

        dataset = StreamingDataset(remote=source, local=cache, shuffle=True, batch_size=BATCH)
        loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0, collate_fn=stack_tokens, drop_last=True)
        while True:
            yield loader


def _document_epochs(library: str, source: str, cache: str, endpoint: str) -> Iterator[Iterable[Any]]:
    if library == "guideloom":
        from benchmarks.ours import TokenDocumentFormat
        from guideloom import DocumentStorage, StatefulDataLoader

        remote = {"storage_options": {"endpoint_url": endpoint}, "cache_dir": cache} if "://" in source else {}
        storage = DocumentStorage(source, TokenDocumentFormat(), **remote)  # type: ignore[arg-type]
        loader: Any = StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=DOCUMENT_BATCH, shuffle=True, drop_last=True
        )
    elif library == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
        dataset = StreamingDataset(
            input_dir=source, cache_dir=cache, shuffle=True, drop_last=True, storage_options={"endpoint_url": endpoint}
        )
        loader = StreamingDataLoader(
            dataset, batch_size=DOCUMENT_BATCH, num_workers=0, drop_last=True, collate_fn=lambda batch: batch
        )
    else:
        os.environ["S3_ENDPOINT_URL"] = endpoint
        from benchmarks.peers.mosaic_peer import StreamingDataLoader, StreamingDataset  # after its torchvision stub

        dataset = StreamingDataset(remote=source, local=cache, shuffle=True, batch_size=DOCUMENT_BATCH)
        loader = StreamingDataLoader(
            dataset, batch_size=DOCUMENT_BATCH, num_workers=0, collate_fn=lambda batch: batch, drop_last=True
        )
    while True:
        yield loader


def _count(batch: Any, corpus: str) -> int:
    return len(batch) if corpus == "documents" else int(torch.as_tensor(batch).numel())


def read(library: str, source: str, cache: str, endpoint: str, epochs: int, corpus: str = "tokens") -> None:
    started = time.perf_counter()
    before = _counters(endpoint)
    loaders = _epochs(library, source, cache, endpoint, corpus)
    for epoch in range(epochs):
        if epoch:
            started, before = time.perf_counter(), _counters(endpoint)
        first = None
        tokens = 0
        for batch in next(loaders):
            if first is None:
                first = time.perf_counter() - started
            tokens += _count(batch, corpus)
        seconds = time.perf_counter() - started
        after = _counters(endpoint)
        print(
            json.dumps(
                {
                    "epoch": epoch,
                    "first_batch_s": first,
                    "seconds": seconds,
                    "tokens": tokens,
                    "get_requests": after["get_requests"] - before["get_requests"],
                    "get_bytes": after["get_bytes"] - before["get_bytes"],
                    "retries": sum(storage.retry_count for storage in OPENED),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:])
    else:
        read(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), *sys.argv[7:])
