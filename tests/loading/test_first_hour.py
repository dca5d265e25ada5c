"""What a new user hit in the first hour: every batch type a collate returns works, every mistake names its cause."""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_sequence
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader, StateMismatchError, TokenStorage

RECORDS = 12


def make_documents(path: Path, count: int = RECORDS) -> DocumentStorage[Any, Any]:
    storage = DocumentStorage(path, DocumentJsonFormat())
    with storage.sync_writer() as writer:
        for index in range(count):
            writer.append(index * 3 // count, {"id": index})
    return storage


def make_tokens(path: Path, shards: int = 3) -> TokenStorage:
    storage = TokenStorage(path)
    with storage.sync_writer() as writer:
        for shard in range(shards):
            writer.append(shard, list(range(shard * 10, shard * 10 + 7)))
    return storage


class Pair(NamedTuple):
    ids: torch.Tensor
    name: str


@dataclasses.dataclass
class Fields:
    ids: torch.Tensor
    count: int


@dataclasses.dataclass(frozen=True)
class FrozenFields:
    ids: torch.Tensor
    names: list[str]


def ids_of(samples: list[dict[str, int]]) -> torch.Tensor:
    return torch.tensor([sample["id"] for sample in samples])


def make_defaultdict(samples: list[dict[str, int]]) -> collections.defaultdict[str, Any]:
    batch: collections.defaultdict[str, Any] = collections.defaultdict(list)
    batch["ids"] = ids_of(samples)
    return batch


COLLATES: dict[str, Any] = {
    "tensor": ids_of,
    "dict": lambda samples: {"ids": ids_of(samples), "name": "batch", "size": len(samples)},
    "list": lambda samples: [ids_of(samples), "batch", 3],
    "tuple": lambda samples: (ids_of(samples), ids_of(samples) * 2),
    "namedtuple": lambda samples: Pair(ids_of(samples), "batch"),
    "nested": lambda samples: {"inner": [(ids_of(samples), {"deeper": ids_of(samples) + 1})], "none": None},
    "defaultdict": make_defaultdict,
    "ordereddict": lambda samples: collections.OrderedDict([("b", ids_of(samples)), ("a", "text")]),
    "packed": lambda samples: pack_sequence([torch.arange(sample["id"] % 4 + 1.0) for sample in samples], False),
    "dataclass": lambda samples: Fields(ids_of(samples), len(samples)),
    "frozen dataclass": lambda samples: FrozenFields(ids_of(samples), ["a", "b"]),
    "strings and ints": lambda samples: ["a", 1, b"bytes", 2.5],
}


def assert_same(got: Any, expected: Any) -> None:
    """Equal values of the same types, containers and tensors alike, all the way down."""
    assert type(got) is type(expected), f"{type(got).__name__} instead of {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same(got[key], expected[key])
        assert getattr(got, "default_factory", None) is getattr(expected, "default_factory", None)
    elif isinstance(expected, list | tuple):
        assert len(got) == len(expected)
        for mine, theirs in zip(got, expected, strict=True):
            assert_same(mine, theirs)
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            assert_same(getattr(got, field.name), getattr(expected, field.name))
    else:
        assert got == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", list(COLLATES))
def test_every_batch_type_a_collate_returns_arrives_unchanged(tmp_path: Path, kind: str, num_workers: int) -> None:
    storage = make_documents(tmp_path)
    collate = COLLATES[kind]
    with storage.sync_reader() as reader:
        expected = [collate([reader.read(index) for index in range(start, start + 3)]) for start in (0, 3, 6, 9)]
    with StatefulDataLoader.from_storage(
        storage, collate, device="cpu", local_batch_size=3, num_workers=num_workers
    ) as loader:
        got = list(loader)
    assert len(got) == len(expected)
    for batch, reference in zip(got, expected, strict=True):
        assert_same(batch, reference)


def test_a_packed_sequence_moves_as_a_whole_and_keeps_batch_sizes_on_the_cpu(tmp_path: Path) -> None:
    storage = make_documents(tmp_path)
    with StatefulDataLoader.from_storage(storage, COLLATES["packed"], device="meta", local_batch_size=3) as loader:
        batch = next(iter(loader))
    assert isinstance(batch, PackedSequence)
    assert batch.data.device.type == "meta" and batch.batch_sizes.device.type == "cpu"


def test_sequence_length_beyond_the_whole_storage_names_both(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    with pytest.raises(ValueError) as caught:
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=100)
    assert str(caught.value) == (
        f"the storage at {tmp_path} has no samples to load: sequence_length=100 is longer than its 21 tokens"
    )


def test_a_state_of_another_sequence_length_names_sequence_length(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=4) as loader:
        state = loader.state_dict()
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=3) as loader:
        with pytest.raises(StateMismatchError) as caught:
            loader.load_state_dict(state)
    assert str(caught.value) == "the state was taken with sequence_length=4, but this loader has sequence_length=3"


def test_a_state_whose_shard_is_gone_names_the_shard(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path)
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
    with StatefulDataLoader.from_storage(make_documents(tmp_path / "a"), device="cpu", local_batch_size=2) as loader:
        state = loader.state_dict()
    other = make_documents(tmp_path / "b", count=RECORDS + 1)
    with StatefulDataLoader.from_storage(other, device="cpu", local_batch_size=2) as loader:
        with pytest.raises(StateMismatchError) as caught:
            loader.load_state_dict(state)
    assert str(caught.value) == (
        f"the state was taken from another storage: it read shards 0-2 of the storage at {tmp_path / 'a'}, "
        f"and shards 0-2 of the storage at {tmp_path / 'b'} hold other contents (rewritten, or another storage)"
    )


def test_an_empty_state_says_the_key_is_missing(tmp_path: Path) -> None:
    with StatefulDataLoader.from_storage(make_documents(tmp_path), device="cpu", local_batch_size=2) as loader:
        with pytest.raises(StateMismatchError) as caught:
            loader.load_state_dict({})
    assert str(caught.value) == "not a guideloom loader state: the 'guideloom_loader_state' key is missing"


class TwoArguments(Exception):
    def __init__(self, record: int, reason: str) -> None:
        super().__init__(f"record {record}: {reason}")
        self.record = record


def collate_with_two_argument_error(samples: list[dict[str, int]]) -> Any:
    raise TwoArguments(samples[0]["id"], "refused")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_error_with_two_constructor_arguments_keeps_its_type(tmp_path: Path, num_workers: int) -> None:
    storage = make_documents(tmp_path)
    with StatefulDataLoader.from_storage(
        storage, collate_with_two_argument_error, device="cpu", local_batch_size=2, num_workers=num_workers
    ) as loader:
        with pytest.raises(TwoArguments, match="record 0: refused") as caught:
            next(iter(loader))
    assert caught.value.record == 0
    if num_workers:  # the worker's traceback is in the message
        assert "collate_with_two_argument_error" in str(caught.value)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cuda:99", "device is 'cuda:99', but CUDA is not available on this machine"),
        ("no-such-device", "device must be a torch.device or a device string"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_at_construction(tmp_path: Path, device: str, message: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        message = f"device is 'cuda:99', but this machine has {torch.cuda.device_count()} CUDA device(s)"
    storage = make_documents(tmp_path)
    with pytest.raises(ValueError) as caught:
        StatefulDataLoader.from_storage(storage, device=device, local_batch_size=2)
    assert str(caught.value).startswith(message)


def test_a_misspelt_dtype_lists_the_token_dtypes(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as caught:
        TokenStorage(tmp_path, dtype="unit16")
    assert (
        str(caught.value)
        == "dtype must be one of uint8, uint16, uint32, uint64, int8, int16, int32, int64, got 'unit16'"
    )


def sleeping_collate(samples: list[dict[str, int]]) -> Any:
    time.sleep(600)
    return samples


@pytest.mark.timeout(60)
def test_close_after_a_timeout_stops_a_busy_worker_at_once(tmp_path: Path) -> None:
    storage = make_documents(tmp_path)
    before = _children()
    loader = StatefulDataLoader.from_storage(
        storage, sleeping_collate, device="cpu", local_batch_size=2, num_workers=1, timeout=1
    )
    with pytest.raises(RuntimeError, match="timed out"):
        next(iter(loader))
    workers = _children() - before  # this loader's own workers, not what earlier tests left running
    assert workers
    started = time.monotonic()
    loader.close()
    # torch itself would give the busy worker MP_STATUS_CHECK_INTERVAL seconds before terminating it
    assert time.monotonic() - started < MP_STATUS_CHECK_INTERVAL
    assert not any(Path(f"/proc/{pid}").exists() and "Z" not in _state_of(pid) for pid in workers)


def _children() -> set[int]:
    return {int(pid) for pid in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()}


def _state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"sequence_length": 8.0}, "sequence_length must be an int, got float"),
        ({"local_batch_size": 2.0}, "local_batch_size must be an int, got float"),
        ({"window_dtype": "int32"}, "window_dtype must be torch.int64 or torch.int32, got str"),
        ({"timeout": "1"}, "timeout must be a number, got str"),
    ],
)
def test_an_argument_of_the_wrong_type_is_a_type_error_naming_it(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 2, "sequence_length": 4, **arguments}
    with pytest.raises(TypeError) as caught:
        StatefulDataLoader.from_storage(make_tokens(tmp_path), **options)
    assert str(caught.value) == message
