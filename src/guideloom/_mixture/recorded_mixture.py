"""What a state records of a mixture, checked against the mixture a loader reads now.

A mixture's state names its components (with their shard ranges and sample counts), how their samples
are cut, its block size and its schedule. Resuming refuses a state of other components, another cut or
block size, or a schedule that differs before the state's position (the weights may change only from
there on); whether the components' shards are still those the state read is `MixtureSource.resumed`'s.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from guideloom._core.errors import StateMismatchError
from guideloom._mixture.mixture import Mixture

KIND = "mixture"  # the kind a mixture's state records


def check_recorded_mixture(recorded: object, mine: dict[str, Any], names: Sequence[str], reading: object) -> None:
    """StateMismatchError unless ``recorded`` is the state of a mixture of the components ``names``, cut and
    blocked as ``mine`` (the identity of the mixture ``reading`` now)."""
    if not isinstance(recorded, dict) or recorded.get("kind") != KIND:
        kind = recorded.get("kind") if isinstance(recorded, dict) else recorded
        raise StateMismatchError(f"the state was taken from a source of kind {kind!r}, this loader reads {reading}")
    entries = recorded.get("components")
    if not isinstance(entries, list) or not all(
        isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) for entry in entries
    ):
        raise StateMismatchError(f"the state's mixture components {entries!r} are not what guideloom writes")
    recorded_names = [entry[0] for entry in entries]
    if recorded_names != list(names):
        raise StateMismatchError(
            f"the state was taken from a mixture of {recorded_names}, this loader reads one of {list(names)}"
        )
    for key in ("block_size", "source"):
        if recorded.get(key) != mine[key]:
            raise StateMismatchError(
                f"the state was taken with the mixture's {key}={recorded.get(key)!r}, this loader has {mine[key]!r}"
            )


def check_schedule(recorded: dict[str, Any], mixture: Mixture, epoch: int | None, position: int | None) -> None:
    """StateMismatchError if ``mixture``'s schedule differs from the recorded one before the state's global
    position (anywhere, when the position is not given)."""
    stages = recorded.get("schedule")
    if not isinstance(stages, list) or not all(
        isinstance(stage, list) and len(stage) == 2 and isinstance(stage[0], int) for stage in stages
    ):
        raise StateMismatchError(f"the state's mixture schedule {stages!r} is not one guideloom writes")
    samples_per_epoch = recorded.get("samples_per_epoch")
    if isinstance(samples_per_epoch, bool) or not isinstance(samples_per_epoch, int) or samples_per_epoch < 1:
        raise StateMismatchError(f"the state's samples_per_epoch {samples_per_epoch!r} is not a positive int")
    before = None if epoch is None or position is None else epoch * samples_per_epoch + position
    mine = mixture.schedule.to_json()
    if any(isinstance(stage[1], str) for stage in stages):  # guideloom 0.2 recorded a digest of each stage
        mine = _stage_digests(mine)
    block = mixture.block_size
    boundaries = sorted({stage[0] for stage in stages} | {stage[0] for stage in mine})
    for start in boundaries:
        if before is not None and start >= -(-before // block) * block:
            return
        if _in_force(stages, start) != _in_force(mine, start):
            where = "" if before is None else f", before the state's position (global sample {before})"
            raise StateMismatchError(
                f"the mixture's weights in force at global sample {start} differ from the state's{where}: a "
                "resumed loader may change the schedule only from its position on"
            )


def _stage_digests(schedule: list[list[Any]]) -> list[list[Any]]:
    """Each stage as ``[start, crc of its counts]``, as states of guideloom 0.2 recorded a schedule."""
    return [[start, f"{zlib.crc32(repr(counts).encode()):08x}"] for start, counts in schedule]


def _in_force(stages: list[list[Any]], sample: int) -> Any:
    """The digest of the stage in force at global sample ``sample``."""
    current = None
    for start, digest in stages:
        if start > sample:
            break
        current = digest
    return current
