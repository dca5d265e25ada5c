"""`Mixture`: several storages read as one, in exact proportions that may change on a schedule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guideloom._core.checks import check_int
from guideloom._mixture.schedule import Schedule, parse_schedule
from guideloom._storage.storages import DocumentStorage, TokenStorage

__all__ = ["Mixture"]

Storage = DocumentStorage[Any, Any] | TokenStorage


class Mixture:
    """Named storages blended in set proportions; accepted by ``StatefulDataLoader.from_storage`` like a storage.

    ``weights`` is a dict of component name -> non-negative weight (normalised; 0 switches a component
    off), or a schedule ``[(start, weights), ...]`` whose weights take effect at global sample ``start``
    (counted across epochs; the first start is 0, every start a multiple of ``block_size``). Within every
    aligned block of ``block_size`` samples each component contributes its weight × ``block_size``
    rounded by largest remainder, in a seeded order. ``samples_per_epoch`` defines ``len(loader)`` and
    the epoch counter; by default it is the number of samples after which the first component, at the
    first weights, has served each of its samples once.
    """

    __module__ = "guideloom"  # its public home: reprs and pickles name it there

    def __init__(
        self,
        components: Mapping[str, Storage],
        weights: Mapping[str, float] | list[tuple[int, Mapping[str, float]]] | None = None,
        *,
        schedule: list[tuple[int, Mapping[str, float]]] | None = None,
        samples_per_epoch: int | None = None,
        block_size: int = 1024,
    ) -> None:
        self.components: dict[str, Storage] = _check_components(components)
        stages: object = schedule
        if isinstance(weights, list | tuple):  # a schedule given as weights=
            if not all(isinstance(stage, list | tuple) and len(stage) == 2 for stage in weights):
                raise TypeError(
                    "weights must be a dict of component name -> weight, or a schedule: a list of "
                    f"(start, weights) pairs; got {weights!r}"
                )
            if schedule is not None:
                raise ValueError("give exactly one of weights= and schedule=")
            weights, stages = None, weights
        self.schedule: Schedule = parse_schedule(tuple(self.components), weights, stages, block_size)
        if samples_per_epoch is not None:
            samples_per_epoch = check_int("samples_per_epoch", samples_per_epoch, minimum=1)
        self.samples_per_epoch = samples_per_epoch

    @property
    def block_size(self) -> int:
        return self.schedule.block_size

    @property
    def names(self) -> tuple[str, ...]:
        return self.schedule.names

    def __repr__(self) -> str:
        parts = ", ".join(f"{name!r}: {storage!r}" for name, storage in self.components.items())
        return f"Mixture({{{parts}}}, stages={len(self.schedule.starts)}, block_size={self.block_size})"


def _check_components(components: object) -> dict[str, Storage]:
    """``components`` as a dict, checked: non-empty, str names, all token storages or all document storages."""
    if not isinstance(components, Mapping):
        raise TypeError(f"components must be a dict of name -> storage, got {type(components).__name__}")
    if not components:
        raise ValueError("components must name at least one storage")
    checked: dict[str, Storage] = {}
    for name, storage in components.items():
        if not isinstance(name, str):
            raise TypeError(f"components' names must be strings, got {name!r}")
        if not name:
            raise ValueError("components' names must not be empty")
        if not isinstance(storage, DocumentStorage | TokenStorage):
            raise TypeError(
                f"components[{name!r}] must be a TokenStorage or a DocumentStorage, got {type(storage).__name__}"
            )
        checked[name] = storage
    kinds = {type(storage).__name__ for storage in checked.values()}
    if len(kinds) > 1:
        raise ValueError(f"components must be all TokenStorage or all DocumentStorage, got {sorted(kinds)}")
    return checked
