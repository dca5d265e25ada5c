"""Which order an epoch's positions are read in: chosen once per loader (`choose_order`), built here for each epoch.

The kind (`OrderKind`) follows from the settings and the source's type alone: the seeded permutation of 0.3, a
source's own order (a mixture), the windowed shuffle over a source cut shard by shard, or a windowed mixture's
machine slots. Iteration, ``explain``, ``skip`` and the state's next-batch digest all ask `epoch_order`, so they
agree on it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from guideloom._loading.settings import OrderKind, OrderSettings
from guideloom._sampling.epoch_order import EpochOrder
from guideloom._sampling.windowed_order import WindowedOrder
from guideloom._sources.capabilities import InMachineShares, ShardwiseSamples
from guideloom._sources.source import SampleSource

__all__ = ["Order", "choose_order", "epoch_order"]

_RECENT = 4  # windowed epochs kept (their shares and windows cost a pass over the shards to lay out)
_recent: list[tuple[SampleSource, tuple[int, ...], WindowedOrder]] = []


class Order(Protocol):
    def sample_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]: ...

    def sample_at_one(self, position: int) -> int: ...


def choose_order(source: SampleSource, shuffle: bool, shuffle_window: int | None) -> OrderKind:
    """The kind of order a loader with these settings reads ``source`` in (a new loader's, once); ValueError for a
    windowed order of a source whose samples are not cut shard by shard."""
    if shuffle_window is None or not shuffle:
        return OrderKind.SOURCE if source.orders_itself else OrderKind.PERMUTATION
    if isinstance(source, InMachineShares):
        return OrderKind.MACHINE_SLOTS
    if isinstance(source, ShardwiseSamples):
        return OrderKind.WINDOWED
    raise ValueError(
        f"shuffle_window={shuffle_window} cannot read {source}: its samples are not cut shard by shard "
        "(read it with the global order, shuffle_window=None)"
    )


def epoch_order(source: SampleSource, settings: OrderSettings, epoch: int, start: int) -> Order:
    """The order of epoch ``epoch`` of ``source`` from position ``start`` (the start of a global batch).

    A windowed order by budget deals positions out over the machine shares in turn, from 0 on (its global batch is
    one position of each share), and wraps positions past the epoch's end (padding) around to its start.
    """
    kind = settings.kind
    if not kind.windowed:
        shuffle = settings.shuffle and kind is OrderKind.PERMUTATION
        return EpochOrder(source.sample_count, shuffle=shuffle, seed=settings.seed, epoch=epoch)
    if settings.by_budget:
        start, global_batch_size, ranks = 0, settings.streams, settings.streams
    else:
        assert settings.local_batch_size is not None
        global_batch_size, ranks = settings.local_batch_size * settings.world_size, settings.world_size
    if kind is OrderKind.MACHINE_SLOTS:
        order: Order = _machine_slots(source, settings, start, global_batch_size, ranks)
    else:
        order = _windowed(source, settings, epoch, start, global_batch_size, ranks)
    return _Wrapped(order, source.sample_count) if settings.by_budget else order


def _machine_slots(
    source: SampleSource, settings: OrderSettings, start: int, global_batch_size: int, ranks: int
) -> Order:
    """A windowed mixture's order from ``start``: each position's machine slot."""
    assert isinstance(source, InMachineShares)  # (choose_order made sure)
    if source.machines != settings.streams:
        raise RuntimeError(f"{source} is read in {source.machines} machine shares, not {settings.streams}")
    slots = WindowedOrder(
        [source.sample_count],
        seed=0,
        epoch=0,
        window=1,
        streams=source.machines,
        global_batch_size=global_batch_size,
        ranks=ranks,
    )
    return _MachineSlots(slots.at(start, global_batch_size))


def _windowed(
    source: SampleSource, settings: OrderSettings, epoch: int, start: int, global_batch_size: int, ranks: int
) -> Order:
    """The windowed order of ``source`` from ``start`` in global batches of ``global_batch_size``, read by
    ``ranks``."""
    assert settings.shuffle_window is not None
    key = (source.sample_count, settings.seed, epoch, settings.shuffle_window, settings.streams)
    for known, known_key, order in _recent:
        if known is source and known_key == key:
            return order.at(start, global_batch_size, ranks)
    assert isinstance(source, ShardwiseSamples)  # (choose_order made sure)
    order = WindowedOrder(
        source.shard_sample_counts(),
        seed=settings.seed,
        epoch=epoch,
        window=settings.shuffle_window,
        streams=settings.streams,
        global_batch_size=global_batch_size,
        start=start,
        clean_cuts=source.clean_cuts(),
        ranks=ranks,
    )
    _recent.insert(0, (source, key, order))
    del _recent[_RECENT:]
    return order


class _Wrapped:
    """An order read by budget: positions past the epoch's end (padding) wrap around to its start, as the budget
    planner measured them."""

    def __init__(self, order: Order, sample_count: int) -> None:
        self.order, self.sample_count = order, sample_count

    def sample_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        return self.order.sample_at(np.asarray(positions, np.int64) % self.sample_count)

    def sample_at_one(self, position: int) -> int:
        return self.order.sample_at_one(position % self.sample_count)


class _MachineSlots:
    """A windowed mixture's order: each position's machine slot (`WindowedOrder.stream_slots`); the mixture
    blends each machine's slots by itself."""

    def __init__(self, placement: WindowedOrder) -> None:
        self.placement = placement

    def sample_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        return self.placement.stream_slots(positions)

    def sample_at_one(self, position: int) -> int:
        return int(self.placement.stream_slots(np.array([position], np.int64))[0])
