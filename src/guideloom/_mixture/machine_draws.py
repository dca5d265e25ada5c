"""A windowed mixture: every machine blends the components by itself, each component read in its own windows.

With ``shuffle_window=K`` the loader hands a mixture *machine slots* (`WindowedOrder.stream_slots`): slot ``v``
of epoch ``e`` is sample ``e × share + v // machines`` of machine ``s = v % machines`` (``share``: machine
``s``'s slots per epoch). Each machine runs the mixture's blocks over its own samples, a stage starting where the
machine is when the mixture reaches the stage's global start, so its ``j``-th draw of component ``k`` is closed
form, and that draw is offset ``j % n`` of the machine's stream in the component's windowed pass ``j // n``
(``n``: the stream's length). A pass's streams are disjoint shares of the component: over all machines a pass
reads each of its samples exactly once, and each machine reads only its own share, about K shards of each
component at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from guideloom._mixture.mixture_order import MixtureOrder
from guideloom._sampling.windowed_order import WindowedOrder, taken_from_stream

__all__ = ["MachineDraws"]

_CACHED_PASSES = 16  # windowed passes kept (each lays out its shares once)


class MachineDraws:
    """Where each machine slot of a windowed mixture's epoch lies: its component and the sample there.

    ``shard_counts`` and ``clean_cuts`` are each component's per-shard sample counts and clean cuts (as a
    windowed order of that storage alone takes them); ``order`` is the mixture's own order (schedule, sizes, seeds).
    """

    def __init__(
        self,
        order: MixtureOrder,
        shard_counts: Sequence[npt.NDArray[np.int64]],
        clean_cuts: Sequence[npt.NDArray[np.int64] | None],
        sample_count: int,
        *,
        window: int,
        machines: int,
    ) -> None:
        schedule = order.schedule
        self.window, self.machines = window, machines
        self.epoch_shares = taken_from_stream(sample_count, np.arange(machines), machines)
        # A stage starts on each machine where that machine is when the mixture reaches the stage's global start.
        epochs, positions = np.divmod(schedule.starts, sample_count)
        self.orders = [
            MixtureOrder(
                schedule.restarted_at(
                    epochs * self.epoch_shares[machine] + taken_from_stream(positions, machine, machines)
                ),
                order.sizes.tolist(),
                shuffle=True,
                seed=order.seed,
            )
            for machine in range(machines)
        ]
        self.seeds = [seed - (1 << 64) if seed >= 1 << 63 else seed for seed in order.component_seeds]
        self.shard_counts, self.clean_cuts = list(shard_counts), list(clean_cuts)
        every = np.arange(machines, dtype=np.int64)
        self.stream_lengths = taken_from_stream(order.sizes[:, None], every[None, :], machines)  # component × machine
        for k, name in enumerate(schedule.names):
            if schedule.counts[:, k].any() and int(order.sizes[k]) < machines:
                raise ValueError(
                    f"component {name!r} has {int(order.sizes[k])} samples, fewer than the {machines} machines that "
                    "share each of its passes with shuffle_window: read it with the global order (shuffle_window=None)"
                )
        self._passes: OrderedDict[tuple[int, int], WindowedOrder] = OrderedDict()

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_passes": OrderedDict()}

    def locate(self, slots: npt.ArrayLike, epoch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The component of each machine slot of epoch ``epoch`` and the index of its sample within that component."""
        machine, offset = np.divmod(np.asarray(slots, np.int64).reshape(-1), self.machines)
        offset, machine = machine, offset  # (divmod gives the offset first)
        local = epoch * self.epoch_shares[machine] + offset  # the machine's own sample number since the run began
        components, draws = np.empty_like(local), np.empty_like(local)
        for each in np.unique(machine).tolist():
            mask = machine == each
            components[mask], draws[mask] = self.orders[each].draws(local[mask])
        passes, within = np.divmod(draws, np.maximum(self.stream_lengths[components, machine], 1))
        samples = np.empty_like(within)
        count = len(self.seeds)
        keys = (passes * count + components) * self.machines + machine
        for key in np.unique(keys).tolist():
            mask = keys == key
            rest, stream = divmod(key, self.machines)
            pass_number, component = divmod(rest, count)
            samples[mask] = self._pass(component, pass_number).stream_samples(stream, within[mask])
        return components, samples

    def _pass(self, component: int, pass_number: int) -> WindowedOrder:
        """The windowed order of a component's pass, its streams the machines' shares."""
        key = (component, pass_number)
        found = self._passes.get(key)
        if found is None:
            found = self._passes[key] = WindowedOrder(
                self.shard_counts[component],
                seed=self.seeds[component],
                epoch=pass_number,
                window=self.window,
                streams=self.machines,
                global_batch_size=1,
                clean_cuts=self.clean_cuts[component],
            )
            while len(self._passes) > _CACHED_PASSES:
                self._passes.popitem(last=False)
        self._passes.move_to_end(key)
        return found
