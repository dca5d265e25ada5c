"""Mixtures through the loader: order, proportions, schedules, exact and elastic resume, documents."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from guideloom import (
    DocumentJsonFormat,
    DocumentMsgpackFormat,
    DocumentStorage,
    Mixture,
    StatefulDataLoader,
    StateMismatchError,
    TokenStorage,
)
from guideloom._mixture.mixture_order import MixtureOrder
from guideloom._mixture.schedule import parse_schedule
from tests.helpers.batches import comparable

S = 4  # tokens per window
SPAN = 100_000  # component k's tokens are k * SPAN + their position in its stream
WINDOWS = {"web": 50, "code": 13, "math": 7}
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}


def write_tokens(path: Path, component: int, windows: int, shards: int = 2) -> TokenStorage:
    """A token storage whose window ``w`` starts with token ``component * SPAN + w * S``."""
    stream = component * SPAN + np.arange(windows * S, dtype=np.uint32)
    storage = TokenStorage(path)
    with storage.sync_writer() as writer:
        for shard, part in enumerate(np.array_split(stream, shards)):
            writer.append(shard, part)
    return storage


@pytest.fixture(scope="module")
def components(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TokenStorage]:
    root = tmp_path_factory.mktemp("mixture")
    return {name: write_tokens(root / name, k, count) for k, (name, count) in enumerate(WINDOWS.items())}


def samples(batch: torch.Tensor) -> list[tuple[int, int]]:
    """(component, window) of each row of a batch of token windows."""
    return [(first // SPAN, first % SPAN // S) for first in batch[:, 0].tolist()]


def loader_of(mixture: Mixture, **options: Any) -> StatefulDataLoader:
    settings: dict[str, Any] = {"device": "cpu", "local_batch_size": 3, "sequence_length": S, "seed": 7}
    return StatefulDataLoader.from_storage(mixture, **{**settings, **options})


def expected(mixture: Mixture, count: int, *, shuffle: bool, seed: int = 7, first: int = 0) -> list[tuple[int, int]]:
    """The mixture's global samples ``first .. first + count - 1``, from the pure arithmetic."""
    order = MixtureOrder(mixture.schedule, list(WINDOWS.values()), shuffle=shuffle, seed=seed)
    components, windows = order.locate(np.arange(first, first + count))
    return list(zip(components.tolist(), windows.tolist(), strict=True))


def epochs_of(loader: StatefulDataLoader, epochs: int) -> list[Any]:
    return [batch for _ in range(epochs) for batch in loader]


# --- order and proportions ------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_is_the_mixture_sequence(components: dict[str, TokenStorage], shuffle: bool) -> None:
    mixture = Mixture(components, WEIGHTS, block_size=8)
    with loader_of(mixture, shuffle=shuffle) as loader:
        read = [sample for batch in epochs_of(loader, 2) for sample in samples(batch)]
        count = loader.sample_count
    assert count == MixtureOrder(mixture.schedule, [50, 13, 7], shuffle=shuffle, seed=7).default_samples_per_epoch()
    assert read == expected(mixture, 2 * count, shuffle=shuffle)  # epoch 1 continues the global sequence


def test_an_epoch_located_over_several_announcements_is_the_mixture_sequence(
    components: dict[str, TokenStorage],
) -> None:
    mixture = Mixture(components, WEIGHTS, samples_per_epoch=9_000, block_size=64)  # batch groups span announcements
    with loader_of(mixture, shuffle=True) as loader:
        read = [sample for batch in loader for sample in samples(batch)]
    assert read == expected(mixture, 9_000, shuffle=True)


def test_the_default_epoch_serves_the_first_component_once(components: dict[str, TokenStorage]) -> None:
    with loader_of(Mixture(components, WEIGHTS, block_size=8), shuffle=True) as loader:
        read = [sample for batch in loader for sample in samples(batch)][: loader.sample_count]
    web = sorted(window for component, window in read if component == 0)
    assert web == list(range(50)) and read[-1][0] == 0


def test_proportions_hold_in_every_block_of_the_global_order(components: dict[str, TokenStorage]) -> None:
    mixture = Mixture(components, {"web": 1 / 3, "code": 0.001, "math": 2.0}, samples_per_epoch=160, block_size=16)
    with loader_of(mixture, local_batch_size=4, shuffle=True) as loader:
        read = [sample[0] for batch in epochs_of(loader, 3) for sample in samples(batch)]
    blocks = np.array(read).reshape(-1, 16)
    assert len(blocks) == 30
    assert all(np.bincount(block, minlength=3).tolist() == [2, 0, 14] for block in blocks)  # 2.28, 0.007, 13.71


def test_a_schedule_switch_lands_on_its_sample_in_a_later_epoch(components: dict[str, TokenStorage]) -> None:
    schedule = [(0, {"web": 1, "code": 0, "math": 0}), (48, {"web": 0, "code": 0, "math": 1})]
    mixture = Mixture(components, schedule, samples_per_epoch=30, block_size=8)
    with loader_of(mixture, local_batch_size=5) as loader:
        read = [sample[0] for batch in epochs_of(loader, 3) for sample in samples(batch)]
    assert read == [0] * 48 + [2] * 42


# --- resume ---------------------------------------------------------------------------------------------


def assert_resumes_after_every_step(make: Callable[[], StatefulDataLoader], epochs: int = 2) -> None:
    """A loader rebuilt from the state after every batch yields exactly the uninterrupted run's batches."""
    with make() as loader:
        uninterrupted = [comparable(batch) for batch in epochs_of(loader, epochs)]
        steps_per_epoch = len(loader)
    with make() as loader:
        state = loader.state_dict()
    resumed = []
    for _ in range(epochs * steps_per_epoch):
        with make() as loader:
            loader.load_state_dict(json.loads(json.dumps(state)))
            resumed.append(comparable(next(iter(loader))))
            state = loader.state_dict()
    assert resumed == uninterrupted


def tagging_collate(records: list[Any]) -> list[Any]:
    return [record if isinstance(record, dict) else {"value": record} for record in records]


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DocumentStorage[Any, Any]]:
    """Two document storages in different formats, every record naming its storage and number."""
    root = tmp_path_factory.mktemp("documents")
    made: dict[str, DocumentStorage[Any, Any]] = {}
    for name, format, count in (("json", DocumentJsonFormat(), 11), ("msgpack", DocumentMsgpackFormat(), 5)):
        made[name] = DocumentStorage(root / name, format)
        with made[name].sync_writer() as writer:
            for number in range(count):
                writer.append(number % 2, {"from": name, "number": number})
    return made


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_token_mixture_resumes_after_every_step(
    components: dict[str, TokenStorage], num_workers: int, shuffle: bool
) -> None:
    mixture = Mixture(components, WEIGHTS, samples_per_epoch=40, block_size=8)
    assert_resumes_after_every_step(lambda: loader_of(mixture, shuffle=shuffle, num_workers=num_workers))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_document_mixture_resumes_after_every_step(
    documents: dict[str, DocumentStorage[Any, Any]], num_workers: int, shuffle: bool
) -> None:
    mixture = Mixture(documents, {"json": 2, "msgpack": 1}, samples_per_epoch=20, block_size=6)
    assert_resumes_after_every_step(
        lambda: StatefulDataLoader.from_storage(
            mixture, tagging_collate, device="cpu", local_batch_size=4, shuffle=shuffle, num_workers=num_workers
        )
    )


def test_records_of_several_formats_share_a_batch(documents: dict[str, DocumentStorage[Any, Any]]) -> None:
    mixture = Mixture(documents, {"json": 1, "msgpack": 1}, samples_per_epoch=16, block_size=4)
    seen: list[list[Any]] = []
    with StatefulDataLoader.from_storage(
        mixture, seen.append, device="cpu", local_batch_size=4, shuffle=True
    ) as loader:
        list(loader)
    assert all(sorted(record["from"] for record in batch) == ["json", "json", "msgpack", "msgpack"] for batch in seen)


# --- elastic resume -------------------------------------------------------------------------------------


def read_ranks(mixture: Mixture, world_size: int, state: Any, steps: int | None) -> tuple[list[Any], Any]:
    """``steps`` global batches (the rest of the epoch if None) read by ``world_size`` ranks; the state after."""
    loaders = [
        loader_of(mixture, shuffle=True, rank=rank, world_size=world_size, local_batch_size=2)
        for rank in range(world_size)
    ]
    iterators: list[Iterator[Any]] = []
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        iterators.append(iter(loader))
    read: list[Any] = []
    try:
        for _ in range(steps if steps is not None else len(loaders[0])):
            batches = [next(iterator, None) for iterator in iterators]
            if batches[0] is None:
                break
            read += [sample for batch in batches for sample in samples(batch)]  # rank by rank: the global order
        return read, loaders[0].state_dict()
    finally:
        for loader in loaders:
            loader.close()


def test_elastic_resume_from_4_to_2_to_3_ranks_loses_and_repeats_nothing(components: dict[str, TokenStorage]) -> None:
    mixture = Mixture(components, WEIGHTS, samples_per_epoch=97, block_size=8)
    first, state = read_ranks(mixture, 4, None, 3)
    second, state = read_ranks(mixture, 2, state, 5)
    third, _ = read_ranks(mixture, 3, state, None)
    assert (len(first), len(second)) == (24, 20)
    whole = expected(mixture, 97, shuffle=True)
    assert first + second + third[: 97 - 44] == whole
    assert third[97 - 44 :] == whole[: -53 % 3]  # only the wrap-around padding of the last batch repeats


# --- schedules on resume --------------------------------------------------------------------------------

STAGES = [(0, {"web": 1, "code": 1, "math": 0}), (64, {"web": 1, "code": 0, "math": 1})]


def test_a_resumed_loader_may_change_the_schedule_from_its_position_on(components: dict[str, TokenStorage]) -> None:
    with loader_of(Mixture(components, STAGES, block_size=8), local_batch_size=8) as loader:
        iterator = iter(loader)
        for _ in range(4):
            next(iterator)
        state = loader.state_dict()
    changed = [STAGES[0], (32, {"web": 0, "code": 0, "math": 1})]
    with loader_of(Mixture(components, changed, block_size=8), local_batch_size=8) as loader:
        loader.load_state_dict(state)
        after = [sample[0] for sample in samples(next(iter(loader)))]
    assert after == [2] * 8


def test_a_schedule_changed_before_the_position_is_refused(components: dict[str, TokenStorage]) -> None:
    with loader_of(Mixture(components, STAGES, block_size=8), local_batch_size=8) as loader:
        iterator = iter(loader)
        for _ in range(4):
            next(iterator)
        state = loader.state_dict()
    changed = [STAGES[0], (24, {"web": 0, "code": 0, "math": 1})]
    with loader_of(Mixture(components, changed, block_size=8), local_batch_size=8) as loader:
        with pytest.raises(StateMismatchError, match="weights in force at global sample 24 differ"):
            loader.load_state_dict(state)


def test_another_seed_or_components_is_refused(components: dict[str, TokenStorage]) -> None:
    with loader_of(Mixture(components, WEIGHTS)) as loader:
        state = loader.state_dict()
    with loader_of(Mixture(components, WEIGHTS), seed=8) as loader, pytest.raises(StateMismatchError, match="seed"):
        loader.load_state_dict(state)
    fewer = {name: components[name] for name in ("web", "code")}
    with loader_of(Mixture(fewer, {"web": 1, "code": 1})) as loader:
        with pytest.raises(StateMismatchError, match="mixture of \\['web', 'code', 'math'\\]"):
            loader.load_state_dict(state)


# --- arguments ------------------------------------------------------------------------------------------


def test_mixture_arguments_are_checked(
    components: dict[str, TokenStorage], documents: dict[str, DocumentStorage[Any, Any]]
) -> None:
    with pytest.raises(ValueError, match="all TokenStorage or all DocumentStorage"):
        Mixture({"web": components["web"], "json": documents["json"]}, {"web": 1, "json": 1})
    with pytest.raises(TypeError, match="components\\['x'\\] must be a TokenStorage or a DocumentStorage"):
        Mixture({"x": "path"}, {"x": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="must name exactly the components"):
        Mixture(components, {"web": 1})
    with pytest.raises(ValueError, match="samples_per_epoch must be >= 1"):
        Mixture(components, WEIGHTS, samples_per_epoch=0)
    with pytest.raises(ValueError, match="sequence_length is required"):
        StatefulDataLoader.from_storage(Mixture(components, WEIGHTS), device="cpu", local_batch_size=2)


def test_a_component_with_a_share_but_no_samples_is_refused(tmp_path: Path) -> None:
    tiny = write_tokens(tmp_path / "tiny", 0, 1, shards=1)
    with pytest.raises(ValueError, match="no samples"):
        loader_of(Mixture({"tiny": tiny}, {"tiny": 1}), sequence_length=100)


def test_parse_schedule_is_what_a_mixture_uses(components: dict[str, TokenStorage]) -> None:
    mixture = Mixture(components, weights=STAGES, block_size=8)
    assert mixture.schedule.to_json() == parse_schedule(tuple(WINDOWS), None, STAGES, 8).to_json()


# --- window modes inside a mixture ----------------------------------------------------------------------

MODES = [{"document_boundaries": True}, {"pack_documents": True, "pad_id": 7}]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_window_modes_inside_a_mixture_resume_after_every_step(
    components: dict[str, TokenStorage], mode: dict[str, Any], num_workers: int
) -> None:
    mixture = Mixture(components, WEIGHTS, samples_per_epoch=30, block_size=8)
    assert_resumes_after_every_step(lambda: loader_of(mixture, shuffle=True, num_workers=num_workers, **mode))


def test_document_boundaries_in_a_mixture_keep_the_mixtures_windows(components: dict[str, TokenStorage]) -> None:
    mixture = Mixture(components, WEIGHTS, samples_per_epoch=30, block_size=8)
    with loader_of(mixture, shuffle=True) as plain, loader_of(mixture, shuffle=True, document_boundaries=True) as aware:
        for windows, batch in zip(plain, aware, strict=True):
            assert set(batch) == {"input_ids", "position_ids", "labels", "cu_seqlens", "max_seqlen"}
            assert batch["input_ids"].tolist() == windows.tolist()
            assert int(batch["cu_seqlens"][-1]) == windows.numel()


def test_fetch_gives_the_same_samples_whether_or_not_they_were_announced(components: dict[str, TokenStorage]) -> None:
    from guideloom._loading.make_source import make_source

    mixture = Mixture(components, WEIGHTS, samples_per_epoch=700, block_size=8)
    source = make_source(mixture, sequence_length=S, shuffle=True, seed=7)
    positions = np.array([3, 650, 699, 700, 701, 17, 300])  # 700 and 701 are padding: they wrap around
    cold = source.fetch(positions, 2).tolist()
    source.prefetch(np.arange(710)[::-1], 1)
    assert source.fetch(positions, 2).tolist() == cold  # another epoch's announcement is not used
    source.prefetch(np.arange(710)[::-1], 2)  # the first positions are located now, the rest when needed
    assert source.fetch(positions[5:], 2).tolist() == cold[5:]
    assert source.fetch(positions, 2).tolist() == cold
    assert source.fetch(np.array([], np.int64), 2).shape == (0, S)
    source.close()


def test_every_token_of_a_mixed_window_is_its_components_even_across_shards(tmp_path: Path) -> None:
    storages = {
        name: write_tokens(tmp_path / name, k, windows, shards=5) for k, (name, windows) in enumerate(WINDOWS.items())
    }
    loader = loader_of(Mixture(storages, WEIGHTS), local_batch_size=16, shuffle=True)
    for batch in loader:
        starts = torch.tensor([component * SPAN + window * S for component, window in samples(batch)])
        assert torch.equal(batch, starts[:, None] + torch.arange(S))


def test_changed_first_weights_are_named_before_the_epoch_length_they_change(
    components: dict[str, TokenStorage],
) -> None:
    with loader_of(Mixture(components, WEIGHTS, block_size=8)) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with loader_of(Mixture(components, {"web": 1, "code": 1, "math": 1}, block_size=8)) as loader:
        with pytest.raises(StateMismatchError, match="weights in force at global sample 0 differ"):
            loader.load_state_dict(state)


@pytest.mark.parametrize("damage", [{"components": [["web"]]}, {"schedule": "x"}, {"samples_per_epoch": -1}])
def test_a_damaged_mixture_state_is_refused(components: dict[str, TokenStorage], damage: dict[str, Any]) -> None:
    with loader_of(Mixture(components, WEIGHTS, block_size=8)) as loader:
        state = loader.state_dict()
        state["source"].update(damage)
        with pytest.raises(StateMismatchError, match="not"):
            loader.load_state_dict(state)
