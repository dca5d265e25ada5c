"""A loader rebuilt from a state alone: the storages it names, its order's settings, its position.

A state (version 3) names the path or URL of every storage it reads (a mixture's components with their
names, per-block counts and schedule) and every setting the order depends on, so ``guideloom explain``
can answer what a run read without the training script. A document storage is opened without its
format class: describing samples never decodes a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guideloom._core.errors import StateMismatchError, StorageNotFoundError
from guideloom._loading.loader import StatefulDataLoader
from guideloom._loading.state import SOURCE, VERSION_KEY, recorded_arguments, recorded_field
from guideloom._mixture.mixture import Mixture
from guideloom._remote.object_store import is_url
from guideloom._shards.formats import DocumentStorageFormat
from guideloom._sources.window_modes import recorded_mode
from guideloom._storage.storages import AnyFormatStorage, DocumentStorage, TokenStorage

__all__ = ["loader_from_state", "storages_of"]


class OpaqueFormat(DocumentStorageFormat[Any, bytes]):
    """Stands in for a document storage's own format, by its recorded name: records stay bytes."""

    def __init__(self, name: str) -> None:
        self.name = name

    def pack(self, data: Any) -> bytes:
        raise TypeError("a storage reopened from a loader state is read, not written")

    def unpack(self, encoded_data: memoryview, shard: int) -> bytes:
        return bytes(encoded_data)


def storages_of(state: dict[str, Any]) -> dict[str | None, str]:
    """The path or URL of every storage a state read, by mixture component name (None: a single storage)."""
    source = _source(state)
    if source.get("kind") != "mixture":
        return {None: recorded_field(source, "path", str)}
    located, components = source.get("storages"), source.get("components")
    if not isinstance(located, list) or not all(isinstance(value, str) for value in located):
        raise StateMismatchError(
            "the state names no storage of its mixture's components: it was taken by guideloom 0.2 (states of "
            "version 3 name them)"
        )
    if not isinstance(components, list) or len(components) != len(located):
        raise StateMismatchError(f"the state's mixture components {components!r} are not what guideloom writes")
    names = [
        entry[0] if isinstance(entry, list) and entry and isinstance(entry[0], str) else None for entry in components
    ]
    if None in names:
        raise StateMismatchError(f"the state's mixture components {components!r} are not what guideloom writes")
    return dict(zip(names, located, strict=True))


def _source(state: object) -> dict[str, Any]:
    if not isinstance(state, dict) or VERSION_KEY not in state:
        raise StateMismatchError(f"not a guideloom loader state: the {VERSION_KEY!r} key is missing")
    if state[VERSION_KEY] == 1:
        raise StateMismatchError("a state of guideloom 0.1 names no storage: it cannot be reopened alone")
    source = state.get(SOURCE)
    if not isinstance(source, dict):
        raise StateMismatchError(f"the state's {SOURCE!r} is {source!r}, not what guideloom writes")
    return source


def _open(location: str, kind: str, storage_options: dict[str, Any] | None, what: str) -> Any:
    """The storage at ``location``; StorageNotFoundError naming it (and what the state read there) if it is gone."""
    options = storage_options if is_url(location) else None
    try:
        found = AnyFormatStorage(location, storage_options=options)
        if kind in ("documents", "packed records"):
            return DocumentStorage(location, OpaqueFormat(found.header.format or ""), storage_options=options)
        return TokenStorage(location, storage_options=options)
    except StorageNotFoundError as error:
        why = str(error).removeprefix(f"no storage at {location}: ")
        raise StorageNotFoundError(
            f"the state read {what} from the storage at {location}, which is gone (moved or deleted?): {why}"
        ) from None


def _schedule(source: dict[str, Any], names: list[str]) -> list[tuple[int, Mapping[str, float]]]:
    """A mixture state's schedule, ``[[start, [count per component, ...]], ...]``, as `Mixture` takes it: its
    per-block counts as weights give back exactly those counts."""
    stages = recorded_field(source, "schedule", list)
    schedule: list[tuple[int, Mapping[str, float]]] = []
    for stage in stages:
        if not (
            isinstance(stage, list) and len(stage) == 2 and isinstance(stage[1], list) and len(stage[1]) == len(names)
        ):
            raise StateMismatchError(f"the state's mixture schedule {stages!r} does not give each component's counts")
        schedule.append((stage[0], dict(zip(names, stage[1], strict=True))))
    return schedule


def loader_from_state(
    state: dict[str, Any], *, rank: int = 0, storage_options: dict[str, Any] | None = None
) -> StatefulDataLoader:
    """A loader (on the CPU, no workers) over the storages ``state`` names, at its position, as rank ``rank``."""
    source = _source(state)
    located = storages_of(state)
    if source.get("kind") == "mixture":
        described = recorded_field(source, "source", dict)
        kind = recorded_field(source, "component_kind", str)
        components = {
            str(name): _open(location, kind, storage_options, f"the mixture's component {name!r}")
            for name, location in located.items()
        }
        storage: Any = Mixture(
            components,
            schedule=_schedule(source, list(components)),
            block_size=recorded_field(source, "block_size", int),
            samples_per_epoch=recorded_field(source, "samples_per_epoch", int),
        )
    else:
        described = source
        kind = recorded_field(source, "kind", str)
        storage = _open(located[None], kind, storage_options, "its storage")
    mode = recorded_mode({**described, "kind": kind})
    loader = StatefulDataLoader.from_storage(
        storage,
        device="cpu",
        rank=rank,
        sequence_length=described.get("sequence_length"),
        **recorded_arguments(state),
        **mode.arguments(),
    )
    try:
        loader.load_state_dict(state)
    except BaseException:
        loader.close()
        raise
    return loader
