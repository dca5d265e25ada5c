"""StatefulDataLoader: deterministic, distributed, exactly resumable batches from a storage.

The loader's whole state is (epoch, position): ``position`` counts the epoch's
positions consumed by all ranks together. Which samples a batch holds is a pure
function of that state and the configuration (see ``_order``), so a state dict
is a few integers, resuming costs O(1), and worker processes only ever change
where the work runs, never what a batch holds.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from types import TracebackType
from typing import Any

import numpy as np
import torch
import torch.distributed
import torch.utils.data

from guideloom._errors import StateMismatchError
from guideloom._order import BatchPlan, EpochOrder
from guideloom._samples import Batcher, SampleSource, make_source

STATE_VERSION = 1
THREAD_GROUP = 16  # batches built together, up to GROUP_BYTES of token windows
GROUP_BYTES = 8 * 1024 * 1024


def _positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int, bool]:
    """Explicit values, else an initialised torch.distributed group, else RANK/WORLD_SIZE, else 0/1.

    Never a guess: ``WORLD_SIZE`` > 1 without ``RANK`` (as Lightning's launcher leaves it before the
    process group exists) is an error. The last value says whether the ranks came from the environment.
    """
    if rank is None and world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size(), True
        rank, world_size = _environment_ranks()
        implicit = True
    elif rank is None or world_size is None:
        raise ValueError("rank and world_size must be given together (or both omitted)")
    else:
        implicit = False
    world_size = _positive_int("world_size", world_size)
    rank = _positive_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    return rank, world_size, implicit


def _environment_ranks() -> tuple[int, int]:
    """RANK and WORLD_SIZE from the environment; 0 of 1 when neither is set."""
    values = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")}
    try:
        rank, world_size = int(values["RANK"] or 0), int(values["WORLD_SIZE"] or 1)
    except ValueError:
        raise ValueError("the RANK and WORLD_SIZE environment variables must be integers") from None
    if values["RANK"] is None and world_size > 1:
        raise ValueError(
            f"WORLD_SIZE={world_size} is set but RANK is not, and torch.distributed is not initialised, so "
            "this process's rank is unknown: build the loader after init_process_group (under Lightning, "
            "inside train_dataloader()), or pass rank= and world_size="
        )
    return rank, world_size


def _check_process_group(rank: int, world_size: int) -> None:
    """Refuse ranks that an initialised process group contradicts: the ranks would read overlapping data."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    group = (torch.distributed.get_rank(), torch.distributed.get_world_size())
    if group != (rank, world_size):
        raise ValueError(
            f"this loader took rank {rank} of {world_size} from the environment when it was created, but the "
            f"initialised process group says rank {group[0]} of {group[1]}: build the loader after "
            "init_process_group, or pass rank= and world_size="
        )


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


class _WireArray:
    """A CPU tensor crossing from a worker process as a NumPy array.

    torch sends tensors between processes through a new shared-memory file each, which costs far
    more than pickling the bytes through the pipe for batch-sized tensors (benchmarks/README.md).
    """

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


def _to_wire(tensor: torch.Tensor) -> Any:
    if type(tensor) is not torch.Tensor or tensor.device.type != "cpu" or tensor.requires_grad:
        return tensor
    try:
        return _WireArray(tensor.numpy())
    except (TypeError, RuntimeError):  # dtypes NumPy lacks (bfloat16, ...) keep torch's own transport
        return tensor


def _from_wire(wire: _WireArray) -> torch.Tensor:
    return torch.from_numpy(wire.array)


class _IndexDataset(torch.utils.data.Dataset[Any]):
    """Map-style view for torch's DataLoader: item = a whole batch, keyed by its sample indices."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher

    def __getitem__(self, indices: Any) -> Any:
        return map_tensors(self.batcher(indices), _to_wire)


def _unchanged(batch: Any) -> Any:
    """torch's collate step: our batches are collated already (and must not be converted)."""
    return batch


class _CurrentEpochBatches:
    """torch's batch sampler: yields the index arrays of whatever epoch segment the loader set."""

    def __init__(self) -> None:
        self.batches: Iterator[np.ndarray] = iter(())

    def __iter__(self) -> Iterator[Any]:
        # torch's DataLoader treats each yielded item as one dataset key (batch_size=None).
        return self.batches


def _group_sizes(largest: int) -> Iterator[int]:
    """1, 2, 4, ... up to ``largest``, then ``largest`` for ever: the first batch comes as soon as it can."""
    size = 1
    while True:
        yield size
        size = min(2 * size, largest)


def _grouped(batcher: Batcher, index_batches: Iterator[np.ndarray], group_size: int) -> Iterator[Any]:
    """Batches in order, built up to ``group_size`` at a time (token windows are then fetched in one go)."""
    for size in _group_sizes(group_size):
        group = list(islice(index_batches, size))
        if not group:
            return
        try:
            built: Iterable[Any] = batcher.many(group)
        except Exception:  # build them one by one, so the error surfaces at the batch it belongs to
            built = map(batcher, group)
        yield from built


def _prefetched(
    thread: ThreadPoolExecutor, batcher: Batcher, index_batches: Iterator[np.ndarray], group_size: int, depth: int
) -> Iterator[Any]:
    """Batches in order, built ahead by a background thread in groups of up to ``group_size``.

    Groups keep the hand-off cost per batch small; ``depth`` groups are in flight at most.
    """
    pending: deque[tuple[list[np.ndarray], Future[list[Any]]]] = deque()
    for size in _group_sizes(group_size):
        group = list(islice(index_batches, size))
        if group:
            pending.append((group, thread.submit(batcher.many, group)))
        if not pending:
            return
        if len(pending) >= depth or not group:
            built_group, future = pending.popleft()
            try:
                built: Iterable[Any] = future.result()
            except Exception:  # again one by one, so the error surfaces at the batch it belongs to
                built = map(batcher, built_group)
            yield from built


class StatefulDataLoader:
    """Batches from a storage, checkpointable between batches and resumable bit for bit.

    Build it with :meth:`from_storage`. Iterating yields the rest of the current epoch; once an
    epoch is complete the next ``iter()`` starts the next one (reshuffled with ``shuffle=True``).
    """

    def __init__(
        self,
        source: SampleSource,
        collate: Callable[[Any], Any] | None,
        *,
        device: torch.device,
        local_batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        rank: int,
        world_size: int,
        num_workers: int,
        prefetch_factor: int,
        timeout: float,
        ranks_from_environment: bool = False,
    ) -> None:
        self._source = source
        self._batcher = Batcher(source, collate)
        self.device = device
        self.local_batch_size = local_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self._ranks_to_check = ranks_from_environment  # against a process group initialised later
        self.num_workers = num_workers
        self.sample_count = source.sample_count
        if self.sample_count == 0:
            source.close()
            raise ValueError(f"the storage at {source.storage.location} has no samples to load (empty storage)")
        self._fingerprint = source.reader.fingerprint
        self.epoch = 0
        self.position = 0
        self._generation = 0
        self._segment = _CurrentEpochBatches()
        self._torch_loader: torch.utils.data.DataLoader[Any] | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._prefetch_depth = max(2, prefetch_factor)
        if num_workers > 0 and self._batcher.builds_groups:
            # Token windows are a memory copy that releases the GIL: one background thread beats worker
            # processes (whose queues pickle every batch) and beats more threads, which only contend for
            # the GIL (measured in benchmarks/README.md).
            self._threads = ThreadPoolExecutor(1, thread_name_prefix="guideloom-loader")
        elif num_workers > 0:
            self._torch_loader = torch.utils.data.DataLoader(
                _IndexDataset(self._batcher),
                batch_size=None,
                sampler=self._segment,
                num_workers=num_workers,
                collate_fn=_unchanged,
                prefetch_factor=prefetch_factor,
                persistent_workers=True,
                timeout=timeout,
            )
        self._closed = False

    @classmethod
    def from_storage(
        cls,
        storage: Any,
        collate: Callable[[Any], Any] | None = None,
        *,
        device: torch.device | str,
        local_batch_size: int,
        sequence_length: int | None = None,
        window_dtype: torch.dtype | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        timeout: float = 0.0,
    ) -> StatefulDataLoader:
        """A loader over the shards of ``storage`` committed now.

        ``collate(samples)`` builds a batch (default: token windows stacked into an int64 tensor of
        shape ``(local_batch_size, sequence_length)``, or int32 with ``window_dtype=torch.int32``;
        documents as the list of decoded records);
        every tensor in it is moved to ``device``. ``num_workers`` > 0 decodes and collates in that
        many background processes, ``prefetch_factor`` batches ahead each. Token windows with the
        default collate are a plain memory copy: one background thread builds them instead, 16
        batches at a time. ``timeout`` (seconds, 0 = none) bounds the wait for a worker's batch.
        """
        if collate is not None and not callable(collate):
            raise TypeError(f"collate must be callable or None, got {type(collate).__name__}")
        try:
            device = torch.device(device)
        except (TypeError, RuntimeError) as error:
            raise ValueError(f"device must be a torch.device or a device string: {error}") from None
        local_batch_size = _positive_int("local_batch_size", local_batch_size)
        num_workers = _positive_int("num_workers", num_workers, minimum=0)
        prefetch_factor = _positive_int("prefetch_factor", prefetch_factor)
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {type(drop_last).__name__}")
        seed = _positive_int("seed", seed, minimum=-(2**63))
        if not isinstance(timeout, int | float) or timeout < 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        rank, world_size, ranks_from_environment = _resolve_ranks(rank, world_size)
        source = make_source(storage, sequence_length, window_dtype)
        return cls(
            source,
            collate,
            device=device,
            local_batch_size=local_batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            timeout=float(timeout),
            ranks_from_environment=ranks_from_environment,
        )

    @property
    def sequence_length(self) -> int | None:
        return getattr(self._source, "sequence_length", None)

    def _plan(self, start: int) -> BatchPlan:
        return BatchPlan(self.sample_count, self.local_batch_size, self.world_size, self.drop_last, start)

    def __len__(self) -> int:
        """Batches this rank yields in a full epoch."""
        return self._plan(0).full_epoch_batch_count

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch, or the next epoch if this one is complete."""
        self._check_open()
        if self._ranks_to_check:
            _check_process_group(self.rank, self.world_size)
            self._ranks_to_check = False
        if self._plan(self.position).batch_count == 0:
            self.epoch += 1
            self.position = 0
        self._generation += 1
        return self._epoch_segment(self._generation)

    def _epoch_segment(self, generation: int) -> Iterator[Any]:
        plan = self._plan(self.position)
        order = EpochOrder(self.sample_count, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)
        index_batches = self._index_batches(plan, order)
        window_bytes = 8 * (self.sequence_length or 0) * self.local_batch_size  # int64, or less
        group_size = max(1, min(THREAD_GROUP, GROUP_BYTES // max(1, window_bytes)))
        if self._threads is not None:
            batches: Iterator[Any] = _prefetched(
                self._threads, self._batcher, index_batches, group_size, self._prefetch_depth
            )
        elif self._torch_loader is None and self._batcher.builds_groups:
            batches = _grouped(self._batcher, index_batches, group_size)
        elif self._torch_loader is None:
            batches = map(self._batcher, index_batches)
        else:
            self._segment.batches = index_batches
            batches = (map_tensors(batch, _from_wire, _WireArray) for batch in self._torch_loader)
        positions_after = range(plan.start + plan.global_batch_size, self.sample_count, plan.global_batch_size)
        for batch_number in range(plan.batch_count):
            if generation != self._generation:
                raise RuntimeError("this iterator was superseded by a newer iter() or state of the same loader")
            batch = next(batches)
            last = batch_number == plan.batch_count - 1
            self.position = self.sample_count if last else positions_after[batch_number]  # plan.batch_end, inlined
            yield move_to_device(batch, self.device)

    def _index_batches(self, plan: BatchPlan, order: EpochOrder) -> Iterator[np.ndarray]:
        """This rank's sample indices batch by batch, permuted many batches at a time (it is vectorised)."""
        chunk = max(1, 4096 // self.local_batch_size)
        for first in range(0, plan.full_batch_count, chunk):
            stop = min(first + chunk, plan.full_batch_count)
            yield from order.sample_at(plan.full_rank_positions(first, stop, self.rank))
        if plan.full_batch_count < plan.batch_count:  # the last batch may be short and padded
            yield order.sample_at(plan.rank_positions(plan.batch_count - 1, self.rank))

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch yielded: small, JSON-serialisable, equal on every rank."""
        return {
            "guideloom_loader_state": STATE_VERSION,
            "epoch": self.epoch,
            "position": self.position,
            "sample_count": self.sample_count,
            "storage": self._fingerprint,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "sequence_length": self.sequence_length,
            "local_batch_size": self.local_batch_size,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken; another world or batch size keeps the sample position."""
        self._check_open()
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        if state.get("guideloom_loader_state") != STATE_VERSION:
            raise StateMismatchError(
                f"not a guideloom loader state of version {STATE_VERSION}: "
                f"'guideloom_loader_state' is {state.get('guideloom_loader_state')!r}"
            )
        mine = self.state_dict()
        for key in ("storage", "sample_count", "shuffle", "seed", "sequence_length"):
            if key not in state:
                raise StateMismatchError(f"the state has no {key!r}")
            if state[key] != mine[key] or type(state[key]) is not type(mine[key]):
                raise StateMismatchError(
                    f"the state was taken with {key}={state[key]!r}, but this loader has {key}={mine[key]!r}"
                )
        epoch, position = state.get("epoch"), state.get("position")
        for key, value in (("epoch", epoch), ("position", position)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StateMismatchError(f"the state's {key} must be a non-negative int, got {value!r}")
        assert isinstance(epoch, int) and isinstance(position, int)
        if position > self.sample_count:
            raise StateMismatchError(f"the state's position {position} exceeds the epoch's {self.sample_count} samples")
        self.epoch, self.position = epoch, position
        self._generation += 1

    def close(self) -> None:
        """Stop every worker and release every file."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._generation += 1
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
        if self._torch_loader is not None:
            iterator = getattr(self._torch_loader, "_iterator", None)
            if iterator is not None:
                iterator._shutdown_workers()  # torch shuts persistent workers down only on garbage collection
            self._torch_loader = None
        self._source.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this loader is closed")

    def __enter__(self) -> StatefulDataLoader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self, finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        if not finalizing():  # at interpreter exit the OS releases everything, and modules are torn down
            self.close()
