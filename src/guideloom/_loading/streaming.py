"""The arguments of the windowed shuffle, and the warning for a global shuffle that a cache limit makes thrash."""

from __future__ import annotations

import os
import warnings

import numpy as np

from guideloom._core.checks import check_int
from guideloom._core.user_frames import users_stacklevel
from guideloom._loading.settings import OrderKind, OrderSettings
from guideloom._mixture.source import MixtureSource
from guideloom._sampling.windowed_order import WindowedOrder
from guideloom._shards.parts import NO_PARTS, ReadPlan, joined_parts
from guideloom._sources.capabilities import InMachineShares
from guideloom._sources.source import PinnedShards, SampleSource

__all__ = [
    "check_windowed",
    "in_machine_shares",
    "local_world_size_of",
    "prepare_streaming",
    "read_plan",
    "warn_if_shares_are_small",
    "warn_if_thrashing",
]

_warned: set[str] = set()  # storages whose thrashing was reported (once per process)
_warned_shares: set[str] = set()  # storages whose small shares were reported (once per process)
SHARES_WITHIN_BYTES = 1.1  # what a machine downloads per epoch, at most, against its share (docs/object-storage.md)
# The cache's shards a suggested window leaves free: the shard it runs into and two downloads ahead (with one,
# a request's wait for its first byte leaves the link idle between small shards; see docs/object-storage.md).
DOWNLOAD_ROOM = 4


def check_windowed(storage: object, shuffle_window: object, shuffle: bool) -> int | None:
    """``shuffle_window`` checked: None (the global order) or a positive int, with ``shuffle=True``."""
    if shuffle_window is None:
        return None
    window = check_int("shuffle_window", shuffle_window, minimum=1)
    if not shuffle:
        raise ValueError(f"shuffle_window={window} needs shuffle=True: it says how the shuffle mixes shards")
    return window


def local_world_size_of(local_world_size: object, world_size: int, shuffle_window: int | None) -> int:
    """Ranks per machine: the argument, else ``LOCAL_WORLD_SIZE``, else 1; it must divide ``world_size``."""
    if local_world_size is None:
        found = os.environ.get("LOCAL_WORLD_SIZE")
        if found is None:
            return 1
        try:
            ranks = int(found)
        except ValueError:
            raise ValueError(f"the LOCAL_WORLD_SIZE environment variable must be an int, got {found!r}") from None
        if ranks >= 1 and world_size % ranks == 0:
            return ranks
        if shuffle_window is None:  # the global order does not depend on machines
            return 1
        raise ValueError(
            f"LOCAL_WORLD_SIZE={found} in the environment does not divide world_size={world_size}: pass "
            "local_world_size= (ranks per machine)"
        )
    ranks = check_int("local_world_size", local_world_size, minimum=1)
    if world_size % ranks:
        raise ValueError(f"local_world_size={ranks} must divide world_size={world_size} (ranks per machine)")
    return ranks


def prepare_streaming(source: SampleSource, settings: OrderSettings) -> SampleSource:
    """The source a new loader reads, made ready for its order: the warnings below, and a windowed order's source
    keeps its window and the shard a window runs into open, no more (a finished shard is left to the cache at
    once). A windowed mixture does so for each component, and reads its positions as machine slots. Batches by
    budget read the record lengths of every machine's window: from the shard objects' tails, or, where those are
    compressed, from the shards themselves (see `warn_if_thrashing`)."""
    shuffle_window, by_budget = settings.shuffle_window, settings.by_budget
    read: list[SampleSource] = list(source.components) if isinstance(source, MixtureSource) else [source]
    for one_source in read:
        if shuffle_window is not None and isinstance(one_source, PinnedShards):
            one_source.hold_at_most(shuffle_window + 1)
        warn_if_thrashing(one_source, settings)
        # Parts of shards are planned for a storage read alone, not a mixture's, nor batches by budget (`read_plan`).
        warn_if_shares_are_small(one_source, settings, plans_parts=source is one_source and not by_budget)
    return in_machine_shares(source, settings)


def read_plan(source: SampleSource, order: object, rank: int, machines: int) -> ReadPlan:
    """The parts of the shards that ``rank``'s machine shares with its neighbours in this windowed epoch
    (``order``), so that a remote storage downloads only those parts of them (see ``_shards.parts``): a value the
    loader sends with the work.

    Every rank of a machine plans the same parts: those of its machine's share. An epoch read in shares of other
    machines than its ranks make (a state resumed elastically) plans none: its boundary shards are read whole. So
    does a loader on one of ``machines`` (all shards are its own), a mixture, and a source that cannot read parts.
    """
    if machines < 2 or not isinstance(order, WindowedOrder) or order.ranks % order.streams:
        return NO_PARTS
    if not isinstance(source, PinnedShards) or not source.reads_in_parts:
        return NO_PARTS
    ranges, whole = order.end_parts(rank // (order.ranks // order.streams))
    parts = joined_parts(source.sample_parts(first, stop) for first, stop in ranges)
    for position in whole.tolist():
        parts.pop(position, None)
    return ReadPlan.of(parts)


def in_machine_shares(source: SampleSource, settings: OrderSettings) -> SampleSource:
    """A windowed mixture read in the current epoch's machine shares (it keeps a run's shares over all its epochs,
    since its components' passes run on across them); any other source as it is."""
    if settings.kind is not OrderKind.MACHINE_SLOTS or not isinstance(source, InMachineShares):
        return source
    assert settings.shuffle_window is not None
    if source.window == settings.shuffle_window and source.machines == settings.streams:
        return source
    return source.windowed(settings.shuffle_window, settings.streams)


def warn_if_shares_are_small(source: SampleSource, settings: OrderSettings, plans_parts: bool) -> None:
    """Warn once per storage when a windowed read of a remote storage with a cache limit over several machines
    gives each so few shards that the two it shares with its neighbours may take it past 1.1x its share per epoch.

    Shares are equal in samples, so they begin and end inside shards. Where the loader plans parts of such shards
    (``plans_parts``, see `read_plan`) and the source reads them (`PinnedShards.reads_in_parts`) a machine
    downloads only its part; elsewhere (compressed shard objects, shards
    without checkpoints, mixtures, batches by budget) the machines on either side of a boundary both download its
    shard whole, so a machine downloads up to two shards more than its share.
    """
    shuffle_window, machines = settings.shuffle_window, settings.machines
    if shuffle_window is None or machines < 2 or not isinstance(source, PinnedShards):
        return
    if source.storage.cache_limit is None:
        return  # without a limit every shard read stays cached: epochs after the first download less
    if source.storage.location in _warned_shares or (plans_parts and source.reads_in_parts):
        return
    sizes = source.snapshot.rows["size"].astype(np.int64)
    share = int(sizes.sum()) / machines
    largest = int(sizes.max()) if len(sizes) else 0
    if share == 0 or share + 2 * largest <= SHARES_WITHIN_BYTES * share:
        return
    _warned_shares.add(source.storage.location)
    fitting = int(share * (SHARES_WITHIN_BYTES - 1) / 2)
    warnings.warn(
        f"shuffle_window={shuffle_window} over {machines} machines gives each machine a share of "
        f"{source.storage.location} of about {share / largest:.1f} of its largest shards: a share begins and ends "
        "inside shards, which the machines on either side both download whole, so a machine may download up to "
        f"{(share + 2 * largest) / share:.2f}x its share per epoch; shards of at most {fitting:,} bytes keep it "
        f"within {SHARES_WITHIN_BYTES}x (see docs/object-storage.md)",
        stacklevel=users_stacklevel(),
    )


def warn_if_thrashing(source: SampleSource, settings: OrderSettings) -> None:
    """Warn once per storage when a global shuffle reads a remote storage through a cache smaller than it, or
    a windowed one through a cache smaller than the windows it reads at once: its own, or with batches by
    budget over compressed shard objects every machine's (each rank plans every machine's batches from the
    lengths of their records, which only uncompressed objects give without the shards' data).

    A global order touches every shard all the time, so each read misses the cache with the chance that its
    shard is not among the cached ones: about ``samples x (1 - cached shards / shards)`` downloads an epoch.
    """
    if not settings.shuffle or not isinstance(source, PinnedShards) or source.storage.cache_limit is None:
        return
    limit, shuffle_window = source.storage.cache_limit, settings.shuffle_window
    # lengths come from the shards' tails, except from compressed shard objects: those are downloaded
    every_window = settings.by_budget and source.storage.compression is not None
    windows = settings.machines if every_window else 1
    sizes = source.snapshot.rows["size"].astype(np.int64)
    total = int(sizes.sum())
    if total <= limit or source.storage.location in _warned:
        return
    cached = limit // max(int(sizes.max()), 1)
    if shuffle_window is not None and windows > 1:
        if windows * (shuffle_window + 2) + 1 > cached:
            _warned.add(source.storage.location)
            warnings.warn(
                f"batch_tokens with shuffle_window={shuffle_window} over {windows} machines reads the record lengths "
                f"of every machine's window from its compressed shards, so each machine downloads every shard of "
                f"{source.storage.location} once an epoch, through a cache of {windows} windows and the shards "
                "after them; this cache "
                f"({limit:,} bytes, {cached} of its largest shards) is smaller and will download shards again: "
                f"shuffle_window={max(1, (cached - 1) // windows - 2)} fits (see docs/object-storage.md)",
                stacklevel=users_stacklevel(),
            )
        return
    if shuffle_window is not None:
        if shuffle_window + 3 > cached:
            _warned.add(source.storage.location)
            warnings.warn(
                f"shuffle_window={shuffle_window} does not fit the cache of {source.storage.location} "
                f"({limit:,} bytes, {cached} of its largest shards): a window needs its shards, the next one and one "
                "downloading, so the cache will evict shards still needed and download them again; "
                f"{_what_fits(cached, int(sizes.max()))} (see docs/object-storage.md)",
                stacklevel=users_stacklevel(),
            )
        return
    _warned.add(source.storage.location)
    downloads = source.sample_count * (1 - cached / len(sizes))
    expected = max(total, int(downloads * total / len(sizes)))
    warnings.warn(
        f"shuffle=True reads {source.storage.location} in one global order through a cache of {limit:,} bytes, "
        f"smaller than its {total:,} bytes: expect about {expected:,} bytes downloaded per epoch "
        f"({expected / total:.0f}x the storage); a shuffle_window reads each machine's share about once: "
        f"{_what_fits(cached, int(sizes.max()))} (see docs/object-storage.md)",
        stacklevel=users_stacklevel(),
    )


def _what_fits(cached: int, largest: int) -> str:
    """The advice of a warning: the largest ``shuffle_window`` a cache of ``cached`` shards holds, or the cache that
    holds the smallest window, where none fits."""
    if cached > DOWNLOAD_ROOM:
        return f"shuffle_window={cached - DOWNLOAD_ROOM} fits, with room for a second download ahead"
    if cached == DOWNLOAD_ROOM:
        return "shuffle_window=1 fits, with no room for a second download ahead"
    return (
        f"no shuffle_window fits: the smallest, shuffle_window=1, needs a cache_limit_bytes of at least "
        f"{DOWNLOAD_ROOM * largest:,} bytes ({DOWNLOAD_ROOM} of the largest shards; "
        f"{(DOWNLOAD_ROOM + 1) * largest:,} leave room for a second download ahead), or smaller shards"
    )
