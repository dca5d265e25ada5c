"""StatefulDataLoader: order, epochs, batch sizes, resume, workers, devices."""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from guideloom import (
    StatefulDataLoader,
    StateMismatchError,
    StorageNotFoundError,
    TokenStorage,
)
from tests.helpers.batches import assert_resumes_exactly, comparable, take
from tests.helpers.storages import make_document_storage as make_documents
from tests.helpers.storages import make_token_storage as make_tokens


def ids(batch: list[dict[str, int]]) -> list[int]:
    return [record["id"] for record in batch]


def test_unshuffled_order_is_storage_order(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=10)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4) as loader:
        assert [ids(batch) for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        assert len(loader) == 3


def test_drop_last_drops_the_short_batch(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=10)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4, drop_last=True) as loader:
        assert [ids(batch) for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert len(loader) == 2


def test_token_windows_are_consecutive_slices_of_the_stream(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    with storage.sync_reader() as reader:
        stream = reader.read_tokens(0, reader.token_count).astype(np.int64)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=9) as loader:
        batches = list(loader)
    windows = torch.cat(batches)
    assert windows.dtype == torch.int64 and windows.shape == (len(stream) // 9, 9)
    assert windows.flatten().tolist() == stream[: len(stream) // 9 * 9].tolist()


def test_shuffled_epoch_is_a_permutation_and_epochs_differ(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=40)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=8, shuffle=True, seed=3) as loader:
        first = [i for batch in loader for i in ids(batch)]
        second = [i for batch in loader for i in ids(batch)]
    assert sorted(first) == sorted(second) == list(range(40))
    assert first != second and first != list(range(40))


def test_the_first_batch_waits_for_the_order_of_a_few_batches_only(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    with storage.sync_writer() as writer:
        writer.append(0, np.arange(100_000) % 50_000)  # 10,000 windows of 10 tokens: 1,250 batches of 8
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=8, sequence_length=10, shuffle=True, seed=5
    ) as loader:
        hinted: list[np.ndarray] = []
        loader._source.prefetch = lambda indices, epoch: hinted.append(indices)  # type: ignore[method-assign]
        batches = list(loader)
    assert [len(indices) for indices in hinted] == [256, 4096, 4096, 1544, 8]  # 32 batches, then 512 at a time
    order = np.concatenate(hinted)
    assert torch.cat(batches)[:, 0].tolist() == (order * 10 % 50_000).tolist()
    assert sorted(order.tolist()) == list(range(10_000))


def test_golden_shuffled_sequence(tmp_path: Path) -> None:
    """Pins the order algorithm: a change here changes every user's data order."""
    storage = make_documents(tmp_path, count=12)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=5, shuffle=True, seed=1234) as loader:
        epochs = [[ids(batch) for batch in loader] for _ in range(2)]
    assert epochs == GOLDEN_EPOCHS


GOLDEN_EPOCHS = [
    [[9, 8, 3, 2, 4], [0, 1, 11, 10, 7], [6, 5]],
    [[7, 11, 5, 0, 10], [8, 3, 2, 1, 6], [4, 9]],
]


def test_abandoned_iterator_is_continued_not_restarted(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=10)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2) as loader:
        iterator = iter(loader)
        assert ids(next(iterator)) == [0, 1]
        assert [ids(batch) for batch in loader] == [[2, 3], [4, 5], [6, 7], [8, 9]]
        with pytest.raises(RuntimeError, match="superseded"):
            next(iterator)
        assert ids(next(iter(loader))) == [0, 1]


def test_state_dict_is_small_json_and_independent_of_size(tmp_path: Path) -> None:
    small = make_documents(tmp_path / "small", count=10)
    large = make_documents(tmp_path / "large", count=2000)
    sizes = []
    for storage in (small, large):
        with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4, shuffle=True) as loader:
            next(iter(loader))
            sizes.append(len(json.dumps(loader.state_dict())))
    assert max(sizes) < 1024 and abs(sizes[0] - sizes[1]) <= 4


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_after_every_step_is_exact_for_tokens(tmp_path: Path, shuffle: bool) -> None:
    storage = make_tokens(tmp_path)

    def open_loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=3, sequence_length=11, shuffle=shuffle, seed=7
        )

    with open_loader() as loader:
        per_epoch = len(loader)
    total = 2 * per_epoch + 2
    assert_resumes_exactly(open_loader, total, list(range(total)))


def test_resume_after_every_step_is_exact_for_documents(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=17)

    def open_loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4, shuffle=True, seed=1)

    assert_resumes_exactly(open_loader, 12, list(range(12)))


def test_resume_with_workers_is_exact(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)

    def open_loader(workers: int = 2) -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=3, sequence_length=11, shuffle=True, seed=7, num_workers=workers
        )

    with open_loader(0) as loader:
        total = 2 * len(loader) + 1
        expected = take(loader, total, comparable)
    with open_loader() as loader:
        assert take(loader, total, comparable) == expected
    assert_resumes_exactly(open_loader, total, [0, 1, total // 2, total - 1])


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_do_not_depend_on_workers_or_prefetch(tmp_path: Path, workers: int) -> None:
    storage = make_documents(tmp_path, count=30)
    runs = []
    for prefetch in (1, 4):
        with StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=4, shuffle=True, num_workers=workers, prefetch_factor=prefetch
        ) as loader:
            runs.append(take(loader, 20, comparable))
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4, shuffle=True) as loader:
        runs.append(take(loader, 20, comparable))
    assert runs[0] == runs[1] == runs[2]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    count=st.integers(1, 40),
    first=st.tuples(st.integers(1, 5), st.integers(1, 4)),
    second=st.tuples(st.integers(1, 5), st.integers(1, 4)),
    steps=st.integers(0, 12),
    drop_last=st.booleans(),
)
def test_elastic_resume_neither_skips_nor_repeats(
    tmp_path_factory: pytest.TempPathFactory,
    count: int,
    first: tuple[int, int],
    second: tuple[int, int],
    steps: int,
    drop_last: bool,
) -> None:
    """Change batch size and world size mid-epoch: the epoch's samples are still each seen once."""
    # drop_last with fewer samples than a global batch is refused (every batch would be dropped)
    assume(not drop_last or count >= max(first[0] * first[1], second[0] * second[1]))
    storage = make_documents(tmp_path_factory.mktemp("elastic"), count=count)

    def ranks(local: int, world: int) -> list[StatefulDataLoader]:
        return [
            StatefulDataLoader.from_storage(
                storage,
                device="cpu",
                local_batch_size=local,
                shuffle=True,
                seed=9,
                drop_last=drop_last,
                rank=rank,
                world_size=world,
            )
            for rank in range(world)
        ]

    seen: list[int] = []
    loaders = ranks(*first)
    iterators = [iter(loader) for loader in loaders]
    for _ in range(min(steps, len(loaders[0]))):
        batches = [ids(next(iterator)) for iterator in iterators]
        assert len({len(batch) for batch in batches}) == 1, "ranks got different batch sizes"
        seen += [i for batch in batches for i in batch]
    states = [loader.state_dict() for loader in loaders]
    assert all(state == states[0] for state in states)
    for loader in loaders:
        loader.close()
    resumed = ranks(*second)
    for loader in resumed:
        loader.load_state_dict(states[0])
    tail_iterators = [iter(loader) for loader in resumed]
    if resumed[0].state_dict()["epoch"] == states[0]["epoch"]:  # else the epoch was complete: iter() began the next
        tails = [[ids(batch) for batch in iterator] for iterator in tail_iterators]
        assert len({len(tail) for tail in tails}) == 1, "ranks got different batch counts"
        for step in zip(*tails, strict=True):
            seen += [i for batch in step for i in batch]
    for loader in resumed:
        loader.close()
    if drop_last:
        assert len(set(seen)) == len(seen), "a sample was repeated"
        assert 0 <= count - len(seen) < max(first[0] * first[1], second[0] * second[1])
    else:
        assert sorted(seen[:count]) == list(range(count)), "a sample was skipped or repeated"
        assert seen[count:] == seen[: len(seen) - count], "padding must wrap around to the epoch's start"


def test_state_from_another_storage_or_seed_is_refused(tmp_path: Path) -> None:
    storage = make_documents(tmp_path / "a", count=10)
    other = make_documents(tmp_path / "b", count=11)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, shuffle=True) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with StatefulDataLoader.from_storage(other, device="cpu", local_batch_size=2, shuffle=True) as loader:
        with pytest.raises(StateMismatchError, match="storage"):
            loader.load_state_dict(state)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, shuffle=True, seed=1) as loader:
        with pytest.raises(StateMismatchError, match="seed"):
            loader.load_state_dict(state)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2) as loader:
        with pytest.raises(StateMismatchError, match="shuffle"):
            loader.load_state_dict(state)


def test_state_with_another_sequence_length_is_refused(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=8) as loader:
        state = loader.state_dict()
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=9) as loader:
        with pytest.raises(StateMismatchError):
            loader.load_state_dict(state)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"position": -1}, "position"),
        ({"position": 10**9}, "position"),
        ({"epoch": "1"}, "epoch"),
        ({"guideloom_loader_state": 99}, "version"),
        ({"seed": "0"}, "seed"),
    ],
)
def test_hand_edited_state_is_refused(tmp_path: Path, edit: dict[str, Any], message: str) -> None:
    storage = make_documents(tmp_path, count=10)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2) as loader:
        with pytest.raises(StateMismatchError, match=message):
            loader.load_state_dict({**loader.state_dict(), **edit})
        with pytest.raises(TypeError, match="state"):
            loader.load_state_dict([1, 2])  # type: ignore[arg-type]


def test_sequence_length_must_match_the_storage_kind(tmp_path: Path) -> None:
    tokens = make_tokens(tmp_path / "t")
    documents = make_documents(tmp_path / "d")
    with pytest.raises(ValueError, match="sequence_length is required"):
        StatefulDataLoader.from_storage(tokens, device="cpu", local_batch_size=2)
    with pytest.raises(ValueError, match="sequence_length must be omitted"):
        StatefulDataLoader.from_storage(documents, device="cpu", local_batch_size=2, sequence_length=4)
    with pytest.raises(ValueError, match="sequence_length"):
        StatefulDataLoader.from_storage(tokens, device="cpu", local_batch_size=2, sequence_length=0)


@pytest.mark.parametrize(
    ("arguments", "error", "name"),
    [
        ({"local_batch_size": 0}, ValueError, "local_batch_size"),
        ({"local_batch_size": 2.0}, TypeError, "local_batch_size"),
        ({"num_workers": -1}, ValueError, "num_workers"),
        ({"rank": 2, "world_size": 2}, ValueError, "rank"),
        ({"rank": 0}, ValueError, "world_size"),
        ({"shuffle": "yes"}, TypeError, "shuffle"),
        ({"device": "no-such-device"}, ValueError, "device"),
    ],
)
def test_bad_arguments_name_the_argument(tmp_path: Path, arguments: dict[str, Any], error: type, name: str) -> None:
    storage = make_documents(tmp_path)
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 2, **arguments}
    with pytest.raises(error, match=name):
        StatefulDataLoader.from_storage(storage, **options)


def test_empty_and_missing_storages_are_clear_errors(tmp_path: Path) -> None:
    empty = TokenStorage(tmp_path / "empty")
    with empty.sync_writer() as writer:
        writer.append(0, [1, 2, 3])
    with pytest.raises(ValueError, match="no samples"):
        StatefulDataLoader.from_storage(empty, device="cpu", local_batch_size=2, sequence_length=4)
    with pytest.raises(StorageNotFoundError):
        StatefulDataLoader.from_storage(
            TokenStorage(tmp_path / "missing"), device="cpu", local_batch_size=2, sequence_length=4
        )
    with pytest.raises(TypeError, match="storage"):
        StatefulDataLoader.from_storage(str(tmp_path), device="cpu", local_batch_size=2)


def test_rank_and_world_size_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make_documents(tmp_path, count=8)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2) as loader:
        assert [ids(batch) for batch in loader] == [[2, 3], [6, 7]]


def test_a_world_size_without_a_rank_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make_documents(tmp_path, count=8)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")  # what Lightning's launcher sets before the process group exists
    with pytest.raises(ValueError) as error:
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2)
    assert str(error.value) == (
        "WORLD_SIZE=2 is set but RANK is not, and torch.distributed is not initialised, so this process's rank "
        "is unknown: build the loader after init_process_group (under Lightning, inside train_dataloader()), "
        "or pass rank= and world_size="
    )
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, rank=1, world_size=2) as loader:
        assert [ids(batch) for batch in loader] == [[2, 3], [6, 7]]


def test_loader_ignores_shards_committed_after_it_was_created(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=6, shards=2)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=10, num_workers=1) as loader:
        with storage.sync_writer() as writer:
            writer.append(99, {"id": 99})
        assert [ids(batch) for batch in loader] == [[0, 1, 2, 3, 4, 5]]


def test_nested_tensors_reach_the_device(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=4)

    def collate(samples: list[dict[str, int]]) -> dict[str, Any]:
        values = torch.tensor(ids(samples))
        return {"ids": values, "pair": (values, [values * 2]), "name": "batch"}

    with StatefulDataLoader.from_storage(storage, collate, device=torch.device("meta"), local_batch_size=4) as loader:
        batch = next(iter(loader))
    assert batch["ids"].device.type == "meta" and batch["name"] == "batch"
    assert batch["pair"][0].device.type == "meta" and batch["pair"][1][0].device.type == "meta"


def failing_collate(samples: list[Any]) -> Any:
    raise ValueError("collate refused record batch")


def test_worker_exception_surfaces_with_its_traceback(tmp_path: Path) -> None:
    storage = make_documents(tmp_path)
    with StatefulDataLoader.from_storage(
        storage, failing_collate, device="cpu", local_batch_size=2, num_workers=2
    ) as loader:
        with pytest.raises(ValueError, match="collate refused record batch") as caught:
            next(iter(loader))
    assert "failing_collate" in str(caught.value)


def slow_collate(samples: list[Any]) -> Any:
    time.sleep(0.2)
    return samples


def test_killed_worker_raises_instead_of_hanging(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=200)
    before = set(_children())  # e.g. multiprocessing's resource tracker: not ours to kill
    with StatefulDataLoader.from_storage(
        storage, slow_collate, device="cpu", local_batch_size=2, num_workers=2
    ) as loader:
        iterator = iter(loader)
        next(iterator)
        workers = set(_children()) - before
        assert workers
        for worker in workers:
            os.kill(worker, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"(?i)worker"):
            for _ in iterator:
                pass
        assert time.monotonic() - started < 30


def _children() -> list[int]:
    path = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    return [int(pid) for pid in path.read_text().split()]


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_close_stops_worker_processes_and_releases_files(tmp_path: Path) -> None:
    storage = make_documents(tmp_path)
    children = set(_children())
    for _round in range(2):  # the first round may open torch's process-wide IPC resources once
        gc.collect()
        descriptors = _open_descriptors()
        loader = StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, num_workers=2)
        next(iter(loader))
        assert set(_children()) - children, "workers should be running"
        loader.close()
        deadline = time.monotonic() + 10
        while set(_children()) - children and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(_children()) - children
    gc.collect()
    assert _open_descriptors() <= descriptors


def test_token_windows_prefetch_in_a_thread_that_close_stops(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    descriptors = _open_descriptors()
    loader = StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=2, sequence_length=5, num_workers=2
    )
    next(iter(loader))
    assert any(thread.name.startswith("guideloom-loader") for thread in threading.enumerate())
    loader.close()
    assert not any(thread.name.startswith("guideloom-loader") for thread in threading.enumerate())
    assert _open_descriptors() <= descriptors


def test_token_windows_with_workers_start_no_process(tmp_path: Path) -> None:
    """As the loader page says: token windows with the default collate take one thread, whatever num_workers."""
    storage = make_tokens(tmp_path)
    before = set(_children())
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=2, sequence_length=5, num_workers=3
    ) as loader:
        batches = list(loader)
        assert set(_children()) - before == set()
    assert len(batches) == len(loader)


def typed_collate(samples: list[dict[str, int]]) -> dict[str, Any]:
    values = torch.tensor(ids(samples))
    return {
        "ids": values,
        "half": values.to(torch.bfloat16),  # a dtype NumPy lacks
        "strided": torch.arange(12).reshape(3, 4).t(),
        "nested": [(values * 2, "text")],
    }


def test_worker_batches_keep_types_dtypes_and_values(tmp_path: Path) -> None:
    storage = make_documents(tmp_path, count=9)
    results = []
    for workers in (0, 2):
        with StatefulDataLoader.from_storage(
            storage, typed_collate, device="cpu", local_batch_size=4, num_workers=workers
        ) as loader:
            results.append(list(loader))
    for expected, got in zip(*results, strict=True):
        assert got["half"].dtype == torch.bfloat16 and torch.equal(got["half"], expected["half"])
        assert torch.equal(got["ids"], expected["ids"]) and torch.equal(got["strided"], expected["strided"])
        assert isinstance(got["nested"][0], tuple) and got["nested"][0][1] == "text"
        assert torch.equal(got["nested"][0][0], expected["nested"][0][0])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_uint64_ids_beyond_int64_are_refused_not_wrapped(tmp_path: Path, num_workers: int) -> None:
    """Batches are built in groups; the error still comes at the batch holding the id, not before."""
    storage = TokenStorage(tmp_path, dtype="uint64")
    with storage.sync_writer() as writer:
        writer.append(0, np.array([1, 2, 3, 2**63 + 5], np.uint64))
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=1, sequence_length=2, num_workers=num_workers
    ) as loader:
        iterator = iter(loader)
        assert next(iterator).tolist() == [[1, 2]]
        with pytest.raises(ValueError, match="int64"):
            next(iterator)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_int32_windows_are_the_int64_windows(tmp_path: Path, num_workers: int) -> None:
    storage = make_tokens(tmp_path / "tokens")
    batches = {}
    for window_dtype in (torch.int64, torch.int32):
        with StatefulDataLoader.from_storage(
            storage,
            device="cpu",
            local_batch_size=3,
            sequence_length=5,
            shuffle=True,
            window_dtype=window_dtype,
            num_workers=num_workers,
        ) as loader:
            batches[window_dtype] = list(loader) + list(loader)  # two epochs
    assert {batch.dtype for batch in batches[torch.int32]} == {torch.int32}
    assert comparable(batches[torch.int32]) == comparable(batches[torch.int64])


def test_uint32_ids_beyond_int32_are_refused_at_their_batch(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path, dtype="uint32")
    with storage.sync_writer() as writer:
        writer.append(0, np.array([1, 2, 3, 2**31], np.uint32))
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=1, sequence_length=2, window_dtype=torch.int32
    ) as loader:
        iterator = iter(loader)
        assert next(iterator).tolist() == [[1, 2]]
        with pytest.raises(ValueError, match=r"uint32 token ids of 2\*\*31 or more.*int32"):
            next(iterator)


def test_window_dtype_is_checked(tmp_path: Path) -> None:
    wide = TokenStorage(tmp_path / "wide", dtype="int64")
    with wide.sync_writer() as writer:
        writer.append(0, [1, 2, 3])
    with pytest.raises(ValueError, match="cannot hold the int64 ids"):
        StatefulDataLoader.from_storage(
            wide, device="cpu", local_batch_size=1, sequence_length=2, window_dtype=torch.int32
        )
    with pytest.raises(ValueError, match=r"torch\.int64 or torch\.int32"):
        StatefulDataLoader.from_storage(
            wide, device="cpu", local_batch_size=1, sequence_length=2, window_dtype=torch.float32
        )
    with pytest.raises(ValueError, match="applies to token windows"):
        StatefulDataLoader.from_storage(
            make_documents(tmp_path / "documents"), device="cpu", local_batch_size=1, window_dtype=torch.int32
        )
