"""A mixture with shuffle_window: each machine blends the components, each component read in its machine's share."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader
from guideloom._loading.reopen import loader_from_state
from guideloom._mixture.mixture import Mixture
from tests.helpers.batches import assert_resumes_exactly, take
from tests.helpers.storages import make_token_storage as make_tokens
from tests.loading.test_windowed_loader import flat, loaders, read_in_lockstep

A_SHARDS, A_PER_SHARD = 10, 10  # component "a": ids 0..99
B_SHARDS, B_PER_SHARD = 8, 6  # component "b": ids 1000..1047
B_FIRST = 1000


def make_component(path: Path, shards: int, per_shard: int, first: int) -> DocumentStorage[Any, Any]:
    storage = DocumentStorage(path, DocumentJsonFormat())
    with storage.sync_writer() as writer:
        for index in range(shards * per_shard):
            writer.append(index // per_shard, {"id": first + index})
    return storage


def make_mixture(tmp_path: Path, samples_per_epoch: int = 96) -> Mixture:
    a = make_component(tmp_path / "a", A_SHARDS, A_PER_SHARD, 0)
    b = make_component(tmp_path / "b", B_SHARDS, B_PER_SHARD, B_FIRST)
    return Mixture({"a": a, "b": b}, {"a": 1, "b": 1}, samples_per_epoch=samples_per_epoch, block_size=8)


def shard_of(record: int) -> tuple[str, int]:
    return ("b", (record - B_FIRST) // B_PER_SHARD) if record >= B_FIRST else ("a", record // A_PER_SHARD)


def read_epochs(ranks: list[StatefulDataLoader], epochs: int) -> list[list[list[int]]]:
    """Each rank's batches over the rest of this epoch and ``epochs - 1`` more, read in lockstep."""
    batches: list[list[list[int]]] = [[] for _ in ranks]
    for _ in range(epochs):
        for rank, read in enumerate(read_in_lockstep(ranks)):
            batches[rank] += read
    return batches


def machine_reads(batches: list[list[list[int]]], ranks_per_machine: int) -> list[list[int]]:
    """Each machine's records in the order it reads them: step by step, its ranks in turn."""
    machines = len(batches) // ranks_per_machine
    return [flat(batches[m * ranks_per_machine : (m + 1) * ranks_per_machine]) for m in range(machines)]


def passes_of(reads: list[int], component: str, shares: list[int]) -> list[list[int]]:
    """One machine's records of ``component``, cut into its shares of the component's passes."""
    mine = [record for record in reads if shard_of(record)[0] == component]
    share = shares[0]
    return [mine[start : start + share] for start in range(0, len(mine) - share + 1, share)]


def test_each_pass_of_each_component_is_read_once_over_the_machines_each_its_share(tmp_path: Path) -> None:
    ranks = loaders(make_mixture(tmp_path), 4, local_world_size=2, local_batch_size=4, drop_last=True)
    batches = read_epochs(ranks, 3)
    assert len({len(rank) for rank in batches}) == 1
    reads = machine_reads(batches, 2)
    for component, size, first in (("a", 100, 0), ("b", 48, B_FIRST)):
        shares = [size // 2, size // 2]  # each machine reads half of every pass
        per_machine = [passes_of(machine, component, shares) for machine in reads]
        complete = min(len(passes) for passes in per_machine)
        assert complete >= 1
        for number in range(complete):
            read = [record for passes in per_machine for record in passes[number]]
            assert sorted(read) == list(range(first, first + size))
            shards = [{shard_of(record) for record in passes[number]} for passes in per_machine]
            assert len(shards[0] & shards[1]) <= 1  # disjoint shares, but for a shard cut between them


def test_a_machine_holds_few_shards_of_a_component_at_a_time(tmp_path: Path) -> None:
    ranks = loaders(make_mixture(tmp_path), 2, local_world_size=2, local_batch_size=4, shuffle_window=2)
    (reads,) = machine_reads(read_in_lockstep(ranks), 2)
    a_shards = [shard_of(record) for record in reads if record < B_FIRST]
    for start in range(0, len(a_shards) - 8, 8):
        assert len(set(a_shards[start : start + 8])) <= 4  # a window of 2, the shard ending and the next starting


def test_a_windowed_mixture_resumes_bit_for_bit(tmp_path: Path) -> None:
    a, b = make_tokens(tmp_path / "a", (9, 7, 11, 5)), make_tokens(tmp_path / "b", (6, 8, 10), seed=1)
    mixture = Mixture({"a": a, "b": b}, {"a": 2, "b": 1}, samples_per_epoch=40, block_size=8)

    def open_loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            mixture, device="cpu", local_batch_size=3, sequence_length=9, shuffle=True, shuffle_window=2, seed=7
        )

    assert_resumes_exactly(open_loader, 30, [1, 6, 13, 14], lambda batch: batch.tolist())


def test_a_windowed_mixture_reads_the_same_with_workers(tmp_path: Path) -> None:
    a, b = make_tokens(tmp_path / "a", (9, 7, 11, 5)), make_tokens(tmp_path / "b", (6, 8, 10), seed=1)
    mixture = Mixture({"a": a, "b": b}, {"a": 1, "b": 1}, samples_per_epoch=30, block_size=8)
    options: dict[str, Any] = {"local_batch_size": 3, "sequence_length": 9, "shuffle": True, "shuffle_window": 2}
    with StatefulDataLoader.from_storage(mixture, device="cpu", **options) as loader:
        inline = [batch.tolist() for batch in loader]
    with StatefulDataLoader.from_storage(mixture, device="cpu", num_workers=2, **options) as loader:
        assert [batch.tolist() for batch in loader] == inline


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"world_size": 4, "local_world_size": 2}, {"world_size": 2, "local_world_size": 1, "local_batch_size": 3}),
        ({"world_size": 4, "local_world_size": 2}, {"world_size": 1, "local_world_size": 1, "local_batch_size": 4}),
        ({"world_size": 2, "local_world_size": 1}, {"world_size": 3, "local_world_size": 1, "local_batch_size": 4}),
    ],
)
def test_an_elastic_resume_reads_each_epoch_as_the_unbroken_run_does(
    tmp_path: Path, before: dict[str, int], after: dict[str, int]
) -> None:
    mixture = make_mixture(tmp_path)
    unbroken = flat(read_epochs(loaders(mixture, before["world_size"], **_rest(before)), 2))
    first = loaders(mixture, before["world_size"], **_rest(before))
    read = flat(read_in_lockstep(first, steps=3))
    state = json.loads(json.dumps(first[0].state_dict()))
    second = loaders(mixture, after["world_size"], **_rest(after))
    for loader in second:
        loader.load_state_dict(state)
    read += flat(read_epochs(second, 2))
    for epoch in (0, 1):  # the same records as often in each epoch: the run's machine shares are kept
        assert Counter(read[epoch * 96 : (epoch + 1) * 96]) == Counter(unbroken[epoch * 96 : (epoch + 1) * 96])


def _rest(options: dict[str, int]) -> dict[str, int]:
    return {key: value for key, value in options.items() if key != "world_size"}


def test_skip_and_explain_agree_with_reading(tmp_path: Path) -> None:
    mixture = make_mixture(tmp_path)
    (reader,) = loaders(mixture, 1, local_batch_size=4)
    unbroken = [take(reader, 30, lambda batch: [record["id"] for record in batch])][0]
    (skipper,) = loaders(mixture, 1, local_batch_size=4)
    skipper.skip(11)
    described = skipper.explain(19)
    explained = [[shard_of_piece(sample) for sample in batch["samples"]] for batch in described]
    assert explained == [[shard_of(record) for record in batch] for batch in unbroken[11:]]
    assert take(skipper, 19, lambda batch: [record["id"] for record in batch]) == unbroken[11:]


def shard_of_piece(sample: dict[str, Any]) -> tuple[str, int]:
    (piece,) = sample["pieces"]
    return sample["component"], int(piece["shard"])


def test_a_windowed_mixture_state_is_explained_from_the_state_alone(tmp_path: Path) -> None:
    ranks = loaders(make_mixture(tmp_path), 4, local_world_size=2)
    read_in_lockstep(ranks, steps=3)
    state = json.loads(json.dumps(ranks[0].state_dict()))
    expected = ranks[3].explain(4)
    with loader_from_state(state, rank=3) as reopened:
        assert reopened.explain(4) == expected


def test_a_resumed_windowed_mixture_may_change_the_schedule_after_its_position(tmp_path: Path) -> None:
    a = make_component(tmp_path / "a", A_SHARDS, A_PER_SHARD, 0)
    b = make_component(tmp_path / "b", B_SHARDS, B_PER_SHARD, B_FIRST)
    state_at = 97 + 64  # epoch 1 (24 whole steps of 2 ranks × 2 each), position 64: an epoch split unevenly by 2
    stages = [(0, {"a": 1, "b": 1}), (168, {"a": 0, "b": 1})]  # the first block of 8 after the state's position

    def open_ranks(weights: list[tuple[int, dict[str, int]]]) -> list[StatefulDataLoader]:
        mixture = Mixture({"a": a, "b": b}, weights, samples_per_epoch=97, block_size=8)
        return loaders(mixture, 2, local_world_size=1, drop_last=True)

    def ids_of(batch: list[dict[str, int]]) -> list[int]:
        return [record["id"] for record in batch]

    expected = [take(loader, 70, ids_of) for loader in open_ranks(stages)]
    before = open_ranks(stages[:1])
    read = [take(loader, 40, ids_of) for loader in before]
    state = json.loads(json.dumps(before[0].state_dict()))
    assert state["epoch"] * 97 + state["position"] == state_at
    after = open_ranks(stages)
    for loader in after:
        loader.load_state_dict(state)
    read = [mine + take(loader, 30, ids_of) for mine, loader in zip(read, after, strict=True)]
    assert read == expected
    assert all(record >= B_FIRST for rank in read for batch in rank[-10:] for record in batch)
