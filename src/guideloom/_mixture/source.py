"""The sample source of a `Mixture`: per-component sources, blended by `MixtureOrder`.

Each component is read through the source the loader would make for that storage alone (token
windows, document-aware or packed windows, records, remote shards), so every way of cutting samples
works inside a mixture. The mixture orders itself: the loader hands it epoch positions, and global
sample ``epoch × samples_per_epoch + position`` is located by the pure arithmetic of `MixtureOrder`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from guideloom._core.errors import StateMismatchError
from guideloom._mixture.machine_draws import MachineDraws
from guideloom._mixture.mixture import Mixture
from guideloom._mixture.mixture_order import MixtureOrder
from guideloom._mixture.recorded_mixture import KIND, check_recorded_mixture, check_schedule
from guideloom._sources.describe import SamplePieces
from guideloom._sources.documents import DocumentSource
from guideloom._sources.recorded_shards import (
    ShardSetDigest,
    cut_settings,
    describe_shards,
    parse_ranges,
    recorded_shards,
)
from guideloom._sources.token_windows import TokenWindowSource
from guideloom._sources.window_modes import StorageSource
from guideloom._windows.mixed_windows import MixedWindows

__all__ = ["MixtureSource"]

_FIRST_LOCATED = 256  # announced positions located at once; the rest when the first of them is fetched
_KEY_BITS = 40  # shard ids are < 10**12 < 2**40: component k's shard s has digest key k·2**40 + s


class MixtureSource:
    """Samples of several component sources, in the mixture's exact, seeded, scheduled order."""

    def __init__(
        self,
        mixture: Mixture,
        components: list[StorageSource],
        *,
        shuffle: bool,
        seed: int,
        window: int | None = None,
        machines: int = 1,
    ) -> None:
        self.mixture = mixture
        self.components = components
        self.shuffle = shuffle
        self.seed = seed
        self.order = MixtureOrder(
            mixture.schedule, [source.sample_count for source in components], shuffle=shuffle, seed=seed
        )
        self._sample_count = mixture.samples_per_epoch or self.order.default_samples_per_epoch()
        self.window, self.machines = window, machines
        self._machine_draws = None if window is None else self._draws_by_machine(window, machines)
        self._identity: dict[str, Any] | None = None
        self._located: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
        self._pending: tuple[int, npt.NDArray[np.int64]] | None = None  # announced, located when first needed
        self._plain_windows = _plain_windows(components)  # all read as one array when they are plain windows
        self._sign_checked = any(source.ids_need_sign_check for source in self._plain_windows or [])
        self._windows: MixedWindows | None = None  # the components' readers, read as one (built on first use)

    def windowed(self, window: int, machines: int) -> MixtureSource:
        """This mixture read with ``shuffle_window=window`` over ``machines`` machines: positions are machine
        slots (see ``_mixture.machine_draws``), each component read in windows of its machine's share."""
        return MixtureSource(
            self.mixture, self.components, shuffle=self.shuffle, seed=self.seed, window=window, machines=machines
        )

    def _draws_by_machine(self, window: int, machines: int) -> MachineDraws:
        counts = [source.shard_sample_counts() for source in self.components]
        cuts = [source.clean_cuts() for source in self.components]
        return MachineDraws(self.order, counts, cuts, self._sample_count, window=window, machines=machines)

    def _locate(self, positions: npt.NDArray[np.int64], epoch: int) -> tuple[npt.NDArray[np.int64], ...]:
        """The component and sample of each epoch position (a machine slot when windowed), padding wrapped."""
        wrapped = np.asarray(positions, np.int64) % self._sample_count
        if self._machine_draws is not None:
            return self._machine_draws.locate(wrapped, epoch)
        return self.order.locate(epoch * self._sample_count + wrapped)

    @property
    def sample_count(self) -> int:
        return self._sample_count

    @property
    def orders_itself(self) -> bool:
        return True

    @property
    def sample_bytes(self) -> int:
        sizes = {source.sample_bytes for source in self.components}
        return sizes.pop() if len(sizes) == 1 else 0

    def locate(self, positions: npt.NDArray[np.int64], epoch: int) -> tuple[npt.NDArray[np.int64], ...]:
        """The component of each epoch position and the index of its sample there.

        Positions the loader announced through `prefetch` are located many at once (cheaper per position)
        and looked up here; others are computed.
        """
        positions = np.asarray(positions, np.int64)
        found = self._look_up(positions, epoch)
        pending = self._pending
        if found is None and pending is not None and pending[0] == epoch and _find(pending[1], positions) is not None:
            if self._pending is pending:  # (a newer announcement may have replaced it meanwhile)
                self._pending = None
            self._remember(*pending)
            found = self._look_up(positions, epoch)
        if found is not None:
            return found
        return self._locate(positions, epoch)

    def _look_up(self, positions: npt.NDArray[np.int64], epoch: int) -> tuple[npt.NDArray[np.int64], ...] | None:
        leading = int(positions[0]) if len(positions) else None
        for known_epoch, known, components, samples in reversed(self._located):
            if known_epoch != epoch or leading is None or not len(known) or not known[0] <= leading <= known[-1]:
                continue  # (the first position is not among these)
            where = _find(known, positions)
            if where is not None:
                return components[where], samples[where]
        if len(self._located) >= 2:  # a batch group may span the last two announcements, which follow each other
            (first_epoch, first, *first_found), (last_epoch, last, *last_found) = self._located[-2:]
            if first_epoch == last_epoch == epoch and len(first) and len(last) and first[-1] < last[0]:
                count = len(positions)  # a run of positions across both lies in first's tail and last's head
                where = _find(np.concatenate([first[-count:], last[:count]]), positions)
                if where is not None:
                    pairs = zip(first_found, last_found, strict=True)
                    return tuple(np.concatenate([a[-count:], b[:count]])[where] for a, b in pairs)
        return None

    def _remember(self, epoch: int, positions: npt.NDArray[np.int64]) -> None:
        """Locate announced (sorted) positions for `fetch`, and pass the hint on to the components."""
        components, samples = self._locate(positions, epoch)
        self._located = [*self._located[-2:], (epoch, positions, components, samples)]
        for k in np.flatnonzero(np.bincount(components, minlength=len(self.components))).tolist():
            self.components[k].prefetch(samples[components == k], epoch)

    def fetch(self, indices: np.ndarray, epoch: int) -> Any:
        components, samples = self.locate(indices, epoch)
        plain = self._plain_windows
        if plain:  # straight into one array: no second copy to interleave them
            windows = np.empty((len(components), plain[0].sequence_length), plain[0].window_dtype)
            self._mixed_windows(plain).read(components, samples, windows)
            if self._sign_checked:
                for k in np.unique(components).tolist():
                    plain[k].check_ids(windows)
            return windows
        counts = np.bincount(components, minlength=len(self.components))
        present = np.flatnonzero(counts).tolist()
        parts = {k: self.components[k].fetch(samples[components == k], epoch) for k in present}
        return _interleave(parts, components)

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        """Each component describes its samples; they are laid out in the mixture's order, named."""
        components, samples = self._locate(indices, epoch)
        present = np.flatnonzero(np.bincount(components, minlength=len(self.components))).tolist()
        parts = {k: self.components[k].describe(samples[components == k], epoch).in_component(k) for k in present}
        nothing = SamplePieces.of([], [], [], [], [], indices=[])
        described: SamplePieces = _interleave(parts, components) if parts else nothing
        return described.named(self.mixture.names)

    def sample_lengths(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """The lengths of the samples at these positions, each from its component (all must measure samples)."""
        components, samples = self._locate(indices, epoch)  # (a windowed mixture's: its machines' draws)
        lengths = np.empty(len(components), np.int64)
        for k in np.flatnonzero(np.bincount(components, minlength=len(self.components))).tolist():
            chosen, source = components == k, self.components[k]
            if not isinstance(source, DocumentSource):
                raise TypeError(f"the mixture's component {self.mixture.names[k]!r} ({source}) has no record lengths")
            lengths[chosen] = source.sample_lengths(samples[chosen], epoch)
        return lengths

    @property
    def measures_samples(self) -> bool:
        """Whether every component knows its samples' lengths (``batch_tokens`` needs them): records do."""
        return all(isinstance(source, DocumentSource) for source in self.components)

    def sample_keys(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """Each sample's component and its keys there, sample after sample."""
        components, samples = self._locate(indices, epoch)
        keys = [
            np.concatenate([[k], self.components[k].sample_keys(samples[i : i + 1], epoch)])
            for i, k in enumerate(components.tolist())
        ]
        return np.concatenate(keys).astype(np.int64) if keys else np.empty(0, np.int64)

    def _mixed_windows(self, plain: list[TokenWindowSource]) -> MixedWindows:
        """The components' current readers, read as one (a closed or forked source opens new readers)."""
        readers = [source.reader for source in plain]
        windows = self._windows
        if windows is None or any(a is not b for a, b in zip(windows.readers, readers, strict=True)):
            windows = self._windows = MixedWindows(readers, plain[0].sequence_length)
        return windows

    def default_collate(self, samples: Any) -> Any:
        return self.components[0].default_collate(samples)

    def split_collated(self, batch: Any, sizes: list[int]) -> list[Any]:
        return list(self.components[0].split_collated(batch, sizes))

    def prefetch(self, indices: np.ndarray, epoch: int) -> None:
        """Locate announced positions for `fetch`. The first announcement of a run (a fresh or resumed loader)
        is located in two steps, so its first batch does not wait for thousands of positions; later ones,
        which continue the run, at once (each step has a fixed cost)."""
        positions = np.sort(np.asarray(indices, np.int64).reshape(-1))
        previous = self._pending or (self._located[-1][:2] if self._located else None)
        continues = False
        if previous is not None and previous[0] == epoch and len(previous[1]) and len(positions):
            continues = bool(positions[0] > previous[1][-1])
        if continues:  # an unconsumed earlier announcement stays pending
            self._remember(epoch, positions)
        elif len(positions) <= _FIRST_LOCATED:
            self._pending = None
            self._remember(epoch, positions)
        else:
            self._pending = (epoch, positions[_FIRST_LOCATED:])
            self._remember(epoch, positions[:_FIRST_LOCATED])

    def close(self) -> None:
        self._windows = None
        for source in self.components:
            source.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_located": [], "_pending": None, "_windows": None}

    def __repr__(self) -> str:
        return f"a mixture of {', '.join(self.mixture.names)}"

    # --- what a state records, and resuming from it ------------------------------------------------------

    def identity(self, *, digest: bool = True) -> dict[str, Any]:
        if self._identity is None:
            first = self.components[0].identity(digest=False)
            self._identity = {
                "kind": KIND,
                "components": [
                    [name, describe_shards(source.shard_ids), source.sample_count]
                    for name, source in zip(self.mixture.names, self.components, strict=True)
                ],
                "digest": self.shard_digest().to_text(),
                "source": cut_settings(first),  # each component's shards are recorded apart
                "schedule": self.mixture.schedule.to_json(),  # each stage's counts per block, as components
                "block_size": self.mixture.block_size,
                "samples_per_epoch": self._sample_count,
                "storages": [source.storage.location for source in self.components],  # as components
                "component_kind": first["kind"],  # how the components cut samples (the window mode)
            }
        return {key: value for key, value in self._identity.items() if digest or key != "digest"}

    def shard_digest(self) -> ShardSetDigest:
        """The digest of every component's shards, each shard keyed by its component (what a state records)."""
        entries = [source.shard_entries() for source in self.components]
        return ShardSetDigest.of_arrays(
            np.concatenate([(k << _KEY_BITS) + ids.astype(np.uint64) for k, (ids, _, _) in enumerate(entries)]),
            np.concatenate([records for _, records, _ in entries]),
            np.concatenate([checksums for _, _, checksums in entries]),
        )

    def resumed(self, recorded: dict[str, Any], *, epoch: int | None = None, position: int | None = None) -> Any:
        """The source serving the rest of the state's epoch: this one, or one over the components' shards then.

        The schedule may differ from the recorded one only from the state's global position on (the whole
        schedule must match when the position is not given).
        """
        mine = self.identity()
        check_recorded_mixture(recorded, mine, self.mixture.names, self)
        check_schedule(recorded, self.mixture, epoch, position)
        same_shards = all(recorded.get(key) == mine[key] for key in ("components", "digest", "samples_per_epoch"))
        return self if same_shards else self._over_recorded_shards(recorded)

    def _over_recorded_shards(self, recorded: dict[str, Any]) -> MixtureSource:
        """This mixture over the shards each component had when the state was taken (they may have grown since)."""
        components = []
        for (name, ranges, _), source in zip(recorded["components"], self.components, strict=True):
            shards = recorded_shards(parse_ranges(ranges), source.shard_ids, f"component {name!r} ({source})")
            components.append(source if shards == source.shard_ids else source.with_shards(shards))
        then = MixtureSource(
            self.mixture, components, shuffle=self.shuffle, seed=self.seed, window=self.window, machines=self.machines
        )
        changed = ShardSetDigest.from_text(recorded.get("digest")).changed_key(then.shard_digest())
        if changed is not None:
            name, shard = self.mixture.names[changed >> _KEY_BITS], changed & ((1 << _KEY_BITS) - 1)
            raise StateMismatchError(f"shard {shard} of component {name!r} changed since the state was taken")
        mine = then.identity()
        if recorded.get("digest") != mine["digest"] or recorded.get("components") != mine["components"]:
            raise StateMismatchError(
                f"the shards of the mixture's components changed since the state was taken: it read "
                f"{recorded.get('components')}, their shards now hold {mine['components']}"
            )
        if recorded.get("samples_per_epoch") != mine["samples_per_epoch"]:
            raise StateMismatchError(
                f"the state was taken with samples_per_epoch={recorded.get('samples_per_epoch')!r}, "
                f"this loader has {mine['samples_per_epoch']!r}"
            )
        return then


def _plain_windows(components: list[StorageSource]) -> list[TokenWindowSource] | None:
    """The components, if each serves plain windows of one length and dtype (else None)."""
    plain = [source for source in components if isinstance(source, TokenWindowSource)]
    if len(plain) < len(components) or len({(source.sequence_length, source.window_dtype) for source in plain}) > 1:
        return None
    return plain


def _find(known: npt.NDArray[np.int64], positions: npt.NDArray[np.int64]) -> slice | npt.NDArray[np.int64] | None:
    """Where ``positions`` lie in the sorted ``known`` ones (a slice when they are a run of them, as a batch's
    positions usually are), or None if any is not there."""
    count = len(positions)
    if not len(known) or not count:
        return None
    first = int(known.searchsorted(positions[0]))
    segment = known[first : first + count]
    if segment.shape == positions.shape and bool((segment == positions).all()):
        return slice(first, first + count)
    where = np.minimum(np.searchsorted(known, positions), len(known) - 1)
    return where if bool((known[where] == positions).all()) else None


def _interleave(parts: dict[int, Any], components: npt.NDArray[np.int64]) -> Any:
    """The samples of ``parts`` (each component's, in order) laid out in the order of ``components``.

    Arrays and lists are scattered; any other container of samples must offer ``split(sizes)`` and a
    ``concatenate(parts)`` static method (as rows of packed documents do).
    """
    if len(parts) == 1:
        return next(iter(parts.values()))
    first = next(iter(parts.values()))
    if isinstance(first, np.ndarray):
        out = np.empty((len(components), *first.shape[1:]), first.dtype)
        for k, part in parts.items():
            out[components == k] = part
        return out
    if isinstance(first, list):
        mixed: list[Any] = [None] * len(components)
        for k, part in parts.items():
            for slot, sample in zip(np.flatnonzero(components == k).tolist(), part, strict=True):
                mixed[slot] = sample
        return mixed
    starts = np.flatnonzero(np.diff(components, prepend=-1))
    run_components = components[starts].tolist()
    run_lengths = np.diff(np.append(starts, len(components))).tolist()
    runs: dict[int, list[int]] = {k: [] for k in parts}
    for k, length in zip(run_components, run_lengths, strict=True):
        runs[k].append(length)
    pieces = {k: iter(part.split(runs[k])) for k, part in parts.items()}
    return type(first).concatenate([next(pieces[k]) for k in run_components])
