"""Batches of every type a collate returns arrive unchanged; a collate error keeps its type; close stops workers."""

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

from guideloom import StatefulDataLoader
from tests.helpers.storages import make_document_storage


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
    storage = make_document_storage(tmp_path, count=12)
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
    storage = make_document_storage(tmp_path, count=12)
    with StatefulDataLoader.from_storage(storage, COLLATES["packed"], device="meta", local_batch_size=3) as loader:
        batch = next(iter(loader))
    assert isinstance(batch, PackedSequence)
    assert batch.data.device.type == "meta" and batch.batch_sizes.device.type == "cpu"


class TwoArguments(Exception):
    def __init__(self, record: int, reason: str) -> None:
        super().__init__(f"record {record}: {reason}")
        self.record = record


def collate_with_two_argument_error(samples: list[dict[str, int]]) -> Any:
    raise TwoArguments(samples[0]["id"], "refused")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_error_with_two_constructor_arguments_keeps_its_type(tmp_path: Path, num_workers: int) -> None:
    storage = make_document_storage(tmp_path, count=12)
    with StatefulDataLoader.from_storage(
        storage, collate_with_two_argument_error, device="cpu", local_batch_size=2, num_workers=num_workers
    ) as loader:
        with pytest.raises(TwoArguments, match="record 0: refused") as caught:
            next(iter(loader))
    assert caught.value.record == 0
    if num_workers:  # the worker's traceback is in the message
        assert "collate_with_two_argument_error" in str(caught.value)


def sleeping_collate(samples: list[dict[str, int]]) -> Any:
    time.sleep(600)
    return samples


@pytest.mark.timeout(60)
def test_close_after_a_timeout_stops_a_busy_worker_at_once(tmp_path: Path) -> None:
    storage = make_document_storage(tmp_path, count=12)
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
