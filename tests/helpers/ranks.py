"""Real torch.distributed ranks on this machine: spawned processes in one gloo process group.

``run_ranks(body, world_size, *arguments, out=...)`` runs ``body(rank, world_size, *arguments)`` in every rank,
the process group initialised first, and returns what each rank's body returned (gathered as JSON by rank 0 into
``out``), in rank order. ``body`` is a function at the top of a test module, so that spawned ranks import it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.processes import free_port, gather_to_file

_port: int | None = None  # the process group's rendezvous port, in a rank's process


def join_group(rank: int, world_size: int) -> None:
    """Initialise this rank's process group (a body started with ``in_group=False`` calls it when it is ready)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_port}", rank=rank, world_size=world_size)


def _rank_main(
    rank: int,
    body: Callable[..., Any],
    world_size: int,
    port: int,
    out: str | None,
    arguments: tuple[Any, ...],
    in_group: bool,
) -> None:
    import torch.distributed as dist

    global _port
    _port = port
    try:
        if in_group:
            join_group(rank, world_size)
        result = body(rank, world_size, *arguments)
        if out is not None:
            gather_to_file(result, out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def start_ranks(
    body: Callable[..., Any], world_size: int, *arguments: Any, out: Path | None = None, in_group: bool = True
) -> Any:
    """Start the ranks without waiting for them: torch's process context (``join()`` it until it says True).
    ``in_group=False``: each body initialises its process group itself, by :func:`join_group`."""
    import torch.multiprocessing as mp

    return mp.start_processes(
        _rank_main,
        args=(body, world_size, free_port(), None if out is None else str(out), arguments, in_group),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )


def run_ranks(
    body: Callable[..., Any], world_size: int, *arguments: Any, out: Path, in_group: bool = True
) -> list[Any]:
    """Run ``body(rank, world_size, *arguments)`` in ``world_size`` ranks; what each returned, in rank order."""
    context = start_ranks(body, world_size, *arguments, out=out, in_group=in_group)
    while not context.join():
        pass
    result: list[Any] = json.loads(out.read_text())
    return result
