"""The table and the plot of ``bench_streaming``: guideloom's two orders and the peers, row by row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SEQUENCE, BATCH = 2049, 8

LABELS = {
    "global": "guideloom, global order",
    "windowed": "guideloom, shuffle_window=K",
    "litdata": "LitData",
    "mosaic": "Mosaic, default (py1e)",
    "mosaic-py1e": "Mosaic py1e, block of K shards",
    "mosaic-py1s": "Mosaic py1s, K canonical nodes a machine",
}


def label(order: str) -> str:
    """A row's reader in words (a resumed row keeps its suffix)."""
    name, _, rest = order.partition(", resumed")
    return LABELS.get(name, name) + (f", resumed{rest}" if rest else "")


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{results['shards']} shards of {results['shard_mib']} MiB of uint32 tokens, ({BATCH}, {SEQUENCE}) windows, "
        f"one shuffled epoch through a link of {results['latency_ms']:.0f} ms and {results['mb_per_s']:.0f} MB/s; "
        "one rank per simulated machine, each with its own cache (a share of the cache: % of the machine's share).",
        "",
        "| reader | machines | cache (of a share) | K | bytes / share (worst machine) | mix: batch of 8 / 128 samples "
        "| epoch / link limit (worst) | after the first batch | first batch (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        if "error" in row:
            lines.append(
                f"| {label(row['order'])} | {row['machines']} | {row['cache_percent']}% | "
                f"{row['window'] or '—'} | failed: {row['error']} | | | | |"
            )
            continue
        estimated = row["estimated"]
        times = (
            "— | —"
            if estimated
            else f"{row['epoch_over_link_max']:.2f}x | {row.get('after_first_over_link_max', float('nan')):.2f}x"
        )
        lines.append(
            f"| {label(row['order'])} | {row['machines']} | {row['cache_percent']}% | {row['window'] or '—'} "
            f"| {row['bytes_over_share_max']:.2f}x{' (est.)' if estimated else ''} "
            f"| {row['mix_batch']:.1f} / {row['mix_128']:.1f} | {times} | {row['first_batch_s_max']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Bytes per machine / its share and the mix against the cache: every reader at one machine, and guideloom's
    windowed order at more."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    measured = [row for row in results["rows"] if "error" not in row]
    lines = sorted({(row["order"], row["machines"]) for row in measured if "resumed" not in row["order"]})
    for order, machines in lines:
        if machines > 1 and order != "windowed":
            continue
        rows = [row for row in measured if (row["order"], row["machines"]) == (order, machines)]
        caches = [row["cache_percent"] for row in rows]
        name = f"{label(order)}, {machines} machine{'s' if machines > 1 else ''}"
        left.plot(caches, [row["bytes_over_share_max"] for row in rows], marker="o", label=name)
        right.plot(caches, [row["mix_128"] for row in rows], marker="o", label=name)
    left.set(xlabel="cache, % of the machine's share", ylabel="bytes downloaded / share", yscale="log")
    right.set(xlabel="cache, % of the machine's share", ylabel="distinct shards in 128 consecutive samples")
    left.axhline(1.1, color="grey", linestyle=":")
    right.axhline(12, color="grey", linestyle=":")
    left.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
