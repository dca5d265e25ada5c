"""Batches by budget: ``batch_tokens=N`` gives batches of consecutive records whose lengths sum to at most N."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from guideloom import DocumentJsonFormat, DocumentStorage, Mixture, StatefulDataLoader
from guideloom._loading.reopen import loader_from_state
from tests.cli.test_explain_command import run
from tests.documents.records import ids, make_sized_records, record_lengths
from tests.helpers.batches import assert_resumes_exactly, take
from tests.helpers.storages import make_token_storage

LENGTHS = record_lengths(97)
BUDGET = 100


@pytest.fixture
def storage(tmp_path: Path) -> DocumentStorage[Any, Any]:
    return make_sized_records(tmp_path / "records", LENGTHS)


def loader_of(storage: Any, **options: Any) -> StatefulDataLoader:
    settings: dict[str, Any] = {"batch_tokens": BUDGET, "shuffle": True, "seed": 5, **options}
    return StatefulDataLoader.from_storage(storage, ids, device="cpu", **settings)


def test_an_epoch_reads_every_record_once_in_batches_within_the_budget(storage: DocumentStorage[Any, Any]) -> None:
    with loader_of(storage) as loader:
        batches = list(loader)
        assert len(loader) == len(batches)
    assert sorted(i for batch in batches for i in batch) == list(range(len(LENGTHS)))
    for batch in batches:
        assert len(batch) == 1 or sum(LENGTHS[i] for i in batch) <= BUDGET
    # each batch is greedy: the record after it would not have fitted
    read = [i for batch in batches for i in batch]
    ends = [sum(len(batch) for batch in batches[: k + 1]) for k in range(len(batches) - 1)]
    assert all(sum(LENGTHS[i] for i in batches[k]) + LENGTHS[read[end]] > BUDGET for k, end in enumerate(ends))


def test_a_record_longer_than_the_budget_is_a_batch_alone(tmp_path: Path) -> None:
    storage = make_sized_records(tmp_path / "records", [10, 50, 10, 10, 8])
    with StatefulDataLoader.from_storage(storage, ids, device="cpu", batch_tokens=30) as loader:
        assert list(loader) == [[0], [1], [2, 3, 4]]


def test_resuming_at_any_batch_reads_exactly_what_an_unbroken_run_reads(storage: DocumentStorage[Any, Any]) -> None:
    with loader_of(storage) as loader:
        per_epoch = len(loader)
    assert_resumes_exactly(lambda: loader_of(storage), per_epoch + 5, [1, 7, per_epoch - 1, per_epoch + 2], list)


def test_the_state_is_a_few_numbers_and_names_the_budget(storage: DocumentStorage[Any, Any]) -> None:
    with loader_of(storage) as loader:
        take(loader, 3)
        state = loader.state_dict()
    assert state["batch_tokens"] == BUDGET and state["local_batch_size"] is None
    assert len(json.dumps(state)) < 1000


def test_elastic_resume_with_other_ranks_and_budget_loses_and_repeats_nothing(
    storage: DocumentStorage[Any, Any],
) -> None:
    with loader_of(storage) as loader:
        before = [i for batch in take(loader, 6) for i in batch]
        state = loader.state_dict()
    after: list[list[list[int]]] = []
    for rank in range(3):
        with loader_of(storage, batch_tokens=70, rank=rank, world_size=3) as resumed:
            resumed.load_state_dict(state)
            after.append(list(resumed))
    assert len({len(batches) for batches in after}) == 1  # the same number of batches on every rank
    steps = [[i for rank in range(3) for i in after[rank][step]] for step in range(len(after[0]))]
    read = before + [i for step in steps for i in step]
    unpadded = read[: len(LENGTHS)]  # the last step may be padded with the epoch's first records
    assert sorted(unpadded) == list(range(len(LENGTHS)))


def test_worker_processes_give_the_same_batches(storage: DocumentStorage[Any, Any]) -> None:
    with loader_of(storage) as loader:
        expected = take(loader, 12)
    with loader_of(storage, num_workers=2) as loader:
        assert take(loader, 12) == expected


def test_explain_and_skip_name_the_batches_iteration_reads(storage: DocumentStorage[Any, Any]) -> None:
    with loader_of(storage, world_size=2, rank=1) as loader:
        take(loader, 2)
        explained = loader.explain(batches=4)
        batches = take(loader, 4)
    located = [piece["index"] for batch in explained for sample in batch["samples"] for piece in sample["pieces"]]
    assert located == [i for batch in batches for i in batch]
    assert [batch["batch"] for batch in explained] == [2, 3, 4, 5]
    with loader_of(storage, world_size=2, rank=1) as loader:
        loader.skip(2)
        assert take(loader, 4) == batches


def test_skip_crosses_epochs_as_reading_does(storage: DocumentStorage[Any, Any]) -> None:
    with loader_of(storage) as loader:
        per_epoch = len(loader)
        expected = take(loader, per_epoch + 8)[per_epoch + 3 :]
    with loader_of(storage) as loader:
        loader.skip(per_epoch + 3)
        assert take(loader, 5) == expected


def test_drop_last_leaves_out_the_step_that_reaches_the_end(storage: DocumentStorage[Any, Any]) -> None:
    with loader_of(storage, rank=0, world_size=2) as loader:
        kept = list(loader)
    with loader_of(storage, rank=0, world_size=2, drop_last=True) as loader:
        assert list(loader) == kept[:-1]
        assert len(loader) == len(kept) - 1


def test_a_mixture_of_document_storages_batches_by_budget(tmp_path: Path) -> None:
    small = make_sized_records(tmp_path / "small", record_lengths(30, seed=1, longest=20))
    large = make_sized_records(tmp_path / "large", record_lengths(30, seed=2), first_id=1000)
    lengths = dict(enumerate(record_lengths(30, seed=1, longest=20))) | {
        1000 + i: n for i, n in enumerate(record_lengths(30, seed=2))
    }
    mixture = Mixture({"small": small, "large": large}, weights={"small": 0.5, "large": 0.5})
    with loader_of(mixture) as loader:
        batches = take(loader, 10)
        state = loader.state_dict()
        expected = take(loader, 5)
    assert all(len(batch) == 1 or sum(lengths[i] for i in batch) <= BUDGET for batch in batches)
    with loader_of(mixture) as resumed:
        resumed.load_state_dict(state)
        assert take(resumed, 5) == expected


def test_batch_tokens_and_local_batch_size_are_exclusive(storage: DocumentStorage[Any, Any]) -> None:
    with pytest.raises(TypeError, match="exactly one of local_batch_size and batch_tokens"):
        StatefulDataLoader.from_storage(storage, ids, device="cpu", local_batch_size=2, batch_tokens=10)
    with pytest.raises(TypeError, match="exactly one of local_batch_size and batch_tokens"):
        StatefulDataLoader.from_storage(storage, ids, device="cpu")


@pytest.mark.parametrize("sequence_length", [9, None])
@pytest.mark.parametrize("mixed", [False, True])
def test_batch_tokens_is_for_records_not_token_windows(
    tmp_path: Path, sequence_length: int | None, mixed: bool
) -> None:
    # Said first: without sequence_length a new user was told to give one, and then that budgets are for documents.
    tokens = make_token_storage(tmp_path / "tokens")
    storage = Mixture({"web": tokens}, {"web": 1.0}) if mixed else tokens
    what = "a mixture of TokenStorages" if mixed else f"the TokenStorage at {tmp_path / 'tokens'}"
    with pytest.raises(ValueError) as caught:
        StatefulDataLoader.from_storage(storage, device="cpu", batch_tokens=64, sequence_length=sequence_length)
    assert str(caught.value) == (
        f"batch_tokens applies to the records of a DocumentStorage (or a mixture of them), not to {what}: "
        "token windows have a fixed length (sequence_length), so batch them with local_batch_size"
    )


def test_a_state_by_budget_reopens_alone_and_explains_the_same_batches(storage: DocumentStorage[Any, Any]) -> None:
    with loader_of(storage, rank=1, world_size=2) as loader:
        take(loader, 3)
        state = json.loads(json.dumps(loader.state_dict()))
        explained = loader.explain(batches=3)
    with loader_from_state(state, rank=1) as reopened:
        assert reopened.batch_tokens == BUDGET and reopened.local_batch_size is None
        assert reopened.explain(batches=3) == explained


def test_guideloom_explain_says_the_batches_are_cut_by_budget(
    storage: DocumentStorage[Any, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with loader_of(storage) as loader:
        take(loader, 2)
        (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
        (batch,) = take(loader, 1)
    status, out, _ = run(capsys, "explain", tmp_path / "state.json", "--batches", 1)
    assert status == 0 and f"batches of records up to {BUDGET} length units on each of 1 rank" in out
    assert out.count(", record ") == len(batch)


def token_count(record: dict[str, Any]) -> int:
    return len(record["tokens"])


def test_budgets_and_packing_count_the_lengths_a_format_recorded(tmp_path: Path) -> None:
    lengths = record_lengths(50, seed=4)
    storage = DocumentStorage(tmp_path / "measured", DocumentJsonFormat(length=token_count))
    with storage.sync_writer() as writer:
        for index, length in enumerate(lengths):
            writer.append(index % 2, {"id": index, "tokens": [7] * length})  # JSON bytes: far more than tokens
    with StatefulDataLoader.from_storage(storage, device="cpu", batch_tokens=BUDGET, shuffle=True) as loader:
        batches = [[record["id"] for record in batch] for batch in loader]
    sizes = [sum(lengths[i] for i in batch) for batch in batches]
    assert all(size <= BUDGET for size in sizes) and sorted(i for batch in batches for i in batch) == list(range(50))
    assert all(size + lengths[batches[k + 1][0]] > BUDGET for k, size in enumerate(sizes[:-1]))  # full by tokens
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=1, pack_documents=True, sequence_length=BUDGET
    ) as loader:
        rows = [[record["id"] for record in batch[0]] for batch in loader]
    assert all(sum(lengths[i] for i in row) <= BUDGET for row in rows) and sum(map(len, rows)) == 50
