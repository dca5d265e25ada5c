"""Batches and devices: the tensors nested in whatever a ``collate`` returns, changed in place of the originals.

Used to send tensors from worker processes cheaply and to move them to the device. Containers are
rebuilt as their own type with what their constructors need (a ``defaultdict`` keeps its factory, a
named tuple such as ``PackedSequence`` is rebuilt field by field); other values pass through.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

import numpy as np
import torch

_ATOMS = frozenset({int, float, complex, bool, str, bytes, type(None)})  # values that never hold a tensor
_CPU = torch.device("cpu")


def is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor)


def map_tensors(batch: Any, change: Callable[[Any], Any], is_leaf: Callable[[Any], bool] = is_tensor) -> Any:
    """``batch`` with ``change`` applied to every leaf in it, nested in mappings, sequences and dataclasses."""
    kind = type(batch)
    if kind in _ATOMS:
        return batch
    if is_leaf(batch):
        return change(batch)

    def walk(value: Any) -> Any:
        return map_tensors(value, change, is_leaf)

    if kind is dict:  # the common containers first, rebuilt directly (this runs for every batch)
        return {key: walk(value) for key, value in batch.items()}
    if kind is list:
        return [walk(value) for value in batch]
    if kind is tuple:
        return tuple(walk(value) for value in batch)
    if isinstance(batch, str | bytes | bytearray | memoryview):
        return batch
    if isinstance(batch, Mapping):
        items = {key: walk(value) for key, value in batch.items()}
        return batch if _same(batch.values(), items.values()) else _rebuilt_mapping(batch, items)
    if isinstance(batch, Sequence):
        values = [walk(value) for value in batch]
        if _same(batch, values):
            return batch
        make = getattr(type(batch), "_make", None)  # a named tuple's: it skips a __new__ that checks its fields
        if isinstance(batch, tuple) and callable(make):
            return make(values)
        return _rebuilt_sequence(batch, values)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}
        changed = {name: walk(value) for name, value in fields.items()}
        if _same(fields.values(), changed.values()):
            return batch
        clone = copy.copy(batch)
        for name, value in changed.items():
            object.__setattr__(clone, name, value)  # frozen dataclasses too
        return clone
    return batch


def _same(before: Iterable[Any], after: Iterable[Any]) -> bool:
    """Whether nothing was changed: then the container itself is kept, not copied."""
    return all(old is new for old, new in zip(before, after, strict=True))


def _rebuilt_mapping(batch: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping of ``batch``'s type holding ``items``: a copy updated in place, so constructors need no guessing."""
    try:
        if isinstance(batch, MutableMapping):
            clone = copy.copy(batch)
            clone.update(items)
            return clone
        return type(batch)(items)  # type: ignore[call-arg]
    except TypeError:
        return items


def _rebuilt_sequence(batch: Sequence[Any], values: list[Any]) -> Any:
    try:
        if isinstance(batch, MutableSequence):
            clone = copy.copy(batch)
            clone[:] = values
            return clone
        return type(batch)(values)  # type: ignore[call-arg]
    except TypeError:
        return values


def moves_itself(value: object) -> bool:
    """Tensors, and objects that move their tensors themselves as torch's own do (``PackedSequence``)."""
    return isinstance(value, torch.Tensor) or (
        callable(getattr(value, "to", None)) and callable(getattr(value, "pin_memory", None))
    )


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor in ``batch`` moved to ``device``; through pinned memory, without blocking, on CUDA.

    An object with its own ``to`` and ``pin_memory`` moves itself: a ``PackedSequence`` keeps its
    ``batch_sizes`` on the CPU, as torch requires.
    """
    if device == _CPU and _stays_on_cpu(batch):  # the batch as it is: nothing in it to move or rebuild
        return batch

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device == device:
            return value
        if device.type == "cuda":
            pinned = value if getattr(value, "is_pinned", lambda: False)() else value.pin_memory()
            return pinned.to(device, non_blocking=True)
        return value.to(device)

    return map_tensors(batch, move, moves_itself)


def _stays_on_cpu(value: Any) -> bool:
    """Whether ``value`` holds only CPU tensors, NumPy arrays and plain values, in dicts, lists and tuples: what
    the batches of a CPU loader almost always are (any other object is left to the full walk)."""
    kind = type(value)
    if kind is torch.Tensor:
        return bool(value.is_cpu)
    if kind is np.ndarray or kind in _ATOMS:
        return True
    if kind is dict:
        return all(map(_stays_on_cpu, value.values()))
    if kind is list or kind is tuple:
        return all(map(_stays_on_cpu, value))
    return False


def check_device(device: object) -> torch.device:
    """``device`` as a torch.device that this machine has; else a ValueError saying why (a TypeError for no device)."""
    if not isinstance(device, str | int | torch.device) or isinstance(device, bool):
        raise TypeError(f"device must be a torch.device or a device string, got {type(device).__name__}")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device must be a torch.device or a device string: {error}") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device is {str(resolved)!r}, but CUDA is not available on this machine")
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(f"device is {str(resolved)!r}, but this machine has {count} CUDA device(s)")
    elif resolved.type not in ("cpu", "meta"):
        is_available = getattr(getattr(torch, resolved.type, None), "is_available", None)
        if callable(is_available) and not is_available():
            raise ValueError(f"device is {str(resolved)!r}, but {resolved.type} is not available on this machine")
    return resolved
