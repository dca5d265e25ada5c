"""Which order an epoch's positions are read in: the global permutation of 0.3, or the windowed shuffle.

Iteration, ``explain``, ``skip`` and the state's next-batch digest all ask here, so they agree on it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from guideloom._loading.state import OrderSettings
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
    if settings.shuffle_window is None or not settings.shuffle or source.orders_itself:
        shuffle = settings.shuffle and not source.orders_itself
        return EpochOrder(source.sample_count, shuffle=shuffle, seed=settings.seed, epoch=epoch)
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
