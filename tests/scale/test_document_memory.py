"""Nothing per document in a process's own memory: document offsets are read from the mapped shards.

Measured in a fresh interpreter (``RssAnon`` of /proc/self/status), at 2 × 10^6 documents: a private
copy of the offsets would take about 19 MB there; packings come from the mapped packing cache.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._windows.packing import pack_shard
from tests.scale.many_shards import token_shards

Run = Callable[..., subprocess.CompletedProcess[str]]
DOCUMENTS = 2_000_000

MEASURE = """
import json, sys
import numpy as np
from guideloom import StatefulDataLoader, TokenStorage

def anonymous_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))

storage = TokenStorage(sys.argv[1])
mode = {sys.argv[2]: True}
arguments = dict(device="cpu", local_batch_size=8, sequence_length=64, shuffle=True, **mode)
with StatefulDataLoader.from_storage(storage, **arguments) as warm:  # imports, allocator pools, packing cache
    for _, _ in zip(range(20), warm):
        pass
before = anonymous_kib()
with StatefulDataLoader.from_storage(storage, **arguments) as loader:
    for _, batch in zip(range(200), loader):
        pass
    state = loader.state_dict()
    after = anonymous_kib()
print(json.dumps({"growth_kib": after - before, "batches": len(loader)}))
"""


@pytest.fixture(scope="module")
def two_million_documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 × 10^6 documents of 4 tokens in 20 shards."""
    path = tmp_path_factory.mktemp("documents") / "tokens"
    token_shards(path, 20, documents_per_shard=DOCUMENTS // 20, tokens_per_document=4)
    return path


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["document_boundaries", "pack_documents"])
def test_window_modes_keep_no_per_document_copy(two_million_documents: Path, run_python: Run, mode: str) -> None:
    result = run_python(MEASURE, two_million_documents, mode, timeout=280)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["batches"] > 0
    assert found["growth_kib"] < 4 * 1024, found  # a copy of the offsets would be 2e6 × 8 bytes and more


def test_packing_is_built_per_shard_when_first_read(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 200, documents_per_shard=3, tokens_per_document=5)
    cache = Path(__import__("os").environ["GUIDELOOM_CACHE_DIR"]) / "packing"
    before = set(cache.glob("*.pack")) if cache.exists() else set()
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=4, sequence_length=16, pack_documents=True
    ) as loader:
        # Every shard packs its 3 documents of 5 tokens into one row of 16: 200 rows, exactly.
        assert len(loader) == 50
        built = set(cache.glob("*.pack")) - before if cache.exists() else set()
        assert len(built) <= 1
        first = next(iter(loader))
    assert first["input_ids"][0].tolist() == [*range(15), 0]


def test_packed_row_counts_are_exact_for_uneven_shards(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    storage = TokenStorage(tmp_path / "tokens")
    lengths = {shard: rng.integers(1, 40, int(rng.integers(1, 30))).tolist() for shard in range(12)}
    with storage.sync_writer() as writer:
        for shard, documents in lengths.items():
            for length in documents:
                writer.append(shard, np.arange(length))
    expected = sum(
        pack_shard(np.concatenate([[0], np.cumsum(documents)]), 16).row_count for documents in lengths.values()
    )
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=1, sequence_length=16, pack_documents=True
    ) as loader:
        assert len(loader) == expected
        assert sum(1 for _ in loader) == expected
