"""StatefulDataLoader: deterministic, distributed, exactly resumable batches from a storage.

The loader's whole state is (epoch, position): ``position`` counts the epoch's
positions consumed by all ranks together. Which samples a batch holds is a pure
function of that state and the configuration (see ``_sampling.epoch_order``), so a state dict
is a few integers, resuming costs O(1), and worker processes only ever change
where the work runs, never what a batch holds.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import torch

from guideloom._core.checks import check_bool, check_callable, check_int, check_number, check_seed
from guideloom._core.metrics import LoaderMetrics
from guideloom._fields.loading import record_loading
from guideloom._loading.batching import (
    EpochSteps,
    check_batch_sizes,
    check_budgets_for_documents,
    check_measured,
    check_some_batch,
)
from guideloom._loading.devices import check_device
from guideloom._loading.epoch_iterator import EpochIterator
from guideloom._loading.explain import DigestCache, Place, check_next_batch, explain_batches, skipped
from guideloom._loading.index_batches import index_batches
from guideloom._loading.make_source import make_source
from guideloom._loading.orders import choose_order, epoch_order
from guideloom._loading.ranks import check_process_group, resolve_ranks
from guideloom._loading.settings import LoaderSettings, OrderSettings, TransportSettings
from guideloom._loading.snapshot_broadcast import in_job
from guideloom._loading.state import build_state, check_state
from guideloom._loading.streaming import (
    check_windowed,
    in_machine_shares,
    local_world_size_of,
    prepare_streaming,
    read_plan,
)
from guideloom._loading.transport import Batcher, Transport, make_transport
from guideloom._mixture.mixture import Mixture
from guideloom._sources.source import SampleSource
from guideloom._sources.window_modes import window_mode
from guideloom._storage.storages import DocumentStorage, TokenStorage

SettingT = TypeVar("SettingT")
LOGGER = logging.getLogger("guideloom")


class _Setting(Generic[SettingT]):
    """A read-only attribute of a loader: one of the settings `from_storage` checked (``loader.settings``)."""

    def __init__(self, read: Callable[[LoaderSettings], SettingT]) -> None:
        self._read = read

    def __get__(self, loader: StatefulDataLoader, owner: type | None = None) -> SettingT:
        return self._read(loader.settings)


_END = object()  # no batch left


def format_metrics(metrics: dict[str, int | float]) -> str:
    """``name=value`` pairs of a loader's metrics, on one line."""
    return " ".join(
        f"{name}={value:.3f}" if isinstance(value, float) else f"{name}={value}" for name, value in metrics.items()
    )


class StatefulDataLoader:
    """Batches from a storage, checkpointable between batches and resumable bit for bit.

    Build it with :meth:`from_storage`. Iterating yields the rest of the current epoch; once an
    epoch is complete the next ``iter()`` starts the next one (reshuffled with ``shuffle=True``).
    """

    __module__ = "guideloom"  # its public home: reprs and pickles name it there

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # torch's habit, StatefulDataLoader(dataset, batch_size=...), would fail on an argument it never named
        if args and isinstance(args[0], DocumentStorage | TokenStorage | Mixture):
            raise TypeError(
                f"a loader over a {type(args[0]).__name__} is built with StatefulDataLoader.from_storage(storage, "
                "device=..., local_batch_size=..., ...), not StatefulDataLoader(storage, ...)"
            )
        return super().__new__(cls)

    def __init__(
        self,
        source: SampleSource,
        collate: Callable[[Any], Any] | None,
        settings: LoaderSettings,
        metrics: LoaderMetrics | None = None,
    ) -> None:
        """A loader reading ``source`` with ``settings``, which `from_storage` checked and made ready for each other;
        ``metrics`` counts from when the loader began to be made (by default: from now)."""
        self._closed = True  # until the transport exists: close() then releases only what was made
        self._metrics = LoaderMetrics() if metrics is None else metrics
        self._last_logged = time.monotonic()
        self._source = source
        self._next_epoch_source: SampleSource | None = None  # a grown storage's, while a state's epoch finishes
        self._collate = collate
        self.settings = settings
        self._epoch_machines: int | None = None  # a resumed windowed epoch's machine shares, until it ends
        self._ranks_to_check = settings.ranks_from_environment  # against a process group initialised later
        self.sample_count = source.sample_count
        if self.sample_count == 0:
            source.close()
            raise ValueError(f"{source} has no samples to load")
        try:
            check_some_batch(source, self._settings())  # with drop_last, an epoch may hold none
        except ValueError:
            source.close()
            raise
        self.epoch = 0
        self.position = 0
        self._generation = 0
        self._digests = DigestCache()
        self._length: tuple[int, SampleSource | None, int] = (-1, None, 0)  # len(self) of an epoch of a source
        self._transport = self._make_transport()
        self._closed = False

    # The settings from_storage checked, read-only: what users and integrations ask of a loader.
    device = _Setting(lambda settings: settings.transport.device)
    num_workers = _Setting(lambda settings: settings.transport.num_workers)
    rank = _Setting(lambda settings: settings.rank)
    sequence_length = _Setting(lambda settings: settings.sequence_length)
    shuffle = _Setting(lambda settings: settings.order.shuffle)
    seed = _Setting(lambda settings: settings.order.seed)
    local_batch_size = _Setting(lambda settings: settings.order.local_batch_size)
    batch_tokens = _Setting(lambda settings: settings.order.batch_tokens)
    world_size = _Setting(lambda settings: settings.order.world_size)
    local_world_size = _Setting(lambda settings: settings.order.local_world_size)
    drop_last = _Setting(lambda settings: settings.order.drop_last)
    shuffle_window = _Setting(lambda settings: settings.order.shuffle_window)

    def _make_transport(self) -> Transport:
        batcher, transport = Batcher(self._source, self._collate), self.settings.transport
        return make_transport(
            batcher,
            device=transport.device,
            num_workers=transport.num_workers,
            prefetch_factor=transport.prefetch_factor,
            timeout=transport.timeout,
            batch_bytes=self._source.sample_bytes * (self.local_batch_size or 0),
            worker_counts=self._metrics.add_from_worker,
        )

    @classmethod
    def from_storage(
        cls,
        storage: Any,
        collate: Callable[[Any], Any] | None = None,
        *,
        device: torch.device | str,
        local_batch_size: int | None = None,
        batch_tokens: int | None = None,
        sequence_length: int | None = None,
        window_dtype: torch.dtype | None = None,
        document_boundaries: bool = False,
        pack_documents: bool = False,
        pad_id: int = 0,
        long_documents: str | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        timeout: float = 0.0,
        shuffle_window: int | None = None,
        local_world_size: int | None = None,
        fields: tuple[str, ...] | None = None,
        decode: bool | dict[str, Any] = False,
        on_decode_error: str = "raise",
        log_metrics_every: float | None = None,
    ) -> StatefulDataLoader:
        """A loader over the shards of ``storage`` (a storage or a `Mixture` of storages) committed now.

        ``collate(samples)`` builds a batch (default: token windows stacked into an int64 tensor of
        shape ``(local_batch_size, sequence_length)``, or int32 with ``window_dtype=torch.int32``;
        documents as the list of decoded records);
        every tensor in it is moved to ``device``. ``batch_tokens=N`` instead of ``local_batch_size`` (documents
        only) gives each rank batches of consecutive records whose lengths sum to at most ``N`` (a longer record
        alone), the same number on every rank (docs/documents.md). ``num_workers`` > 0 decodes and collates in that
        many background processes, ``prefetch_factor`` batches ahead each. Token windows with the
        default collate are a plain memory copy: one background thread builds them instead, 16
        batches at a time. ``timeout`` (seconds, 0 = none) bounds the wait for a worker's batch.
        ``document_boundaries=True`` (the same windows, with where their documents start) or
        ``pack_documents=True`` (whole documents packed into rows, padded with ``pad_id``) give
        batches as a dict of ``input_ids``, ``position_ids``, ``labels``, ``cu_seqlens`` and
        ``max_seqlen`` (see docs/pretraining.md); ``long_documents`` ("split", "truncate" or "drop") says
        what packing does with a document longer than the row. A masked token storage (``loss_mask=True``)
        gives dict batches in every mode, with ``labels`` -100 where the mask is 0 (docs/tokens.md).
        ``shuffle_window=K`` (with ``shuffle=True``) reads each machine's own share of the shards, about K shards
        at a time, for storages larger than a machine's cache (docs/object-storage.md); ``local_world_size`` is
        the ranks per machine (default: ``LOCAL_WORLD_SIZE``, else 1). For storages of a ``guideloom.fields``
        ``RecordSchema`` (docs/multimodal.md): ``fields`` reads only those fields, ``decode=True`` decodes every media
        field in the workers before the collate (``decode={"image": fn}``: ``fn(value)`` for that field instead),
        and ``on_decode_error="skip"`` leaves a record that fails to decode out of its batch.
        ``log_metrics_every=SECONDS`` logs :meth:`metrics` (logger ``guideloom``, level INFO) when a batch is handed
        over at least that long after the last log.
        """
        metrics = LoaderMetrics()  # the loader's counts include what opening its source asks of the store
        collate = check_callable("collate", collate, optional=True)
        storage, collate = record_loading(
            storage, collate, fields=fields, decode=decode, on_decode_error=on_decode_error
        )
        device = check_device(device)
        local_batch_size, batch_tokens = check_batch_sizes(local_batch_size, batch_tokens)
        if batch_tokens is not None:
            check_budgets_for_documents(storage)
        num_workers = check_int("num_workers", num_workers, minimum=0)
        prefetch_factor = check_int("prefetch_factor", prefetch_factor, minimum=1)
        shuffle = check_bool("shuffle", shuffle)
        drop_last = check_bool("drop_last", drop_last)
        seed = check_seed(seed)
        timeout = check_number("timeout", timeout, minimum=0)
        if log_metrics_every is not None:
            log_metrics_every = check_number("log_metrics_every", log_metrics_every, minimum=0)
        rank, world_size, ranks_from_environment = resolve_ranks(rank, world_size)
        shuffle_window = check_windowed(storage, shuffle_window, shuffle)
        local_world_size = local_world_size_of(local_world_size, world_size, shuffle_window)
        mode = window_mode(
            {
                "document_boundaries": document_boundaries,
                "pack_documents": pack_documents,
                "pad_id": pad_id,
                "long_documents": long_documents,
            }
        )
        source = make_source(
            storage,
            mode,
            sequence_length=sequence_length,
            window_dtype=window_dtype,
            shuffle=shuffle,
            seed=seed,
            one_snapshot_per_job=in_job(rank, world_size),
        )
        if batch_tokens is not None:
            check_measured(source)
        try:
            kind = choose_order(source, shuffle, shuffle_window)
        except ValueError:
            source.close()
            raise
        order = OrderSettings(
            shuffle,
            seed,
            local_batch_size,
            world_size,
            drop_last,
            shuffle_window,
            local_world_size,
            batch_tokens=batch_tokens,
            kind=kind,
        )
        settings = LoaderSettings(
            order,
            TransportSettings(device, num_workers, prefetch_factor, timeout),
            rank,
            sequence_length,
            ranks_from_environment,
            log_metrics_every,
        )
        return cls(prepare_streaming(source, order), collate, settings, metrics)

    def _steps(self, start: int) -> EpochSteps:
        return EpochSteps(self._source, self._settings(), self.epoch, start)

    def __len__(self) -> int:
        """Batches this rank yields in a full epoch (with ``batch_tokens``: this epoch, whose lengths it reads once)."""
        epoch = self.epoch if self.batch_tokens is not None else 0  # (fixed batches: the same in every epoch)
        known_epoch, source, length = self._length
        if known_epoch != epoch or source is not self._source:
            length = self._steps(0).epoch_count()
            self._length = (epoch, self._source, length)
        return length

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch, or the next epoch if this one is complete."""
        self._check_open()
        if self._ranks_to_check:
            check_process_group(self.rank, self.world_size)
            self._ranks_to_check = False
        if self._steps(self.position).is_complete():
            self._start_next_epoch()
            self.position = 0
        self._generation += 1
        return EpochIterator(self._epoch_segment(self._generation))

    def _start_next_epoch(self) -> None:
        self.epoch += 1
        if not self.settings.order.kind.keeps_machine_shares:  # a windowed mixture's run keeps them (see streaming)
            self._epoch_machines = None
        if self._next_epoch_source is not None:  # shards added since the checkpoint join now
            source, self._next_epoch_source = self._next_epoch_source, None
            self._use_source(source)

    def _epoch_segment(self, generation: int) -> Iterator[Any]:
        steps = self._steps(self.position)
        if steps.fixed is None:
            yield from self._budget_segment(generation, steps)
            return
        plan = steps.fixed
        settings = self._settings()
        order = epoch_order(self._source, settings, self.epoch, plan.start)
        parts = read_plan(self._source, order, self.rank, settings.machines)
        index_arrays = index_batches(self._source, order, self.epoch, plan, self.rank)
        batches = self._transport.batches(index_arrays, self.epoch, parts)
        for end in plan.batch_ends():
            if generation != self._generation:
                raise RuntimeError("this iterator was superseded by a newer iter() or state of the same loader")
            asked = time.perf_counter()
            batch = next(batches)
            self._handed_over(asked)
            self.position = end
            yield batch

    def _budget_segment(self, generation: int, steps: EpochSteps) -> Iterator[Any]:
        """`_epoch_segment` for batches by budget: the steps are planned as the transport asks for them."""
        ends: deque[int] = deque()  # where the epoch continues after each batch planned and not yet yielded
        batches = self._transport.batches(steps.rank_indices(self.rank, ends), self.epoch)
        while True:
            asked = time.perf_counter()
            batch = next(batches, _END)
            if batch is _END:
                return
            self._handed_over(asked)
            if generation != self._generation:
                raise RuntimeError("this iterator was superseded by a newer iter() or state of the same loader")
            self.position = ends.popleft()
            yield batch

    def _handed_over(self, asked: float) -> None:
        """Count the wait for a batch asked for at ``asked`` (``perf_counter``), and log the metrics when it is time."""
        now = time.perf_counter()
        self._metrics.waited(now - asked)
        every = self.settings.log_metrics_every
        if every is not None and time.monotonic() - self._last_logged >= every:
            self._last_logged = time.monotonic()
            LOGGER.info("loader metrics (rank %d): %s", self.rank, format_metrics(self.metrics()))

    def metrics(self) -> dict[str, int | float]:
        """What this loader did since it was made, summed over its process and its worker processes: bytes
        downloaded and requests made to object stores, retries, cache hits, misses and evictions, records skipped, and
        ``wait_seconds`` (how long iteration waited for batches). A flat dict; :meth:`storage_metrics` splits the
        counts by storage. Counts of the loader's process include those of other loaders it runs meanwhile; a
        worker's arrive with its batches (docs/object-storage.md)."""
        return self._metrics.totals()

    def storage_metrics(self) -> dict[str, dict[str, int]]:
        """The counts of :meth:`metrics` for each storage read, keyed by its location (URL)."""
        return self._metrics.by_storage()

    def _settings(self) -> OrderSettings:
        """What the batches of the current epoch depend on (read in the machine shares of a resumed state's epoch)."""
        order = self.settings.order
        return order if self._epoch_machines is None else replace(order, epoch_machines=self._epoch_machines)

    def _place(self) -> Place:
        return Place(self.epoch, self.position, self._source, self._next_epoch_source or self._source)

    def explain(self, batches: int = 1, rank: int | None = None) -> list[dict[str, Any]]:
        """The next ``batches`` batches of ``rank`` (default: this loader's), described without reading them:
        ``{"epoch", "batch", "rank", "samples": [{"component", "pieces": [{"shard", "record", "start", "stop"}]}]}``
        per batch (see docs/debugging.md). Consumes nothing; continues across epoch ends as iteration does."""
        self._check_open()
        return explain_batches(self._place(), self._settings(), batches, self.rank if rank is None else rank)

    def skip(self, batches: int) -> None:
        """Move past the next ``batches`` batches (into the following epochs) without reading them: the state and
        every later batch are as if they had been read. An iterator open meanwhile is superseded."""
        self._check_open()
        batches = check_int("batches", batches, minimum=0)
        epoch, position, later_epoch = skipped(self._place(), self._settings(), batches)
        if (epoch, position) != (self.epoch, self.position):
            if later_epoch:
                self._start_next_epoch()
            self.epoch, self.position = epoch, position
            self._generation += 1

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch yielded: small, JSON-serialisable, equal on every rank."""
        next_batch = self._digests.of(self._source, self._settings(), self.epoch, self.position)
        return build_state(self._settings(), self._source, self.epoch, self.position, next_batch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken; another world or batch size keeps the sample position."""
        self._check_open()
        latest = self._next_epoch_source or self._source
        resume = check_state(state, self._settings(), latest)
        settings = replace(self._settings(), epoch_machines=resume.machines)
        shares = in_machine_shares(latest, settings)  # a windowed mixture is read in the state's shares
        rest = shares if resume.source is latest else in_machine_shares(resume.source, settings)
        resume, latest = replace(resume, source=rest), shares
        check_next_batch(state, resume.source, settings, resume.epoch, resume.position)
        if resume.source is not self._source:  # e.g. the shards a grown storage had at the checkpoint
            self._use_source(resume.source, keep=latest)
        self._next_epoch_source = latest if resume.source is not latest else None
        self.epoch, self.position = resume.epoch, resume.position
        self._epoch_machines = resume.machines
        self._generation += 1

    def _use_source(self, source: SampleSource, keep: SampleSource | None = None) -> None:
        """Read ``source`` from now on, closing the one read so far unless it is ``keep`` (and the transport)."""
        self._transport.close()
        if self._source is not keep:
            self._source.close()
        self._source, self.sample_count = source, source.sample_count
        self._transport = self._make_transport()

    def close(self) -> None:
        """Stop every worker and release every file."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._generation += 1
        self._transport.close()
        self._source.close()
        if self._next_epoch_source is not None:
            self._next_epoch_source.close()

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
