"""The peers of ``bench_streaming``: LitData and MosaicML Streaming over the same S3 server and link proxy.

``python -m benchmarks.remote.streaming_peers write OPTIONS`` (in the peers' venv) writes the benchmark's token
stream (:func:`corpus_tokens`, the tokens guideloom's storage holds) in LitData's format (``optimize`` with
``TokensLoader``, one chunk per guideloom shard) and Mosaic's (``MDSWriter`` samples of one window, shards of
about a guideloom shard's bytes), and uploads both to the server. ``... epoch OPTIONS`` reads one simulated
machine's epoch (or part of one, or the rest of one from a saved state) and prints its figures as JSON: time to
the first batch, seconds, batches, the server's object bytes meanwhile, and the mix (distinct shards or chunks
in each batch of 8 and in 128 consecutive samples: every sample is mapped back to its chunk by its first tokens).
Machines are ranks of a world of nodes with one rank each: LitData's ``distributed_env``, Mosaic's ``RANK``,
``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

SEQUENCE, BATCH, KEY_TOKENS = 2049, 8, 8


def corpus_tokens(shards: int, shard_tokens: int) -> list[np.ndarray]:
    """The benchmark's tokens, shard by shard (eight pieces each): the same for every library."""
    generator = np.random.default_rng(0)
    return [
        np.concatenate([generator.integers(0, 50_000, shard_tokens // 8, dtype=np.uint32) for _ in range(8)])
        for _ in range(shards)
    ]


def _counters(server: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{server}/_bench/counters", timeout=30) as response:
        counters: dict[str, int] = json.loads(response.read())
        return counters


def _upload(directory: Path, bucket_prefix: str, server: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=server, region_name="us-east-1")
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), "bench", f"{bucket_prefix}/{path.relative_to(directory)}")


def write(options: dict[str, Any]) -> None:
    """Both peers' copies of the corpus, written locally by their own writers and uploaded to the server."""
    shards = corpus_tokens(options["shards"], options["shard_tokens"])
    work = Path(options["work"])
    from litdata import TokensLoader

    from benchmarks.peers import litdata_peer, mosaic_peer

    rows = ({"document_id": index, "tokens": tokens} for index, tokens in enumerate(shards))
    litdata_peer._optimize(
        rows, work / "litdata", False, chunk_size=options["shard_tokens"], item_loader=TokensLoader()
    )
    columns = {"tokens": f"ndarray:uint32:{SEQUENCE}"}
    with mosaic_peer.MDSWriter(out=str(work / "mosaic"), columns=columns, size_limit=options["shard_bytes"]) as writer:
        for block in mosaic_peer.token_blocks(iter(shards), SEQUENCE):
            writer.write({"tokens": block})
    for library in ("litdata", "mosaic"):
        _upload(work / library, library, options["server"])
    print(json.dumps({"mosaic_shards": len(json.loads((work / "mosaic" / "index.json").read_text())["shards"])}))


def _chunk_of_sample(options: dict[str, Any]) -> dict[bytes, int]:
    """Each sample's first tokens -> its chunk (LitData) or shard (Mosaic), from the stream and the layout."""
    stream = np.concatenate(corpus_tokens(options["shards"], options["shard_tokens"]))
    if options["library"] == "litdata":  # blocks never cross a chunk of shard_tokens tokens
        per_chunk = options["shard_tokens"] // SEQUENCE
        chunk_starts = np.arange(options["shards"]) * options["shard_tokens"]
        starts = (chunk_starts[:, None] + np.arange(per_chunk)[None, :] * SEQUENCE).reshape(-1)
        chunks = np.repeat(np.arange(options["shards"]), per_chunk)
    else:
        index = json.loads((Path(options["work"]) / "mosaic" / "index.json").read_text())
        counts = [shard["samples"] for shard in index["shards"]]
        starts = np.arange(sum(counts)) * SEQUENCE
        chunks = np.repeat(np.arange(len(counts)), counts)
    return {
        stream[start : start + KEY_TOKENS].tobytes(): int(chunk) for start, chunk in zip(starts, chunks, strict=True)
    }


def _loader(options: dict[str, Any]) -> Any:
    machine, machines, cache = options["machine"], options["machines"], options["cache_dir"]
    if options["library"] == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
        from litdata.streaming import downloader
        from litdata.utilities.env import _DistributedEnv

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # the proxy is plain http
        dataset = StreamingDataset(
            input_dir="s3://bench/litdata",
            cache_dir=cache,
            item_loader=TokensLoader(block_size=SEQUENCE),
            shuffle=True,
            drop_last=True,
            seed=0,
            max_cache_size=options["cache_bytes"],
            storage_options={"endpoint_url": options["endpoint"]},
        )
        dataset.distributed_env = _DistributedEnv(world_size=machines, global_rank=machine, num_nodes=machines)
        return StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0, drop_last=True)
    os.environ.update(RANK=str(machine), WORLD_SIZE=str(machines), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    os.environ["S3_ENDPOINT_URL"] = options["endpoint"]
    if machines > 1:  # Mosaic reads its rank from the environment but wants a process group: one of this rank alone
        import torch.distributed

        store = torch.distributed.HashStore()
        torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    from benchmarks.peers.mosaic_peer import StreamingDataLoader, StreamingDataset, stack_tokens

    tuned: dict[str, Any] = {}
    samples_per_shard = options["samples_per_shard"]
    if options["library"] == "mosaic-py1e":
        tuned = {"shuffle_algo": "py1e", "shuffle_block_size": options["window"] * samples_per_shard}
    elif options["library"] == "mosaic-py1s":
        # py1s shuffles the samples of one shard at a time per canonical node; a machine reads its canonical nodes
        # interleaved, so a window of shards per machine takes that many canonical nodes per machine
        tuned = {"shuffle_algo": "py1s", "num_canonical_nodes": machines * options["window"]}
    dataset = StreamingDataset(
        remote="s3://bench/mosaic",
        local=cache,
        shuffle=True,
        shuffle_seed=0,
        batch_size=BATCH,
        cache_limit=options["cache_bytes"],
        **tuned,
    )
    return StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0, collate_fn=stack_tokens, drop_last=True)


def _mix(chunks: list[int]) -> dict[str, float]:
    per_batch = [len(set(chunks[at : at + BATCH])) for at in range(0, len(chunks) - BATCH + 1, BATCH)]
    per_128 = [len(set(chunks[at : at + 128])) for at in range(0, len(chunks) - 127, 128)]
    return {"mix_batch": float(np.mean(per_batch or [0])), "mix_128": float(np.mean(per_128 or [0]))}


def epoch(options: dict[str, Any]) -> dict[str, Any]:
    """One machine's epoch (or its first ``stop_after`` batches, or the rest after ``state_path``'s state)."""
    import torch

    chunk_of = _chunk_of_sample(options)
    if options["library"] == "litdata":  # imported before the clock starts, as guideloom's loader is
        import litdata  # noqa: F401
    else:
        import benchmarks.peers.mosaic_peer  # noqa: F401
    before = _counters(options["server"])
    started = time.perf_counter()
    loader = _loader(options)
    resumed = options.get("resume", False)
    if resumed:
        loader.load_state_dict(torch.load(options["state_path"], weights_only=False))
    first_batch, batches, chunks, keys = None, 0, [], set()
    stop = options.get("stop_after")
    for batch in loader:
        rows = np.asarray(batch).astype(np.uint32)
        if first_batch is None:
            first_batch = time.perf_counter() - started
        chunks += [chunk_of.get(row[:KEY_TOKENS].tobytes(), -1) for row in rows]
        keys.update(row[:KEY_TOKENS].tobytes() for row in rows)
        batches += 1
        if stop is not None and batches == stop:
            break
    seconds = time.perf_counter() - started
    if stop is not None:
        torch.save(loader.state_dict(), options["state_path"])
    result = {"first_batch_s": first_batch, "seconds": seconds, "batches": batches, **_mix(chunks)}
    result["bytes"] = _counters(options["server"])["get_bytes"] - before["get_bytes"]
    result["unmapped"] = chunks.count(-1)
    result.update(samples=len(chunks), distinct_samples=len(keys))
    return result


if __name__ == "__main__":
    step, arguments = sys.argv[1], json.loads(sys.argv[2])
    if step == "write":
        write(arguments)
    else:
        print(json.dumps(epoch(arguments)))
