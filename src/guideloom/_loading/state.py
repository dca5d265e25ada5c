"""The loader's state dict: its keys, its version, the one place that builds it and the one that checks it.

A state is where to continue, ``(epoch, position)``, plus what the batches depend on, so that a state
from another storage or configuration is refused instead of silently read in another order. The
source's part is its ``identity()``; version 3 adds a digest of the batch the state stands before
(``NEXT_BATCH``, see ``explain``). States of version 2 (guideloom 0.2) and 1 (guideloom 0.1) still load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from guideloom._core.errors import StateMismatchError
from guideloom._loading.settings import OrderSettings
from guideloom._sources.source import PinnedShards, SampleSource

VERSION = 3
VERSIONS = (1, 2, VERSION)  # the versions that load
VERSION_KEY = "guideloom_loader_state"  # its value is the version of the dict's layout
EPOCH = "epoch"
POSITION = "position"
SAMPLE_COUNT = "sample_count"
SHUFFLE = "shuffle"
SEED = "seed"
LOCAL_BATCH_SIZE = "local_batch_size"  # this and the next two are recorded for reference: they may change
WORLD_SIZE = "world_size"
DROP_LAST = "drop_last"
BATCH_TOKENS = "batch_tokens"  # only in the states of loaders batching by budget (their local_batch_size is None)
SHUFFLE_WINDOW = "shuffle_window"  # only in states of a windowed order, with the next two
LOCAL_WORLD_SIZE = "local_world_size"  # for reference
MACHINES = "machines"  # the machine shares the state's epoch is read in: a resumed run keeps them to its end
SOURCE = "source"  # the source's identity(): what it read, in words a user can compare
NEXT_BATCH = "next_batch"  # a digest of the next global batch's first sample (hex)

# Version 1 recorded the source as these two keys instead of SOURCE.
V1_STORAGE = "storage"  # the fingerprint of the storage's contents
V1_SEQUENCE_LENGTH = "sequence_length"


@dataclass(frozen=True)
class Resume:
    """Where a checked state continues, and the source that serves the rest of its epoch."""

    epoch: int
    position: int
    source: SampleSource
    machines: int | None = None  # the machine shares a windowed order's epoch is read in


def build_state(
    settings: OrderSettings, source: SampleSource, epoch: int, position: int, next_batch: str
) -> dict[str, Any]:
    """The state dict: small, JSON-serialisable and equal on every rank."""
    budget = {} if settings.batch_tokens is None else {BATCH_TOKENS: settings.batch_tokens}
    return {
        VERSION_KEY: VERSION,
        EPOCH: epoch,
        POSITION: position,
        SAMPLE_COUNT: source.sample_count,
        SHUFFLE: settings.shuffle,
        SEED: settings.seed,
        LOCAL_BATCH_SIZE: settings.local_batch_size,
        WORLD_SIZE: settings.world_size,
        DROP_LAST: settings.drop_last,
        **budget,
        SOURCE: source.identity(),
        NEXT_BATCH: next_batch,
        **windowed_keys(settings),
    }


def windowed_keys(settings: OrderSettings) -> dict[str, Any]:
    """What a state of a windowed order adds; nothing for the global order (its states stay as 0.3 wrote them)."""
    if settings.shuffle_window is None:
        return {}
    return {
        SHUFFLE_WINDOW: settings.shuffle_window,
        LOCAL_WORLD_SIZE: settings.local_world_size,
        MACHINES: settings.streams,
    }


def recorded_arguments(state: dict[str, Any]) -> dict[str, Any]:
    """The settings a state records, as ``from_storage``'s keywords (it checks their values): what reopening a
    loader from the state alone reads its batches with. StateMismatchError for a key of the wrong type."""
    budget = state.get(BATCH_TOKENS) is not None
    return {
        LOCAL_BATCH_SIZE: None if budget else recorded_field(state, LOCAL_BATCH_SIZE, int),
        BATCH_TOKENS: recorded_field(state, BATCH_TOKENS, int) if budget else None,
        SHUFFLE: recorded_field(state, SHUFFLE, bool),
        SEED: recorded_field(state, SEED, int),
        DROP_LAST: recorded_field(state, DROP_LAST, bool),
        WORLD_SIZE: recorded_field(state, WORLD_SIZE, int),
        SHUFFLE_WINDOW: state.get(SHUFFLE_WINDOW),
        LOCAL_WORLD_SIZE: state.get(LOCAL_WORLD_SIZE, 1),
    }


def recorded_batches(state: dict[str, Any], settings: OrderSettings) -> OrderSettings | None:
    """``settings`` cut into the batches a state recorded (its batch size or budget, world size, ``drop_last`` and
    ranks per machine): the batches its next-batch digest was taken in. None if those are not what guideloom
    writes."""
    local_batch_size, world_size, drop_last = (state.get(key) for key in (LOCAL_BATCH_SIZE, WORLD_SIZE, DROP_LAST))
    batch_tokens = state.get(BATCH_TOKENS)
    local_world_size = state.get(LOCAL_WORLD_SIZE, settings.local_world_size)
    sizes = (local_batch_size if batch_tokens is None else batch_tokens, world_size, local_world_size)
    sizes_fit = all(isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in sizes)
    if batch_tokens is not None and local_batch_size is not None:
        sizes_fit = False  # one or the other
    if not (sizes_fit and isinstance(drop_last, bool)):
        return None
    assert isinstance(world_size, int) and isinstance(local_world_size, int)
    return replace(
        settings,
        local_batch_size=local_batch_size,
        world_size=world_size,
        drop_last=drop_last,
        batch_tokens=batch_tokens,
        local_world_size=local_world_size,
    )


def recorded_field(state: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``state[key]``, which must be of type ``kind`` (a bool only where ``kind`` is bool); else StateMismatchError."""
    value = state.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
        raise StateMismatchError(f"the state's {key!r} is {value!r}, not what guideloom writes")
    return value


def check_state(state: object, settings: OrderSettings, source: SampleSource) -> Resume:
    """Where ``state`` continues for a loader with ``settings`` reading ``source``; else the error that says why not.

    Something that is not a dict is a TypeError; a state that does not fit this loader a StateMismatchError.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    if VERSION_KEY not in state:
        raise StateMismatchError(f"not a guideloom loader state: the {VERSION_KEY!r} key is missing")
    version = state[VERSION_KEY]
    if version not in VERSIONS or isinstance(version, bool):
        raise StateMismatchError(
            f"not a guideloom loader state of version {', '.join(map(str, VERSIONS))}: {VERSION_KEY!r} is {version!r}"
        )
    epoch, position = state.get(EPOCH), state.get(POSITION)
    for key, number in ((EPOCH, epoch), (POSITION, position)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise StateMismatchError(f"the state's {key} must be a non-negative int, got {number!r}")
    assert isinstance(epoch, int) and isinstance(position, int)
    settings_recorded = ((SHUFFLE, settings.shuffle), (SEED, settings.seed))
    if version == 1:
        _check_v1_source(state, source)
    else:  # the source says best what differs (the argument, the storage, the shards) once the seed is the same
        _check_equal(state, settings_recorded)
        _require(state, SOURCE)
        source = source.resumed(state[SOURCE], epoch=epoch, position=position)
    _check_equal(state, (*settings_recorded, (SAMPLE_COUNT, source.sample_count)))
    if position > source.sample_count:
        raise StateMismatchError(f"the state's position {position} exceeds the epoch's {source.sample_count} samples")
    return Resume(epoch, position, source, _recorded_machines(state, settings))


def _recorded_machines(state: dict[str, Any], settings: OrderSettings) -> int | None:
    """The machine shares the state's epoch is read in (windowed orders); StateMismatchError if the orders differ."""
    recorded = state.get(SHUFFLE_WINDOW)
    if recorded != settings.shuffle_window or type(recorded) is not type(settings.shuffle_window):
        raise StateMismatchError(
            f"the state was taken with shuffle_window={recorded!r}, but this loader has "
            f"shuffle_window={settings.shuffle_window!r}"
        )
    if recorded is None:
        return None
    machines = state.get(MACHINES)
    if isinstance(machines, bool) or not isinstance(machines, int) or machines < 1:
        raise StateMismatchError(f"the state's {MACHINES!r} must be a positive int, got {machines!r}")
    return machines


def _check_equal(state: dict[str, Any], expected: tuple[tuple[str, object], ...]) -> None:
    """StateMismatchError naming the first key whose recorded value is not the expected one."""
    for key, value in expected:
        _require(state, key)
        if state[key] != value or type(state[key]) is not type(value):
            raise StateMismatchError(
                f"the state was taken with {key}={state[key]!r}, but this loader has {key}={value!r}"
            )


def _require(state: dict[str, Any], key: str) -> None:
    if key not in state:
        raise StateMismatchError(f"the state has no {key!r}")


def _check_v1_source(state: dict[str, Any], source: SampleSource) -> None:
    """A version 1 state recorded a single storage's fingerprint and the sequence_length."""
    identity = source.identity(digest=False)
    _require(state, V1_SEQUENCE_LENGTH)
    recorded, mine = state[V1_SEQUENCE_LENGTH], identity.get("sequence_length")
    if recorded != mine or type(recorded) is not type(mine):
        raise StateMismatchError(
            f"the state was taken with sequence_length={recorded!r}, but this loader has sequence_length={mine!r}"
        )
    _require(state, V1_STORAGE)
    if not (isinstance(source, PinnedShards) and source.has_fingerprint(state[V1_STORAGE])):
        raise StateMismatchError(
            f"the state was taken from another storage, or from this one before it changed: this loader "
            f"reads {source} (the state records no shard ids: it is from guideloom 0.1)"
        )
