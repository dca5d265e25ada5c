"""Which order an epoch's positions are read in: the global permutation of 0.3, or the windowed shuffle.

Iteration, ``explain``, ``skip`` and the state's next-batch digest all ask here, so they agree on it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from guideloom._loading.state import OrderSettings
from guideloom._mixture.source import MixtureSource
from guideloom._sampling.epoch_order import EpochOrder
from guideloom._sampling.windowed_order import WindowedOrder
from guideloom._sources.source import SampleSource

__all__ = ["Order", "epoch_order"]

_RECENT = 4  # windowed epochs kept (their shares and windows cost a pass over the shards to lay out)
_recent: list[tuple[SampleSource, tuple[int, ...], WindowedOrder]] = []


class Order(Protocol):
    def sample_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]: ...

    def sample_at_one(self, position: int) -> int: ...


def epoch_order(source: SampleSource, settings: OrderSettings, epoch: int, start: int) -> Order:
    """The order of epoch ``epoch`` of ``source`` from position ``start`` (the start of a global batch)."""
    windowed = settings.shuffle_window is not None and settings.shuffle
    if windowed and settings.batch_tokens is not None:  # positions dealt out over the streams in turn, from 0 on
        return _Wrapped(_windowed(source, settings, epoch, 0, settings.streams, settings.streams), source.sample_count)
    if not windowed or (source.orders_itself and not isinstance(source, MixtureSource)):
        shuffle = settings.shuffle and not source.orders_itself
        return EpochOrder(source.sample_count, shuffle=shuffle, seed=settings.seed, epoch=epoch)
    assert settings.local_batch_size is not None
    global_batch_size = settings.local_batch_size * settings.world_size
    return _windowed(source, settings, epoch, start, global_batch_size, settings.world_size)


def _windowed(
    source: SampleSource, settings: OrderSettings, epoch: int, start: int, global_batch_size: int, ranks: int
) -> Order:
    """The windowed order of ``source`` from ``start`` in global batches of ``global_batch_size``, read by
    ``ranks``."""
    if isinstance(source, MixtureSource):
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
    assert settings.shuffle_window is not None
    key = (source.sample_count, settings.seed, epoch, settings.shuffle_window, settings.streams)
    for known, known_key, order in _recent:
        if known is source and known_key == key:
            return order.at(start, global_batch_size, ranks)
    counts = source.shard_sample_counts()  # type: ignore[attr-defined]  # every source that does not order itself
    order = WindowedOrder(
        counts,
        seed=settings.seed,
        epoch=epoch,
        window=settings.shuffle_window,
        streams=settings.streams,
        global_batch_size=global_batch_size,
        start=start,
        clean_cuts=source.clean_cuts() if hasattr(source, "clean_cuts") else None,
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
