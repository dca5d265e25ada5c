"""A rank's sample indices batch by batch, computed a chunk at a time, each chunk announced to the source ahead."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from guideloom._loading.orders import Order
from guideloom._sampling.epoch_order import BatchPlan
from guideloom._sources.source import SampleSource

__all__ = ["FIRST_ORDER_CHUNK", "ORDER_CHUNK", "index_batches"]

ORDER_CHUNK = 4096  # samples whose order is computed at once (rounded down to whole batches)
FIRST_ORDER_CHUNK = 256  # the same at the start of an epoch segment, so the first batch waits for these only


def index_batches(source: SampleSource, order: Order, epoch: int, plan: BatchPlan, rank: int) -> Iterator[np.ndarray]:
    """``rank``'s sample indices (or positions, for a source that orders itself) batch by batch, in ``order``.

    They are computed many batches at a time (it is vectorised), and the source hears of each chunk while the
    one before is read, so that the shards the next chunk starts with are fetched ahead. The first chunk is
    only a few batches' worth, so that the first batch does not wait for thousands.
    """
    full = plan.full_batch_count
    chunk = max(1, ORDER_CHUNK // plan.local_batch_size)
    stop = min(max(1, FIRST_ORDER_CHUNK // plan.local_batch_size), full)
    indices = order.sample_at(plan.full_rank_positions(0, stop, rank)) if full else None
    if indices is not None:
        source.prefetch(indices.reshape(-1), epoch)
    while indices is not None:
        yield indices[0]  # (the first batch does not wait for the next chunk)
        following = None
        if stop < full:
            following = order.sample_at(plan.full_rank_positions(stop, min(stop + chunk, full), rank))
            source.prefetch(following.reshape(-1), epoch)
            stop = min(stop + chunk, full)
        yield from indices[1:]
        indices = following
    if plan.full_batch_count < plan.batch_count:  # the last batch may be short and padded
        indices = order.sample_at(plan.rank_positions(plan.batch_count - 1, rank))
        source.prefetch(indices, epoch)
        yield indices
