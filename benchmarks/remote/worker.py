"""One step of the object-storage benchmark, in a fresh process of the right environment.

``python worker.py write LIBRARY OUT TOKENS``: write the benchmark's documents in LIBRARY's format
(``guideloom`` writes to OUT, a URL or a directory; the peers write a local directory).
``python worker.py read LIBRARY SOURCE CACHE_DIR ENDPOINT EPOCHS``: read SOURCE (a URL or a local
directory) for EPOCHS shuffled epochs of (8, 2048) int64 batches and print one JSON object per epoch:
time to the first batch (from opening the dataset, for the first epoch), seconds, tokens, and the
object bytes the server sent meanwhile.
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

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS))  # the peers' adapters and the main benchmark's documents
from run import token_documents  # noqa: E402

SEQUENCE, BATCH = 2048, 8


def write(library: str, out: str, tokens: int) -> None:
    documents = token_documents(tokens)
    if library == "guideloom":
        from guideloom import TokenStorage

        endpoint = os.environ.get("BENCH_ENDPOINT")
        options = {"storage_options": {"endpoint_url": endpoint}} if "://" in out else {}
        storage = TokenStorage(out, **options)  # type: ignore[arg-type]
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
        from peers import litdata_peer

        litdata_peer.write_tokens(documents, Path(out), sequence_length=SEQUENCE)
    else:
        from peers import mosaic_peer

        mosaic_peer.write_tokens(documents, Path(out), sequence_length=SEQUENCE)


def _counters(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{endpoint}/_bench/counters", timeout=30) as response:
        counters: dict[str, int] = json.loads(response.read())
        return counters


def _epochs(library: str, source: str, cache: str, endpoint: str) -> Iterator[Iterable[Any]]:
    """The same loader's epochs, one iterable after the other."""
    if library == "guideloom":
        from guideloom import StatefulDataLoader, TokenStorage

        if "://" in source:
            storage = TokenStorage(source, storage_options={"endpoint_url": endpoint}, cache_dir=cache)
        else:
            storage = TokenStorage(source)
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
        from peers.mosaic_peer import stack_tokens
        from streaming import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(remote=source, local=cache, shuffle=True, batch_size=BATCH)
        loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0, collate_fn=stack_tokens, drop_last=True)
        while True:
            yield loader


def read(library: str, source: str, cache: str, endpoint: str, epochs: int) -> None:
    started = time.perf_counter()
    before = _counters(endpoint)
    loaders = _epochs(library, source, cache, endpoint)
    for epoch in range(epochs):
        if epoch:
            started, before = time.perf_counter(), _counters(endpoint)
        first = None
        tokens = 0
        for batch in next(loaders):
            if first is None:
                first = time.perf_counter() - started
            tokens += int(torch.as_tensor(batch).numel())
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
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        read(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
