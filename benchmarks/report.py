"""Turn ``results/latest.json`` into Markdown tables, a PNG chart and the README's results section."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

START, END = "<!-- results -->", "<!-- /results -->"


def _rate(row: dict[str, Any]) -> float | None:
    if "error" in row or not row.get("seconds"):
        return None
    return float(row["units"]) / float(row["seconds"])


def _name(row: dict[str, Any]) -> str:
    if row["library"] == "naive" and row.get("workers"):
        return "naive (no workers: main process)"
    if row.get("window_dtype"):
        return f"{row['library']} ({row['window_dtype']} windows)"
    return row["library"] + (f" ({row['format']})" if row.get("format") else "")


def _fmt(value: float | None, scale: float = 1e6, digits: int = 1) -> str:
    return "—" if value is None else f"{value / scale:,.{digits}f}"


def _best_peer(rows: list[dict[str, Any]], workers: int | None = None) -> tuple[str, float]:
    peers = [
        (_name(row), rate)
        for row in rows
        if row["library"] not in ("guideloom", "naive", "tofile") and (workers is None or row.get("workers") == workers)
        if (rate := _rate(row)) is not None
    ]
    return max(peers, key=lambda peer: peer[1]) if peers else ("none", float("nan"))


def tables(results: dict[str, Any]) -> str:
    out: list[str] = []
    limits = (results.get("limits") or [{}])[0]
    convert = limits.get("convert_tokens_per_s")
    if results.get("token_epoch"):
        out += [
            f"### 1. Token batches: {results['tokens'] / 1e6:.0f}M uint32 tokens, (8, 2048) int64 batches, "
            "one shuffled epoch",
            "",
            "| library | workers | Mtok/s | CPU s per 10⁹ tokens | peak RSS (MB) | guideloom × |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for workers in (0, 2):
            rows = [row for row in results["token_epoch"] if row["workers"] == workers]
            ours = next(
                (_rate(row) for row in rows if row["library"] == "guideloom" and not row.get("window_dtype")), None
            )
            for row in rows:
                rate = _rate(row)
                cpu = "—" if rate is None else f"{row['cpu_seconds'] / row['units'] * 1e9:,.1f}"
                rss = "—" if rate is None else f"{row['peak_rss_mb']:,.0f}"
                ratio = "—" if not rate or not ours else f"{ours / rate:.2f}"
                note = f" ({row['error']})" if "error" in row else ""
                out.append(f"| {_name(row)}{note} | {workers} | {_fmt(rate)} | {cpu} | {rss} | {ratio} |")
        out.append("")
    if results.get("document_epoch"):
        limit = _rate(results["documents_in_memory"][0])
        out += [
            f"### 2. Documents: {results['records']:,} records of 50–500 tokens, shuffled, batches of 32 "
            "padded with `pad_sequence`",
            "",
            f"Limit: the same collate on records already decoded in memory: {_fmt(limit, 1e3)}k records/s.",
            "",
            "| library (format) | workers | k records/s | share of the in-memory limit |",
            "|---|---:|---:|---:|",
        ]
        for row in results["document_epoch"]:
            rate = _rate(row)
            share = "—" if rate is None or not limit else f"{rate / limit:.0%}"
            note = f" ({row['error']})" if "error" in row else ""
            out.append(f"| {_name(row)}{note} | {row['workers']} | {_fmt(rate, 1e3)} | {share} |")
        out.append("")
    if results.get("write_tokens"):
        tofile = next(
            (row for row in results["write_tokens"] if row["library"] == "tofile" and not row.get("fsync")), {}
        )
        tofile_rate = _rate(tofile) if tofile else None
        out += [
            "### 3. Preprocessing: writing the same data in each library's format",
            "",
            "| writer | tokens: seconds | Mtok/s | ratio to `tofile` |",
            "|---|---:|---:|---:|",
        ]
        for row in results["write_tokens"]:
            rate = _rate(row)
            name = (
                "numpy `tofile`" + (" + fsync" if row.get("fsync") else "")
                if row["library"] == "tofile"
                else _name(row)
            )
            ratio = "—" if not rate or not tofile_rate else f"{rate / tofile_rate:.2f}"
            seconds = "—" if rate is None else f"{row['seconds']:.2f}"
            out.append(f"| {name} | {seconds} | {_fmt(rate)} | {ratio} |")
        if results.get("write_documents"):
            out += ["", "| writer | records: seconds | k records/s |", "|---|---:|---:|"]
            for row in results["write_documents"]:
                rate = _rate(row)
                seconds = "—" if rate is None else f"{row['seconds']:.2f}"
                out.append(f"| {_name(row)} | {seconds} | {_fmt(rate, 1e3)} |")
        out.append("")
    if results.get("resume"):
        out += [
            "### 4. Resume: fresh loader + state load + first batch",
            "",
            "| library | at | ms | first batch equals the uninterrupted run's | state bytes |",
            "|---|---:|---:|---|---:|",
        ]
        for row in results["resume"]:
            if not row.get("supported", False) or row.get("seconds") is None:
                out.append(
                    f"| {row['library']} | {row['fraction']:.0%} | — | {row.get('reason') or row.get('error')} | — |"
                )
                continue
            out.append(
                f"| {row['library']} | {row['fraction']:.0%} | {row['seconds'] * 1e3:,.1f} | "
                f"{'yes' if row['matches'] else 'NO'} | {row.get('state_bytes', '—')} |"
            )
        for row in results.get("resume_windows", []):
            if "error" in row:
                continue
            out.append(
                f"| guideloom, epoch of {row['windows']:,} windows | {row['fraction']:.0%} | "
                f"{row['seconds'] * 1e3:,.1f} | {'yes' if row['matches'] else 'NO'} | {row['state_bytes']} |"
            )
        out.append("")
    if limits:
        out += [
            "### 5. Limits of this machine (tokens/s)",
            "",
            f"- memcpy: {_fmt(limits.get('memcpy_tokens_per_s'))} M uint32 tokens/s",
            f"- page-cache read: {_fmt(limits.get('page_cache_tokens_per_s'))} M tokens/s",
            f"- uint32 → int64 conversion: {_fmt(convert)} M tokens/s",
            "",
        ]
    out += goals(results)
    if results.get("unavailable"):
        out += ["", "Peers not measured:", ""]
        out += [f"- {key}: {reason}" for key, reason in results["unavailable"].items()]
    return "\n".join(out) + "\n"


def goals(results: dict[str, Any]) -> list[str]:
    """The issue's goals, each with the measured ratio."""
    lines = ["### Goals (ratios from this run)", ""]
    epochs = results.get("token_epoch") or []
    limits = (results.get("limits") or [{}])[0]
    for workers in (0, 2):
        ours = next(
            (
                _rate(row)
                for row in epochs
                if row["library"] == "guideloom" and row["workers"] == workers and not row.get("window_dtype")
            ),
            None,
        )
        peer, best = _best_peer(epochs, workers)
        if ours:
            lines.append(f"- token batches, {workers} workers: {ours / best:.2f}× the best peer ({peer}); goal ≥ 2×")
        naive = next((_rate(row) for row in epochs if row["library"] == "naive" and row["workers"] == workers), None)
        if ours and naive and workers == 0:
            lines.append(f"- token batches, main process: {ours / naive:.2f}× the naive memmap loader; goal ≥ 1.0×")
            if limits.get("convert_tokens_per_s"):
                lines.append(
                    f"- token batches, main process: {ours / limits['convert_tokens_per_s']:.0%} of the "
                    "uint32→int64 conversion bound; stretch ≥ 50%"
                )
            narrow = next((_rate(row) for row in epochs if row.get("window_dtype") and row["workers"] == 0), None)
            if narrow and limits.get("memcpy_tokens_per_s"):
                lines.append(
                    f"- token batches, main process, int32 windows (an option, reported apart): {narrow / ours:.2f}× "
                    f"the int64 batches, {narrow / limits['memcpy_tokens_per_s']:.0%} of the memcpy bound "
                    "(uint32→int32 is a plain copy)"
                )
    documents = results.get("document_epoch") or []
    if documents and results.get("documents_in_memory"):
        limit = _rate(results["documents_in_memory"][0])
        for workers in (0, 2):
            peer, best = _best_peer(documents, workers)
            for row in documents:
                rate = _rate(row)
                if row["library"] == "guideloom" and row["workers"] == workers and rate and limit:
                    lines.append(
                        f"- documents ({row['format']}, {workers} workers): {rate / limit:.0%} of the in-memory limit "
                        f"(goal ≥ 80%), {rate / best:.2f}× the best peer ({peer})"
                    )
    writes = results.get("write_tokens") or []
    tofile = next((_rate(row) for row in writes if row["library"] == "tofile" and not row.get("fsync")), None)
    ours = next((_rate(row) for row in writes if row["library"] == "guideloom"), None)
    if tofile and ours:
        peer, best = _best_peer(writes)
        synced = next((_rate(row) for row in writes if row["library"] == "tofile" and row.get("fsync")), None)
        against_synced = f", {ours / synced:.2f}× `tofile` + fsync (guideloom fsyncs every shard)" if synced else ""
        lines.append(
            f"- token writes: {ours / tofile:.2f}× raw `tofile` (goal ≥ 0.8×){against_synced}, "
            f"{ours / best:.2f}× the best peer ({peer})"
        )
    resume = [row for row in results.get("resume") or [] if row["library"] == "guideloom" and row.get("seconds")]
    if resume:
        worst = max(row["seconds"] for row in resume) * 1e3
        state = max(row.get("state_bytes") or 0 for row in resume)
        lines.append(f"- resume: at most {worst:.1f} ms (goal ≤ 10 ms), state {state} bytes of JSON (goal ≤ 1 KB)")
    return lines


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("token_epoch", "Token batches (M tokens/s)", 1e6), ("document_epoch", "Documents (k records/s)", 1e3)]
    panels = [panel for panel in panels if results.get(panel[0])]
    if not panels:
        return
    figure, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5))
    axes = axes if len(panels) > 1 else [axes]
    for axis, (key, title, scale) in zip(axes, panels, strict=True):
        rows = [row for row in results[key] if _rate(row) is not None]
        labels = [f"{_name(row)}\n{row['workers']} workers" for row in rows]
        values = [(_rate(row) or 0) / scale for row in rows]
        colours = ["tab:green" if row["library"] == "guideloom" else "tab:gray" for row in rows]
        axis.barh(labels, values, color=colours)
        axis.set_title(title)
        axis.invert_yaxis()
        axis.tick_params(axis="y", labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_report(results: dict[str, Any], directory: Path, readme: Path) -> None:
    text = tables(results)
    machine = results.get("machine", {})
    header = (
        f"Measured on {machine.get('cpus')} CPUs, {machine.get('memory_gb')} GiB, {machine.get('platform')}, "
        f"Python {machine.get('python')}, torch {machine.get('torch')}, numpy {machine.get('numpy')}.\n\n"
    )
    (directory / "latest.md").write_text(header + text)
    chart(results, directory / "latest.png")
    if readme.exists():
        content = readme.read_text()
        if START in content and END in content:
            before, rest = content.split(START, 1)
            after = rest.split(END, 1)[1]
            readme.write_text(f"{before}{START}\n{header}{text}\n![chart](results/latest.png)\n{END}{after}")


if __name__ == "__main__":
    from benchmarks.harness import BENCHMARKS, RESULTS

    write_report(json.loads((RESULTS / "latest.json").read_text()), RESULTS, BENCHMARKS / "README.md")
    sys.exit(0)
