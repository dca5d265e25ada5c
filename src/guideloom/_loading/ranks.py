"""Which rank of how many a loader is: given, from an initialised process group, or from the environment."""

from __future__ import annotations

import os

import torch
import torch.distributed

from guideloom._core.checks import check_int


def resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int, bool]:
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
    world_size = check_int("world_size", world_size, minimum=1)
    rank = check_int("rank", rank, minimum=0)
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
    if world_size < 1 or not 0 <= rank < world_size:  # said in the variables' names: no argument was passed
        said = " and ".join(f"{name}={value}" for name, value in values.items() if value is not None)
        raise ValueError(f"the environment says {said}: WORLD_SIZE must be 1 or more and RANK from 0 to WORLD_SIZE - 1")
    if values["RANK"] is None and world_size > 1:
        raise ValueError(
            f"WORLD_SIZE={world_size} is set but RANK is not, and torch.distributed is not initialised, so "
            "this process's rank is unknown: build the loader after init_process_group (under Lightning, "
            "inside train_dataloader()), or pass rank= and world_size="
        )
    return rank, world_size


def check_process_group(rank: int, world_size: int) -> None:
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
