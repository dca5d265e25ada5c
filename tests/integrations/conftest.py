"""A small shuffled token storage shared by the framework tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from guideloom import TokenStorage

VOCABULARY = 64


@pytest.fixture
def tokens(tmp_path: Path) -> TokenStorage:
    """Two shards of 1,000 tokens below ``VOCABULARY``: 58 windows of 17 tokens."""
    storage = TokenStorage(tmp_path / "tokens")
    rng = np.random.default_rng(7)
    with storage.sync_writer() as writer:
        for document in range(40):
            writer.append(document % 2, rng.integers(0, VOCABULARY, 25))
    return storage


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The models are tiny: intra-op threads only add contention on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
