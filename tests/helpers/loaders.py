"""Loaders many tests build alike: the one the framework tests train on, small windows for tests of mistakes."""

from __future__ import annotations

from typing import Any

from guideloom import StatefulDataLoader, TokenStorage


def framework_loader(tokens: TokenStorage, *collate: Any, **options: Any) -> StatefulDataLoader:
    """Shuffled windows of 17 tokens (16 inputs and the next token), 4 a batch on the CPU, seed 3; ``collate`` and
    ``options`` are passed on to :meth:`StatefulDataLoader.from_storage`."""
    settings: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": 17, "shuffle": True}
    return StatefulDataLoader.from_storage(tokens, *collate, **settings, seed=3, **options)


def window_loader(storage: Any, **overrides: Any) -> StatefulDataLoader:
    """Windows of 8 tokens, 2 a batch on the CPU (``overrides`` change any argument): the loader of the tests of
    what building or resuming one refuses."""
    arguments: dict[str, Any] = {"device": "cpu", "local_batch_size": 2, "sequence_length": 8, **overrides}
    return StatefulDataLoader.from_storage(storage, **arguments)
