"""How a built batch, or the error raised building it, crosses from a worker process to the training process.

Small tensors and arrays cross the pipe as NumPy arrays (torch's own shared-memory hand-over costs more
than they are worth); large arrays cross in shared memory and are NumPy arrays again on arrival. An
exception crosses as its type, state and the worker's traceback, rebuilt without calling its constructor.
"""

from __future__ import annotations

import contextlib
import pickle
import traceback
from typing import Any

import numpy as np
import torch
import torch.utils.data

from guideloom._loading.devices import moves_itself

# From this size on a tensor or array leaves a worker through shared memory instead of the pipe: one copy
# into a shared segment and its descriptor fetched from the worker (a fixed cost of about a millisecond on
# a busy machine), against four copies through pickle and the pipe (benchmarks/bench_documents.py).
SHARED_MEMORY_BYTES = 2**20


class WireArray:
    """A small CPU tensor crossing from a worker process as a NumPy array, pickled through the pipe.

    torch sends a tensor between processes as a shared-memory segment whose descriptor the receiver
    fetches from the sender, a fixed cost of a few hundred microseconds that small tensors do not repay.
    """

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def received(self) -> torch.Tensor:
        return torch.from_numpy(self.array)


class SharedArray:
    """A large NumPy array crossing from a worker process in a shared-memory tensor; a NumPy array again on arrival."""

    def __init__(self, array: np.ndarray) -> None:
        tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
        self.tensor: torch.Tensor = tensor.share_memory_()  # type: ignore[no-untyped-call]

    def received(self) -> np.ndarray:
        array: np.ndarray = self.tensor.numpy()
        return array


def to_wire(value: Any) -> Any:
    """A leaf of a built batch as it best crosses to the training process."""
    if isinstance(value, np.ndarray):
        if value.nbytes < SHARED_MEMORY_BYTES or value.dtype.hasobject or type(value) is not np.ndarray:
            return value
        try:
            return SharedArray(np.ascontiguousarray(value))
        except TypeError:  # dtypes torch lacks (strings, datetimes, ...) go through the pipe
            return value
    if type(value) is not torch.Tensor or value.device.type != "cpu" or value.requires_grad:
        return value
    if value.nbytes >= SHARED_MEMORY_BYTES:
        return value  # torch's own transport: the tensor's storage moves to shared memory
    try:
        return WireArray(value.numpy())
    except (TypeError, RuntimeError):  # dtypes NumPy lacks (bfloat16, ...) keep torch's own transport
        return value


def is_sent_leaf(value: object) -> bool:
    """What `to_wire` looks at: tensors and objects that move themselves (which cross whole), NumPy arrays."""
    return moves_itself(value) or isinstance(value, np.ndarray)


def from_wire(wire: WireArray | SharedArray) -> Any:
    return wire.received()


def is_wire(value: object) -> bool:
    return isinstance(value, WireArray | SharedArray)


class _Message(str):
    """A message that a KeyError shows as it is, not quoted with its line breaks escaped."""

    def __repr__(self) -> str:
        return str(self)


class WorkerError:
    """An exception raised while building a batch in a worker process, sent back as the batch.

    torch's own transport re-raises it by calling the exception's class with one message, which
    fails for classes whose constructor takes other arguments and then raises a RuntimeError
    instead. This rebuilds the same type without calling its constructor, and its message
    carries the worker's original traceback.
    """

    def __init__(self, error: Exception) -> None:
        worker = torch.utils.data.get_worker_info()
        where = f"in DataLoader worker process {worker.id if worker is not None else '?'}"
        self.message = f"Caught {type(error).__name__} {where}.\nOriginal {traceback.format_exc()}"
        self.kind: type[Exception] | None = type(error)
        self.state = dict(vars(error)) if hasattr(error, "__dict__") else {}
        try:
            pickle.dumps((self.kind, self.state))
        except Exception:  # a class defined in a function, an attribute that cannot cross: keep the message only
            self.kind, self.state = None, {}

    def error(self) -> Exception:
        """The exception to raise in the training process: the same type, the worker's traceback in its message."""
        message = _Message(self.message) if self.kind is not None and issubclass(self.kind, KeyError) else self.message
        if self.kind is None:
            return RuntimeError(message)
        try:
            error = self.kind.__new__(self.kind, message)
        except Exception:  # a __new__ that wants other arguments
            return RuntimeError(message)
        error.args = (message,)
        with contextlib.suppress(AttributeError, TypeError):  # __slots__ or read-only attributes keep their default
            vars(error).update(self.state)
        return error
