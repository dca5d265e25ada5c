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
    if settings.shuffle_window is not None and settings.shuffle and isinstance(source, MixtureSource):
        assert settings.local_batch_size is not None  # (batch_tokens does not combine with shuffle_window)
        global_batch_size = settings.local_batch_size * settings.world_size
        if source.machines != settings.streams:
            raise RuntimeError(f"{source} is read in {source.machines} machine shares, not {settings.streams}")
        slots = WindowedOrder(
            [source.sample_count],
            seed=0,
            epoch=0,
            window=1,
            streams=source.machines,
            global_batch_size=global_batch_size,
        )
        return _MachineSlots(slots.at(start, global_batch_size))
    if settings.shuffle_window is None or not settings.shuffle or source.orders_itself:
        shuffle = settings.shuffle and not source.orders_itself
        return EpochOrder(source.sample_count, shuffle=shuffle, seed=settings.seed, epoch=epoch)
    assert settings.local_batch_size is not None  # (batch_tokens does not combine with shuffle_window)
    global_batch_size = settings.local_batch_size * settings.world_size
    key = (source.sample_count, settings.seed, epoch, settings.shuffle_window, settings.streams)
    for known, known_key, order in _recent:
        if known is source and known_key == key:
            return order.at(start, global_batch_size)
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
    )
    _recent.insert(0, (source, key, order))
    del _recent[_RECENT:]
    return order


class _MachineSlots:
    """A windowed mixture's order: each position's machine slot (`WindowedOrder.stream_slots`); the mixture
    blends each machine's slots by itself."""

    def __init__(self, placement: WindowedOrder) -> None:
        self.placement = placement

    def sample_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        return self.placement.stream_slots(positions)

    def sample_at_one(self, position: int) -> int:
        return int(self.placement.stream_slots(np.array([position], np.int64))[0])
