"""The loader's state dict across versions: states of guideloom 0.1 (layout version 1) still resume exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from guideloom import StatefulDataLoader, StateMismatchError, TokenStorage


def make_tokens(path: Path) -> TokenStorage:
    storage = TokenStorage(path)
    with storage.sync_writer() as writer:
        for shard in range(3):
            for document in range(5):
                writer.append(shard, list(range(shard * 100 + document, shard * 100 + document + 17)))
    return storage


def open_loader(storage: TokenStorage) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=5, shuffle=True)


def as_version_1(state: dict[str, Any]) -> dict[str, Any]:
    """The same position as guideloom 0.1 wrote it: the source as a fingerprint and a sequence_length."""
    source = state["source"]
    old = {key: value for key, value in state.items() if key != "source"}
    return {
        **old,
        "guideloom_loader_state": 1,
        "storage": source["fingerprint"],
        "sequence_length": source["sequence_length"],
    }


def test_a_version_1_state_resumes_exactly(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    with open_loader(storage) as loader:
        iterator = iter(loader)
        next(iterator), next(iterator)
        state = json.loads(json.dumps(loader.state_dict()))
        expected = [batch.tolist() for batch in iterator]
    with open_loader(storage) as loader:
        loader.load_state_dict(as_version_1(state))
        assert [batch.tolist() for batch in loader] == expected


def test_a_version_1_state_of_another_sequence_length_names_it(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    with open_loader(storage) as loader:
        state = as_version_1(loader.state_dict())
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=6) as loader:
        with pytest.raises(StateMismatchError) as caught:
            loader.load_state_dict(state)
    assert str(caught.value) == "the state was taken with sequence_length=5, but this loader has sequence_length=6"
