"""An iterator whose batch raised keeps raising; a fresh iter(loader) continues exactly with that batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import StatefulDataLoader, TokenStorage


class FailsOnce:
    """A collate that raises the first time it builds batch ``failing`` (a real failure in user code)."""

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.calls = 0

    def __call__(self, samples: list[Any]) -> np.ndarray:
        self.calls += 1
        if self.calls == self.failing + 1:
            raise OSError("the feature store went away")
        return np.stack(samples)


def _storage(path: Path) -> TokenStorage:
    storage = TokenStorage(path)
    with storage.sync_writer() as writer:
        for shard in range(2):
            writer.append(shard, np.arange(shard * 1000, shard * 1000 + 700, dtype=np.uint32))
    return storage


def test_next_after_a_failed_batch_raises_then_a_fresh_iterator_continues(tmp_path: Path) -> None:
    storage = _storage(tmp_path / "tokens")
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": 16, "shuffle": True}
    with StatefulDataLoader.from_storage(storage, **options) as loader:
        expected = [batch.tolist() for batch in loader]
    with StatefulDataLoader.from_storage(storage, FailsOnce(3), **options) as loader:
        batches = iter(loader)
        taken = [next(batches).tolist() for _ in range(3)]
        with pytest.raises(OSError, match="feature store"):
            next(batches)
        for _ in range(2):  # a retry loop around next() never ends the epoch silently
            with pytest.raises(RuntimeError, match=r"call iter\(loader\) again") as raised:
                next(batches)
            assert isinstance(raised.value.__cause__, OSError)
        taken += [batch.tolist() for batch in loader]
    assert taken == expected
