"""The loader's state dict across versions: states of guideloom 0.1 (layout version 1) still resume exactly, and so
do states that recorded the fingerprint as guideloom 0.2 computed it."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
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


def fingerprint_of_0_2(storage: TokenStorage) -> str:
    """The fingerprint as guideloom 0.2 recorded it: a CRC over the header and each shard's id, records, checksum."""
    with storage.sync_reader() as reader:
        crc = zlib.crc32(reader.header.to_json())
        for info in reader.infos:
            crc = zlib.crc32(np.array([info.id, info.record_count, info.data_crc], "<u8").tobytes(), crc)
        return f"{crc:08x}-{len(reader.infos)}-{len(reader)}"


def state_and_rest(storage: TokenStorage, batches: int = 2) -> tuple[dict[str, Any], list[Any]]:
    """A state taken after ``batches`` batches (through JSON, as checkpoints keep it), and the batches after it."""
    with open_loader(storage) as loader:
        iterator = iter(loader)
        for _ in range(batches):
            next(iterator)
        return json.loads(json.dumps(loader.state_dict())), [batch.tolist() for batch in iterator]


def with_fingerprint(state: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    return {**state, "source": {**state["source"], "fingerprint": fingerprint}}


def test_a_version_1_state_resumes_exactly(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    state, expected = state_and_rest(storage)
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


def test_states_with_the_fingerprint_of_guideloom_0_2_resume_exactly(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    state, expected = state_and_rest(storage)
    earlier = with_fingerprint(state, fingerprint_of_0_2(storage))
    assert earlier["source"]["fingerprint"] != state["source"]["fingerprint"]
    for old_state in (earlier, as_version_1(earlier)):
        with open_loader(storage) as loader:
            loader.load_state_dict(old_state)
            assert [batch.tolist() for batch in loader] == expected


def test_a_state_with_the_fingerprint_of_0_2_still_has_its_next_batch_checked(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    with open_loader(storage) as loader:
        next(iter(loader))
        state = with_fingerprint(loader.state_dict(), fingerprint_of_0_2(storage))
    with open_loader(storage) as loader, pytest.raises(StateMismatchError, match="next batch"):
        loader.load_state_dict({**state, "next_batch": "0" * 16})


def test_a_fingerprint_of_neither_form_is_another_storage(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    with open_loader(storage) as loader:
        state = loader.state_dict()
    for fingerprint in ("00000000-3-15", fingerprint_of_0_2(storage).replace("-15", "-16")):
        with open_loader(storage) as loader, pytest.raises(StateMismatchError, match="another storage"):
            loader.load_state_dict(with_fingerprint(state, fingerprint))
        with open_loader(storage) as loader, pytest.raises(StateMismatchError, match="another storage"):
            loader.load_state_dict(as_version_1(with_fingerprint(state, fingerprint)))


def test_a_state_of_0_2_taken_before_shards_were_added_resumes_over_its_shards(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    state, expected = state_and_rest(storage, batches=1)
    earlier = with_fingerprint(state, fingerprint_of_0_2(storage))
    with storage.sync_writer() as writer:
        writer.append(7, list(range(40)))
    with open_loader(storage) as loader:
        loader.load_state_dict(earlier)
        assert [batch.tolist() for batch in loader] == expected
