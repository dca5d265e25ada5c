"""Provenance: which samples the next batches hold, skipping batches, and the digest a state records of them.

All of it is arithmetic on the loader's place, ``(epoch, position)``, and its settings, as iteration
is: `upcoming` walks the batches iteration would yield (into the following epochs, whose source may be
a grown storage's), the sources describe their samples from their indexes (``describe``), and
`skipped` is the place after whole batches, computed in O(1) however many epochs they span.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from guideloom._core.checks import check_int
from guideloom._core.errors import StateMismatchError
from guideloom._loading.batching import EpochSteps
from guideloom._loading.orders import epoch_order
from guideloom._loading.settings import OrderSettings
from guideloom._loading.state import NEXT_BATCH, SOURCE, recorded_batches
from guideloom._sampling.epoch_order import BatchPlan
from guideloom._sampling.token_budget import Step
from guideloom._sampling.windowed_budget import StreamStep
from guideloom._sources.describe import SamplePieces
from guideloom._sources.recorded_shards import CONTENT_KEYS, LOCATION_KEYS
from guideloom._sources.source import SampleSource

__all__ = ["DigestCache", "Place", "check_next_batch", "explain_batches", "skipped"]


@dataclass(frozen=True)
class Place:
    """Where a loader stands: ``position`` in ``epoch``, read from ``source``; the later epochs from ``next_source``."""

    epoch: int
    position: int
    source: SampleSource
    next_source: SampleSource


def plan_of(settings: OrderSettings, source: SampleSource, start: int) -> BatchPlan:
    assert settings.local_batch_size is not None
    return BatchPlan(source.sample_count, settings.local_batch_size, settings.world_size, settings.drop_last, start)


def describe_positions(
    source: SampleSource, settings: OrderSettings, epoch: int, positions: np.ndarray, start: int
) -> SamplePieces:
    """The samples at these positions of epoch ``epoch``'s order read from ``start`` (past the end: wrapping
    around, as padding does)."""
    return source.describe(epoch_order(source, settings, epoch, start).sample_at(positions), epoch)


def upcoming(
    place: Place, settings: OrderSettings, batches: int
) -> Iterator[tuple[int, int, SampleSource, Step | StreamStep, int]]:
    """The next ``batches`` batches as iteration yields them: ``(epoch, batch number in the epoch, source, step,
    where the epoch's reading resumed)``. A batch's number counts the epoch's batches before it, the same on every
    rank."""
    epoch, position, source, left = place.epoch, place.position, place.source, batches
    while left:
        steps = EpochSteps(source, settings, epoch, position)
        if steps.is_complete():  # the epoch is complete: iteration starts the next one
            epoch, position, source = epoch + 1, 0, place.next_source
            continue
        first = steps.number_before()
        for number, step in zip(range(first, first + left), steps.steps(), strict=False):
            yield epoch, number, source, step, position
            left -= 1
        position = source.sample_count


def explain_batches(place: Place, settings: OrderSettings, batches: object, rank: object) -> list[dict[str, Any]]:
    """`StatefulDataLoader.explain`: one dict per batch, ``{"epoch", "batch", "rank", "samples"}``."""
    count = check_int("batches", batches, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if rank >= settings.world_size:
        raise ValueError(f"rank must be < world_size ({settings.world_size}), got {rank}")
    described = []
    for epoch, number, source, step, start in upcoming(place, settings, count):
        epoch_settings = settings if epoch == place.epoch else settings.next_epoch()
        pieces = describe_positions(source, epoch_settings, epoch, step.rank_positions(rank), start)
        described.append({"epoch": epoch, "batch": number, "rank": rank, "samples": pieces.samples()})
    return described


def skipped(place: Place, settings: OrderSettings, batches: int) -> tuple[int, int, bool]:
    """The ``(epoch, position)`` after ``batches`` more batches, and whether it lies past the current epoch (so the
    next epoch's source serves it). Ending exactly at an epoch's end leaves that epoch complete, as reading does."""
    if settings.batch_tokens is not None:
        return _skipped_by_budget(place, settings, batches)
    plan = plan_of(settings, place.source, place.position)
    if batches <= plan.batch_count:
        return place.epoch, plan.batch_end(batches - 1) if batches else place.position, False
    left = batches - plan.batch_count
    epoch_plan = plan_of(settings, place.next_source, 0)
    whole, left = divmod(left, epoch_plan.full_epoch_batch_count)
    if left == 0:
        return place.epoch + whole, place.next_source.sample_count, True
    return place.epoch + whole + 1, epoch_plan.batch_end(left - 1), True


def _skipped_by_budget(place: Place, settings: OrderSettings, batches: int) -> tuple[int, int, bool]:
    """`skipped` for batches by budget: each epoch's steps are walked (their number differs from epoch to epoch)."""
    epoch, source, steps = place.epoch, place.source, EpochSteps(place.source, settings, place.epoch, place.position)
    left = batches
    while True:
        count = steps.count()
        if left <= count:
            return epoch, steps.end_after(left), epoch != place.epoch
        left -= count
        epoch, source = epoch + 1, place.next_source
        steps = EpochSteps(source, settings, epoch, 0)


def next_batch(source: SampleSource, settings: OrderSettings, epoch: int, position: int) -> str:
    """What a state records of the batch it stands before: a digest of that global batch's first sample.

    It depends on the order only, not on this rank or on how many ranks share the batch, so an elastic
    resume finds the same one. At an epoch's end it is the next epoch's first sample as this source would
    serve it (a storage grown since joins only then, and is left out). One sample, located in plain integer
    arithmetic and keyed by what the source knows without opening a shard (``sample_keys``), keeps
    ``state_dict()`` cheap at every step and free of downloads, and tells another order apart all the same.
    """
    if EpochSteps(source, settings, epoch, position).is_complete():
        epoch, position, settings = epoch + 1, 0, settings.next_epoch()
    index = epoch_order(source, settings, epoch, position).sample_at_one(position)
    keys = source.sample_keys(np.array([index % source.sample_count], np.int64), epoch)
    return hashlib.blake2b(np.ascontiguousarray(keys, "<i8").tobytes(), digest_size=8).hexdigest()


class DigestCache:
    """The last place's `next_batch`: ``state_dict()`` is called often, and mostly twice at one place."""

    def __init__(self) -> None:
        self._key: tuple[int, int, int, OrderSettings] | None = None
        self._value = ""

    def of(self, source: SampleSource, settings: OrderSettings, epoch: int, position: int) -> str:
        key = (epoch, position, id(source), settings)
        if key != self._key:
            self._value, self._key = next_batch(source, settings, epoch, position), key
        return self._value


def check_next_batch(
    state: dict[str, Any], source: SampleSource, settings: OrderSettings, epoch: int, position: int
) -> None:
    """StateMismatchError if the batch a state stands before is not the one ``source`` serves there.

    Checked when the state records one (version 3) and was taken from a source of this very identity (a
    mixture whose schedule was changed from the state's position on may serve other samples, by design).
    The batch is the state's: its batch sizes, not this loader's, say which samples it holds.
    """
    recorded_source = state.get(SOURCE)
    fingerprinted = isinstance(recorded_source, dict) and "fingerprint" in recorded_source
    mine = source.identity(digest=not fingerprinted)  # a fingerprint covers what the digest does
    if NEXT_BATCH not in state or _placeless(recorded_source) != _placeless(mine):
        return
    recorded, then = state[NEXT_BATCH], recorded_batches(state, settings)
    if then is None or not isinstance(recorded, str):
        raise StateMismatchError(f"the state's {NEXT_BATCH!r} and batch sizes are not what guideloom writes")
    if next_batch(source, then, epoch, position) != recorded:
        raise StateMismatchError(
            "the state's next batch is not the one this loader would read there (their digests differ): the "
            "order of the samples changed since the state was taken (another guideloom version, or a setting "
            "the state does not record), so resuming would read other data"
        )


def _placeless(identity: Any) -> Any:
    """A source's identity but for where its storages are (a storage moved since still serves its batches), and
    for the fingerprint and digest of a source that has a fingerprint: resuming compared those already (a state
    of guideloom 0.2 recorded its fingerprint in an earlier form)."""
    fingerprinted = isinstance(identity, dict) and "fingerprint" in identity
    left_out = (*LOCATION_KEYS, *CONTENT_KEYS) if fingerprinted else LOCATION_KEYS
    return (
        {key: value for key, value in identity.items() if key not in left_out}
        if isinstance(identity, dict)
        else identity
    )
