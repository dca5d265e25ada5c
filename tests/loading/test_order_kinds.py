"""The order an epoch is read in is chosen once, from the settings and the source's type: a storage's permutation, a
mixture's own order, the windowed order of a storage's shards, or a windowed mixture's machine slots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from guideloom import Mixture
from guideloom._loading.make_source import make_source
from guideloom._loading.orders import choose_order
from guideloom._loading.settings import OrderKind
from guideloom._sources.describe import SamplePieces
from tests.helpers.storages import make_token_storage


@pytest.fixture
def storage(tmp_path: Path) -> object:
    return make_token_storage(tmp_path / "tokens")


@pytest.fixture
def mixture(tmp_path: Path) -> object:
    components = {"a": make_token_storage(tmp_path / "a"), "b": make_token_storage(tmp_path / "b", seed=1)}
    return Mixture(components, {"a": 0.5, "b": 0.5})


@pytest.mark.parametrize(
    ("shuffle", "window", "kind"),
    [(False, None, OrderKind.PERMUTATION), (True, None, OrderKind.PERMUTATION), (True, 2, OrderKind.WINDOWED)],
)
def test_a_storage_is_read_in_its_permutation_or_windowed(
    storage: object, shuffle: bool, window: int | None, kind: OrderKind
) -> None:
    source = make_source(storage, sequence_length=8)
    assert choose_order(source, shuffle, window) is kind
    source.close()


@pytest.mark.parametrize(
    ("shuffle", "window", "kind"),
    [(False, None, OrderKind.SOURCE), (True, None, OrderKind.SOURCE), (True, 2, OrderKind.MACHINE_SLOTS)],
)
def test_a_mixture_is_read_in_its_own_order_or_in_machine_slots(
    mixture: object, shuffle: bool, window: int | None, kind: OrderKind
) -> None:
    source = make_source(mixture, sequence_length=8, shuffle=shuffle)
    assert choose_order(source, shuffle, window) is kind
    source.close()


class _Unshardable:
    """A source whose samples are not cut shard by shard (it offers no shard_sample_counts)."""

    sample_count, orders_itself, sample_bytes = 4, False, 0

    def fetch(self, indices: np.ndarray, epoch: int) -> list[int]:
        return indices.tolist()  # type: ignore[no-any-return]

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        raise NotImplementedError

    def __repr__(self) -> str:
        return "four numbers"


def test_a_windowed_order_of_a_source_not_cut_shard_by_shard_is_refused() -> None:
    with pytest.raises(ValueError, match=r"shuffle_window=2 cannot read four numbers: its samples are not cut shard"):
        choose_order(_Unshardable(), True, 2)  # type: ignore[arg-type]
    assert choose_order(_Unshardable(), True, None) is OrderKind.PERMUTATION  # type: ignore[arg-type]
