"""A loader's settings: one frozen value, built and checked once by ``from_storage``.

`LoaderSettings` groups them as Grain's ``ReadOptions`` and ``ShardOptions`` do: what the batches hold
(`OrderSettings`, which iteration, the state, ``explain`` and reopening take), how they are built and
handed over (`TransportSettings`), and which rank reads them. `OrderKind` is the order an epoch is read
in, chosen once per loader from the settings and the source's type (``_loading.orders.choose_order``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

import torch

__all__ = ["LoaderSettings", "OrderKind", "OrderSettings", "TransportSettings"]


class OrderKind(Enum):
    """Which order an epoch's positions are read in (``_loading.orders`` builds each)."""

    PERMUTATION = "permutation"  # `EpochOrder`: the epoch's seeded permutation (storage order without shuffle)
    SOURCE = "source"  # the source orders itself (a mixture): it gets the epoch's positions as they are
    WINDOWED = "windowed"  # `WindowedOrder`: machine shares of the shards, in windows of shuffle_window shards
    MACHINE_SLOTS = "machine slots"  # a windowed mixture: positions are machine slots, each machine blends its own

    @property
    def windowed(self) -> bool:
        """Whether each machine reads its own share (``shuffle_window``): batches by budget then come from each
        share in turn (`WindowedBudgetPlan`), the positions dealt out over the shares."""
        return self in (OrderKind.WINDOWED, OrderKind.MACHINE_SLOTS)

    @property
    def passes_positions(self) -> bool:
        """Whether the source takes the epoch's positions as they are, no order applied."""
        return self is OrderKind.SOURCE

    @property
    def keeps_machine_shares(self) -> bool:
        """Whether later epochs keep the machine shares a resumed epoch was read in: a windowed mixture's do, since
        its components' passes run on across epochs."""
        return self is OrderKind.MACHINE_SLOTS


@dataclass(frozen=True)
class OrderSettings:
    """What a loader's batches depend on, and what its state records for reference."""

    shuffle: bool
    seed: int
    local_batch_size: int | None  # None when batches are cut by batch_tokens
    world_size: int
    drop_last: bool
    shuffle_window: int | None = None  # None: not windowed
    local_world_size: int = 1
    epoch_machines: int | None = None  # the machines whose shares the current epoch is read in (None: machines)
    batch_tokens: int | None = None  # batches cut by a budget of lengths instead of local_batch_size
    kind: OrderKind = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.kind.windowed != (self.shuffle_window is not None and self.shuffle):
            raise ValueError(
                f"a {self.kind.value} order does not fit shuffle_window={self.shuffle_window}, shuffle={self.shuffle}"
            )

    @property
    def machines(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def streams(self) -> int:
        """The machine shares of the current epoch (later epochs are read in ``machines`` shares)."""
        return self.machines if self.epoch_machines is None else self.epoch_machines

    @property
    def by_budget(self) -> bool:
        """Whether batches are cut by ``batch_tokens`` (a windowed order then deals positions over the shares)."""
        return self.batch_tokens is not None

    def next_epoch(self) -> OrderSettings:
        """The settings of the epochs after the current one: they are read in this configuration's shares."""
        return replace(self, epoch_machines=None)


@dataclass(frozen=True)
class TransportSettings:
    """How batches are built and reach the device; never what they hold (``_loading.transport``)."""

    device: torch.device
    num_workers: int = 0
    prefetch_factor: int = 2
    timeout: float = 0.0  # seconds a worker's batch may take (0: no limit)


@dataclass(frozen=True)
class LoaderSettings:
    """Every setting of a loader, checked: what its batches hold, how they are built, and which rank it is."""

    order: OrderSettings
    transport: TransportSettings
    rank: int = 0
    sequence_length: int | None = None  # of token windows and packed rows (None for documents)
    ranks_from_environment: bool = False  # rank and world_size read from the environment: checked at iter()
    log_metrics_every: float | None = None  # seconds between two logs of loader.metrics() (None: never logged)
