"""A state that does not fit the loader is refused, naming why: another storage, sequence length or shard set."""

from __future__ import annotations

from pathlib import Path

import pytest

from guideloom import StatefulDataLoader, StateMismatchError
from tests.helpers.loaders import window_loader
from tests.helpers.storages import make_counted_tokens, make_document_storage


def test_a_state_of_another_sequence_length_names_sequence_length(tmp_path: Path) -> None:
    storage = make_counted_tokens(tmp_path, shards=3, tokens=7)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=4) as loader:
        state = loader.state_dict()
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=3) as loader:
        with pytest.raises(StateMismatchError) as caught:
            loader.load_state_dict(state)
    assert str(caught.value) == "the state was taken with sequence_length=4, but this loader has sequence_length=3"


def test_a_state_whose_shard_is_gone_names_the_shard(tmp_path: Path) -> None:
    storage = make_counted_tokens(tmp_path, shards=3, tokens=7)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=4) as loader:
        state = loader.state_dict()
    (tmp_path / "shards" / "000000000001.shard").unlink()
    (tmp_path / "shards.index").unlink()  # removing shards by hand: their files, then the index (rebuilt)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=4) as loader:
        with pytest.raises(StateMismatchError) as caught:
            loader.load_state_dict(state)
    assert str(caught.value) == (
        f"shard 1 of the storage at {tmp_path}, which the state read, is missing: "
        "a checkpoint survives shards being added, not removed"
    )


def test_a_state_of_another_storage_with_the_same_shard_ids_says_so(tmp_path: Path) -> None:
    with StatefulDataLoader.from_storage(
        make_document_storage(tmp_path / "a", count=12), device="cpu", local_batch_size=2
    ) as loader:
        state = loader.state_dict()
    other = make_document_storage(tmp_path / "b", count=13)
    with StatefulDataLoader.from_storage(other, device="cpu", local_batch_size=2) as loader:
        with pytest.raises(StateMismatchError) as caught:
            loader.load_state_dict(state)
    assert str(caught.value) == (
        f"the state was taken from another storage: it read shards 0-2 of the storage at {tmp_path / 'a'}, "
        f"and shards 0-2 of the storage at {tmp_path / 'b'} hold other contents (rewritten, or another storage)"
    )


def test_a_state_from_another_storage_with_fewer_shards_says_so(tmp_path: Path) -> None:
    with window_loader(make_counted_tokens(tmp_path / "a", shards=3)) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with (
        window_loader(make_counted_tokens(tmp_path / "b", shards=2)) as other,
        pytest.raises(StateMismatchError) as error,
    ):
        other.load_state_dict(state)
    assert str(error.value) == (
        f"the state was taken from another storage: it read shards 0-2 of the storage at {tmp_path / 'a'}, "
        f"but the storage at {tmp_path / 'b'} has shards 0-1"
    )


def test_an_empty_state_says_the_key_is_missing(tmp_path: Path) -> None:
    with StatefulDataLoader.from_storage(
        make_document_storage(tmp_path, count=12), device="cpu", local_batch_size=2
    ) as loader:
        with pytest.raises(StateMismatchError) as caught:
            loader.load_state_dict({})
    assert str(caught.value) == "not a guideloom loader state: the 'guideloom_loader_state' key is missing"


def test_a_state_whose_source_has_no_kind_says_so(tmp_path: Path) -> None:
    with window_loader(make_counted_tokens(tmp_path / "a", shards=1)) as loader:
        state = loader.state_dict()
        del state["source"]["kind"]
        with pytest.raises(StateMismatchError) as error:
            loader.load_state_dict(state)
    assert str(error.value) == "the state's source records no 'kind': it is not from state_dict()"
