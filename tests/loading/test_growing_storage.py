"""Checkpoints that survive a growing storage: the epoch finishes on the checkpoint's shards, new ones join next."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import (
    CorruptStorageError,
    DocumentJsonFormat,
    DocumentStorage,
    Mixture,
    StatefulDataLoader,
    StateMismatchError,
    TokenStorage,
)

S = 4


def add_shards(storage: TokenStorage, shards: range, tokens_per_shard: int = 40) -> None:
    """Shard ``s`` holds tokens ``1000 * s, 1000 * s + 1, ...``, so every window names its shard."""
    with storage.sync_writer() as writer:
        for shard in shards:
            writer.append(shard, 1000 * shard + np.arange(tokens_per_shard, dtype=np.uint32))


def open_loader(storage: Any, **options: Any) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=3, sequence_length=S, shuffle=True, seed=3, **options
    )


def batches(loader: StatefulDataLoader, count: int | None = None) -> list[list[list[int]]]:
    """The next ``count`` batches (the rest of the epoch if None) as lists."""
    read = []
    for batch in loader:
        read.append(batch.tolist())
        if count is not None and len(read) == count:
            break
    return read


def shard_path(storage: TokenStorage, shard: int) -> Path:
    return storage.path / "shards" / f"{shard:012d}.shard"


def checkpoint(storage: Any, steps: int = 3) -> tuple[dict[str, Any], list[list[list[int]]]]:
    """A state after ``steps`` batches, and the rest of that epoch read without interruption."""
    with open_loader(storage) as loader:
        batches(loader, steps)
        state = json.loads(json.dumps(loader.state_dict()))
        return state, batches(loader)


def test_a_grown_storage_finishes_the_epoch_on_the_checkpoints_shards(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(4))
    state, rest_of_epoch = checkpoint(storage)
    add_shards(storage, range(4, 7))
    with open_loader(storage) as loader:
        loader.load_state_dict(state)
        assert batches(loader) == rest_of_epoch
        next_epoch = batches(loader)
    with open_loader(storage) as fresh:
        batches(fresh)
        assert next_epoch == batches(fresh)  # exactly a fresh loader's next epoch on the grown storage
    assert {window[0] // 1000 for batch in next_epoch for window in batch} == set(range(7))


def test_a_state_taken_in_the_grown_epoch_resumes_there(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(2))
    state, _ = checkpoint(storage, steps=1)
    add_shards(storage, range(2, 4))
    with open_loader(storage) as loader:
        loader.load_state_dict(state)
        batches(loader)
        batches(loader, 2)  # two batches into the epoch that reads the grown storage
        later = loader.state_dict()
        expected = batches(loader)
    with open_loader(storage) as loader:
        loader.load_state_dict(later)
        assert batches(loader) == expected


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(4))
    state, _ = checkpoint(storage)
    shard_path(storage, 2).unlink()  # removing a shard by hand: its file is the commit, the index follows it
    add_shards(storage, range(4, 6))
    with (
        open_loader(storage) as loader,
        pytest.raises(StateMismatchError, match=r"shard 2 of the storage at .* missing"),
    ):
        loader.load_state_dict(state)


def test_a_shard_file_deleted_while_the_index_records_it_is_missing_for_the_next_loader(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(4))
    state, _ = checkpoint(storage)
    shard_path(storage, 2).unlink()  # the index still records it: it is not current any more, so the listing decides
    with (
        open_loader(storage) as loader,
        pytest.raises(StateMismatchError, match=r"shard 2 of the storage at .* missing"),
    ):
        loader.load_state_dict(state)


def test_a_shard_file_deleted_under_an_open_loader_is_named_when_read(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(4))
    state, _ = checkpoint(storage)
    with open_loader(storage) as loader, pytest.raises(CorruptStorageError, match="shard 2 vanished"):
        loader.load_state_dict(state)
        shard_path(storage, 2).unlink()
        list(loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shard_files_deleted_after_the_first_batch_are_named_as_deleted(tmp_path: Path, num_workers: int) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(12))  # more than the first batches of each worker read
    with open_loader(storage, num_workers=num_workers) as loader, pytest.raises(CorruptStorageError) as caught:
        iterator = iter(loader)
        next(iterator)
        for shard in range(12):
            shard_path(storage, shard).unlink()
        list(iterator)
    shard = int(str(caught.value).split()[1])  # one the loader had not mapped yet: which depends on the workers
    assert str(caught.value) == (
        f"shard {shard} vanished: its file {shard_path(storage, shard)} was deleted or renamed while the storage was "
        "read (a reader keeps only the shards it has mapped, at most max_open_shards; delete or move a storage's "
        "files only when no loader reads it)"
    )


def test_a_shard_already_mapped_is_read_to_the_end_after_its_file_is_deleted(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(1))
    with open_loader(storage) as loader:
        expected = batches(loader)
    with open_loader(storage) as loader:
        read = batches(loader, 1)
        shard_path(storage, 0).unlink()
        assert read + batches(loader) == expected


def test_a_rewritten_shard_is_named(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(5))
    state, _ = checkpoint(storage)
    shard_path(storage, 3).unlink()
    add_shards(storage, range(3, 4), tokens_per_shard=41)
    add_shards(storage, range(5, 6))
    with (
        open_loader(storage) as loader,
        pytest.raises(StateMismatchError, match=r"shard 3 of the storage at .* changed"),
    ):
        loader.load_state_dict(state)


def test_a_document_storage_grows_too(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "documents", DocumentJsonFormat())

    def add(shards: range) -> None:
        with storage.sync_writer() as writer:
            for shard in shards:
                for number in range(5):
                    writer.append(shard, [shard, number])

    def open_documents() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, shuffle=True, seed=1)

    add(range(3))
    with open_documents() as loader:
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
        rest = list(iterator)
    add(range(3, 5))
    with open_documents() as loader:
        loader.load_state_dict(state)
        assert list(loader) == rest
        assert {record[0] for batch in loader for record in batch} == set(range(5))


def test_the_state_stays_small_for_contiguous_shards(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    add_shards(storage, range(300), tokens_per_shard=8)
    with open_loader(storage) as loader:
        batches(loader, 1)
        assert len(json.dumps(loader.state_dict())) < 1024


# --- mixtures -------------------------------------------------------------------------------------------


def mixture_of(root: Path) -> Mixture:
    return Mixture({name: TokenStorage(root / name) for name in ("web", "code")}, {"web": 2, "code": 1}, block_size=6)


def test_a_mixture_with_a_grown_component_finishes_the_epoch_on_the_checkpoints_shards(tmp_path: Path) -> None:
    add_shards(TokenStorage(tmp_path / "web"), range(3))
    add_shards(TokenStorage(tmp_path / "code"), range(10, 12))
    state, rest_of_epoch = checkpoint(mixture_of(tmp_path))
    add_shards(TokenStorage(tmp_path / "code"), range(12, 15))
    add_shards(TokenStorage(tmp_path / "web"), range(3, 4))
    with open_loader(mixture_of(tmp_path)) as loader:
        loader.load_state_dict(state)
        assert batches(loader) == rest_of_epoch
        next_epoch = batches(loader)
    with open_loader(mixture_of(tmp_path)) as fresh:
        batches(fresh)
        assert next_epoch == batches(fresh)


def test_a_mixture_names_a_rewritten_shard_and_its_component(tmp_path: Path) -> None:
    add_shards(TokenStorage(tmp_path / "web"), range(3))
    add_shards(TokenStorage(tmp_path / "code"), range(10, 12))
    state, _ = checkpoint(mixture_of(tmp_path))
    code = TokenStorage(tmp_path / "code")
    shard_path(code, 11).unlink()
    add_shards(code, range(11, 12), tokens_per_shard=44)
    with open_loader(mixture_of(tmp_path)) as loader:
        with pytest.raises(StateMismatchError, match="shard 11 of component 'code' changed"):
            loader.load_state_dict(state)
    shard_path(code, 10).unlink()
    (tmp_path / "code" / "shards.index").unlink()
    with open_loader(mixture_of(tmp_path)) as loader:
        with pytest.raises(StateMismatchError, match=r"shard 10 of component 'code' .* is missing"):
            loader.load_state_dict(state)


def test_a_mixture_of_10_components_and_5_stages_has_a_state_under_1_kb_besides_their_paths(tmp_path: Path) -> None:
    names = [f"corpus-{k}" for k in range(10)]
    for name in names:
        add_shards(TokenStorage(tmp_path / name), range(20), tokens_per_shard=8)
    schedule = [(stage * 1024, {name: 1 + (k * stage) % 7 for k, name in enumerate(names)}) for stage in range(5)]
    mixture = Mixture({name: TokenStorage(tmp_path / name) for name in names}, schedule)
    with open_loader(mixture) as loader:
        batches(loader, 1)
        state = loader.state_dict()
    paths = state["source"]["storages"]  # named so that the state alone can reopen them (guideloom explain)
    assert len(json.dumps(state)) - len(json.dumps(paths)) < 1024
