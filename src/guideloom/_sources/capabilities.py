"""What some sample sources can do beyond `SampleSource`, each declared as a protocol the loader checks by type.

A source has a capability when it has the protocol's members (``isinstance(source, ShardwiseSamples)``):
the sources over one storage are cut shard by shard, documents know their lengths, and a mixture is read
in machine shares of its own. The loader asks these protocols, never ``hasattr``, so what a new source
must offer for each way of reading is written here.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from guideloom._sources.source import SampleSource

__all__ = ["InMachineShares", "MeasuredSamples", "ShardwiseSamples"]


@runtime_checkable
class ShardwiseSamples(Protocol):
    """Samples numbered shard after shard, in storage order: what a windowed order (``shuffle_window``) walks."""

    def shard_sample_counts(self) -> np.ndarray:
        """The samples of each shard, in storage order (int64), from the snapshot where the source can."""
        ...

    def clean_cuts(self) -> np.ndarray | None:
        """The shards that no sample of the shard before runs into (0 among them), or None when no sample crosses
        a shard: a windowed order then puts shards in any order (see `WindowedOrder.shard_order`)."""
        ...


@runtime_checkable
class MeasuredSamples(Protocol):
    """Samples whose lengths the source knows without reading them, as ``batch_tokens`` needs."""

    @property
    def measures_samples(self) -> bool:
        """Whether `sample_lengths` answers (a mixture's does when every component's does)."""
        ...

    def sample_lengths(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """The lengths (int64) of the samples at these indices (or positions) of epoch ``epoch``."""
        ...


@runtime_checkable
class InMachineShares(Protocol):
    """A source that orders itself and, with ``shuffle_window``, is read in machine shares of its own: the loader
    hands it machine slots (`WindowedOrder.stream_slots`) and each machine blends its own samples (a mixture)."""

    @property
    def window(self) -> int | None:
        """The ``shuffle_window`` it is read with (None: not in machine shares)."""
        ...

    @property
    def machines(self) -> int:
        """The machine shares it is read in."""
        ...

    def windowed(self, window: int, machines: int) -> SampleSource:
        """This source read with ``shuffle_window=window`` in ``machines`` machine shares."""
        ...
