"""The loader the framework tests train on: every framework reads the same batches of the same storage."""

from __future__ import annotations

from typing import Any

from guideloom import StatefulDataLoader, TokenStorage


def framework_loader(tokens: TokenStorage, *collate: Any, **options: Any) -> StatefulDataLoader:
    """Shuffled windows of 17 tokens (16 inputs and the next token), 4 a batch on the CPU, seed 3; ``collate`` and
    ``options`` are passed on to :meth:`StatefulDataLoader.from_storage`."""
    settings: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": 17, "shuffle": True}
    return StatefulDataLoader.from_storage(tokens, *collate, **settings, seed=3, **options)
