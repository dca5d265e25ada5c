"""Walking a batch: the tensors nested in the containers a ``collate`` returns, changed and put back in place.

Used to send tensors from worker processes cheaply and to move them to the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def map_tensors(batch: Any, change: Callable[[Any], Any], kind: type = torch.Tensor) -> Any:
    """``batch`` with ``change`` applied to every ``kind`` in it, nested in dicts, lists and tuples."""
    if isinstance(batch, kind):
        return change(batch)
    if isinstance(batch, dict):
        return type(batch)({key: map_tensors(value, change, kind) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(value, change, kind) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(map_tensors(value, change, kind) for value in batch)
    return batch


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor in ``batch`` moved to ``device``; through pinned memory, without blocking, on CUDA."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == device:
            return tensor
        if device.type == "cuda":
            pinned = tensor if tensor.is_pinned() else tensor.pin_memory()
            return pinned.to(device, non_blocking=True)
        return tensor.to(device)

    return map_tensors(batch, move)
