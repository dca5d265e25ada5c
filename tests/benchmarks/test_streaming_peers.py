"""bench_streaming's peers: every library reads the same tokens, and a peer's mix is counted as guideloom's."""

from __future__ import annotations

import numpy as np

from benchmarks.remote.streaming_peers import _mix, corpus_tokens
from benchmarks.remote.streaming_report import label, table


def test_every_library_is_given_the_same_tokens_shard_by_shard() -> None:
    first, again = corpus_tokens(3, 64), corpus_tokens(3, 64)
    assert [len(tokens) for tokens in first] == [64, 64, 64]
    assert all(np.array_equal(one, other) for one, other in zip(first, again, strict=True))
    assert not np.array_equal(first[0], first[1])


def test_the_mix_counts_distinct_chunks_in_each_batch_of_8_and_each_128_samples() -> None:
    chunks = [sample // 8 for sample in range(256)]  # eight samples a chunk, in order: one chunk a batch
    assert _mix(chunks) == {"mix_batch": 1.0, "mix_128": 16.0}


def test_the_table_names_each_reader_and_marks_estimates() -> None:
    row = {"order": "mosaic", "machines": 1, "cache_percent": 25, "window": None, "estimated": True}
    row.update(bytes_over_share_max=98.0, mix_batch=7.6, mix_128=55.0, epoch_over_link_max=1.0, first_batch_s_max=1.0)
    results = {"shards": 32, "shard_mib": 1.0, "latency_ms": 20, "mb_per_s": 25, "rows": [row]}
    assert "| Mosaic, default (py1e) | 1 | 25% | — | 98.00x (est.) | 7.6 / 55.0 | — | — | 1.00 |" in table(results)
    assert label("litdata, resumed mid-epoch") == "LitData, resumed mid-epoch"
