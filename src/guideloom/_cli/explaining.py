"""``guideloom explain STATE``: what the next batches of a saved loader state read, from the state alone.

The state names its storages and its order's settings, so the command rebuilds the loader (on the
CPU, no workers), resumes it from the state and asks it to ``explain``: nothing is read but indexes.
A state is read from a JSON file or from a torch checkpoint (``--key a.b`` says where it lies; without
it the one loader state inside is found).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guideloom._cli.plots import pyplot, save
from guideloom._core.errors import StateMismatchError
from guideloom._loading.reopen import loader_from_state, storages_of
from guideloom._loading.state import (
    BATCH_TOKENS,
    EPOCH,
    LOCAL_BATCH_SIZE,
    POSITION,
    SAMPLE_COUNT,
    SEED,
    SHUFFLE,
    SOURCE,
    VERSION_KEY,
    WORLD_SIZE,
)
from guideloom._remote.object_store import parse_storage_options

EXIT_OK = 0
STORAGE = "(storage)"  # how a single storage is called where a mixture names its component


def read_state(path: Path, key: str | None) -> dict[str, Any]:
    """The loader state in a JSON file or a torch checkpoint, at ``key`` (dotted) or the only one inside."""
    raw = path.read_bytes()
    try:
        document: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        document = _torch_checkpoint(path)
    if key is not None:
        for part in key.split("."):
            if isinstance(document, dict) and part in document:
                document = document[part]
            elif isinstance(document, list | tuple) and part.isdigit() and int(part) < len(document):
                document = document[int(part)]
            else:
                keys = f": it holds {', '.join(map(repr, document))}" if isinstance(document, dict) else ""
                raise ValueError(f"--key {key}: {path} has no {part!r} there{keys}")
        if not (isinstance(document, dict) and VERSION_KEY in document):
            raise ValueError(f"--key {key} of {path} is not a guideloom loader state")
        state: dict[str, Any] = document
        return state
    found = list(_states_in(document, ""))
    if len(found) != 1:
        where = f"several ({', '.join(place or 'the top' for place, _ in found)})" if found else "none"
        raise ValueError(f"{path} must hold one guideloom loader state, and holds {where}: say which with --key")
    only: dict[str, Any] = found[0][1]
    return only


def _torch_checkpoint(path: Path) -> Any:
    try:
        import torch
    except ImportError:
        raise ValueError(f"{path} is not JSON, and reading a torch checkpoint needs torch") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)  # never runs the file's code
    except Exception as error:
        raise ValueError(f"{path} is neither JSON nor a torch checkpoint of plain data: {error}") from None


def _states_in(document: Any, place: str, depth: int = 0) -> Any:
    """``(dotted key, state)`` of every loader state in ``document`` (a few levels deep)."""
    if isinstance(document, dict):
        if VERSION_KEY in document:
            yield place, document
            return
        if depth < 6:
            for key, value in document.items():
                yield from _states_in(value, f"{place}.{key}" if place else str(key), depth + 1)


def prepare_explain(arguments: argparse.Namespace) -> Callable[[], int]:
    state = read_state(Path(arguments.state), arguments.key)
    world_size = state.get(WORLD_SIZE)
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise StateMismatchError(f"the state's {WORLD_SIZE!r} is {world_size!r}, not what guideloom writes")
    if arguments.rank is not None and arguments.rank >= world_size:
        raise ValueError(f"--rank must be < the state's world_size ({world_size}), got {arguments.rank}")
    ranks = list(range(world_size)) if arguments.rank is None else [arguments.rank]
    options = parse_storage_options(arguments.storage_options)
    located = storages_of(state)

    def run() -> int:
        with loader_from_state(state, storage_options=options) as loader:
            per_rank = [loader.explain(arguments.batches, rank=rank) for rank in ranks]
        batches = [explained[number] for number in range(arguments.batches) for explained in per_rank]
        summary = Summary.of(state, batches) if arguments.summary or arguments.plot else None
        if arguments.json:
            document: Any = batches if summary is None else {"batches": batches, "summary": summary.as_json()}
            print(json.dumps(document, indent=2))
        else:
            print("\n".join(_heading(state, located)))
            if not arguments.summary:
                for batch in batches:
                    print("\n".join(_batch_lines(batch)))
        if summary is not None and arguments.summary and not arguments.json:
            print("\n".join(summary.lines()))
        if summary is not None and arguments.plot is not None:
            summary.plot(arguments.plot)
        return EXIT_OK

    return run


def _heading(state: dict[str, Any], located: dict[str | None, str]) -> list[str]:
    source = state[SOURCE]
    described = source.get("source", source)
    kind = source.get("component_kind", described.get("kind"))
    cut = f", sequence_length {described['sequence_length']}" if "sequence_length" in described else ""
    if None in located:
        reads = f"the storage at {located[None]} ({kind}{cut})"
    else:
        reads = f"a mixture of {', '.join(f'{name} ({path})' for name, path in located.items())}; {kind}{cut}"
    return [
        f"state:  epoch {state[EPOCH]}, position {state[POSITION]:,} of {state[SAMPLE_COUNT]:,} samples "
        f"(shuffle={state[SHUFFLE]}, seed={state[SEED]}); {_batches_of(state)} "
        f"on each of {state[WORLD_SIZE]} rank{'s' if state[WORLD_SIZE] != 1 else ''}",
        f"reads:  {reads}",
    ]


def _batches_of(state: dict[str, Any]) -> str:
    if state.get(BATCH_TOKENS) is not None:
        return f"batches of records up to {state[BATCH_TOKENS]} length units"
    return f"batches of {state[LOCAL_BATCH_SIZE]} samples"


def _piece_text(piece: dict[str, Any]) -> str:
    where = f"shard {piece['shard']}, record {piece['record']} (index {piece['index']})"
    if "source" in piece:  # an imported record: its input and row
        where += f" from {piece['source']['file']} row {piece['source']['row']}"
    return where if piece["stop"] is None else f"{where} [{piece['start']}:{piece['stop']}]"


def _batch_lines(batch: dict[str, Any]) -> list[str]:
    lines = ["", f"epoch {batch['epoch']}, batch {batch['batch']}, rank {batch['rank']}:"]
    for number, sample in enumerate(batch["samples"]):
        name = "" if sample["component"] is None else f"{sample['component']}: "
        lines.append(f"  {number:>3}  {name}{' + '.join(map(_piece_text, sample['pieces'])) or '(no tokens)'}")
    return lines


class Summary:
    """Samples and tokens per component over the explained batches, and what the schedule asked for."""

    def __init__(self, names: list[str], scheduled: list[list[float]], tokens: bool) -> None:
        self.names = names
        self.tokens = tokens
        self.scheduled = scheduled  # per batch, each component's weight in force
        self.samples: list[list[int]] = []  # per batch, each component's samples (all ranks)
        self.token_counts: list[list[int]] = []
        self.labels: list[str] = []

    @classmethod
    def of(cls, state: dict[str, Any], batches: list[dict[str, Any]]) -> Summary:
        source = state[SOURCE]
        mixture = source.get("kind") == "mixture"
        names = [entry[0] for entry in source["components"]] if mixture else [STORAGE]
        kind = source.get("component_kind", source.get("kind"))
        steps = sorted({(batch["epoch"], batch["batch"]) for batch in batches})
        global_batch = (state[LOCAL_BATCH_SIZE] or 0) * state[WORLD_SIZE]  # 0 by budget: the weights at the state
        scheduled = [
            _weights(source, epoch * state[SAMPLE_COUNT] + (number * global_batch if global_batch else state[POSITION]))
            if mixture
            else [1.0]
            for epoch, number in steps
        ]
        summary = cls(names, scheduled, kind != "documents")
        index = {step: row for row, step in enumerate(steps)}
        summary.samples = [[0] * len(names) for _ in steps]
        summary.token_counts = [[0] * len(names) for _ in steps]
        summary.labels = [f"{epoch}:{number}" for epoch, number in steps]
        for batch in batches:
            row = index[(batch["epoch"], batch["batch"])]
            for sample in batch["samples"]:
                k = 0 if sample["component"] is None else names.index(sample["component"])
                summary.samples[row][k] += 1
                summary.token_counts[row][k] += sum(
                    piece["stop"] - piece["start"] for piece in sample["pieces"] if piece["stop"] is not None
                )
        return summary

    def totals(self) -> list[tuple[str, int, int, float]]:
        """Per component: its samples, its tokens and the share the schedule asked for, over all batches."""
        batches = max(len(self.samples), 1)
        return [
            (
                name,
                sum(row[k] for row in self.samples),
                sum(row[k] for row in self.token_counts),
                sum(weights[k] for weights in self.scheduled) / batches,
            )
            for k, name in enumerate(self.names)
        ]

    def as_json(self) -> list[dict[str, Any]]:
        return [
            {
                "component": None if name == STORAGE else name,
                "samples": samples,
                "tokens": tokens if self.tokens else None,
                "scheduled": share,
            }
            for name, samples, tokens, share in self.totals()
        ]

    def lines(self) -> list[str]:
        totals = self.totals()
        samples = max(sum(row[1] for row in totals), 1)
        tokens = max(sum(row[2] for row in totals), 1)
        header = ["component", "samples", "share", *(["tokens", "share"] if self.tokens else []), "scheduled"]
        rows = [
            [name, f"{count:,}", f"{100 * count / samples:.1f}%"]
            + ([f"{used:,}", f"{100 * used / tokens:.1f}%"] if self.tokens else [])
            + [f"{100 * share:.1f}%"]
            for name, count, used, share in totals
        ]
        widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
        batches = len(self.samples)
        lines = [
            "",
            f"summary over {batches} batch{'es' if batches != 1 else ''}, {sum(r[1] for r in totals):,} samples:",
        ]
        return lines + ["  " + "  ".join(map(str.rjust, row, widths)) for row in [header, *rows]]

    def plot(self, path: Path) -> None:
        """Each component's share of every batch's samples (thin), its share so far (thick), its scheduled weight
        (dashed)."""
        figure, axis = pyplot().subplots(figsize=(9, 4.5))
        steps = list(range(len(self.samples)))
        colours = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
        for k, name in enumerate(self.names):
            colour = colours[k % len(colours)]
            per_batch = [row[k] / max(sum(row), 1) for row in self.samples]
            so_far, seen, total = [], 0, 0
            for row in self.samples:
                seen, total = seen + row[k], total + sum(row)
                so_far.append(seen / max(total, 1))
            axis.plot(steps, per_batch, color=colour, alpha=0.3, linewidth=1)
            axis.plot(steps, so_far, color=colour, linewidth=2.2, label=f"{name} (so far)")
            axis.step(
                steps,
                [w[k] for w in self.scheduled],
                where="post",
                color=colour,
                linestyle="--",
                label=f"{name} (scheduled)",
            )
        axis.set_ylim(0, 1.05)
        axis.set_xlabel("epoch:batch")
        axis.set_ylabel("share of samples")
        every = max(1, len(steps) // 10)
        axis.set_xticks(steps[::every], self.labels[::every])
        axis.legend(loc="upper right", fontsize="small", ncol=2)
        axis.set_title(f"share of each component over {len(steps)} batches (thin: each batch, thick: so far)")
        save(figure, path)


def _weights(source: dict[str, Any], sample: int) -> list[float]:
    """Each component's weight in force at global sample ``sample`` (its count per block, normalised)."""
    current: list[Any] = source["schedule"][0][1]
    for start, counts in source["schedule"]:
        if start <= sample:
            current = counts
    total = sum(current) if isinstance(current, list) else 0
    return [count / total for count in current] if total else [0.0] * len(source["components"])
