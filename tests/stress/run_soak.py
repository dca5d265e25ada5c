"""Soak, long run: tens of thousands of batches per loader kind; writes the memory curve.

    python -m tests.stress.run_soak [--batches 40000] [--kinds documents,tokens] [--out soak-results]

For each kind: a loader with 2 workers over a small storage (so: hundreds of epochs), resumed
into a new loader from its state dict every ``--resume-every`` batches, compared batch by batch
with a loader without workers (see ``tests/hardening/soak/harness.py``). Writes ``soak-KIND.csv`` (one
row per sample: batch, seconds, RssAnon and Pss_Anon of this process plus its workers, open
descriptors, worker processes), ``soak.png`` when matplotlib is installed, and prints a summary.
Exit status 1 on a mismatching batch, anonymous memory growing by more than ``--limit-mib``
after warm-up, or descriptors growing.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from tests.hardening.soak import harness as soak


def plot(results: list[soak.SoakResult], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for result in results:
        batches = result.column("batch")
        axes[0].plot(
            batches, [value / 1024 for value in result.column("pss_anon_kib")], label=f"{result.kind}: Pss_Anon"
        )
        axes[0].plot(
            batches, [value / 1024 for value in result.column("rss_anon_kib")], "--", label=f"{result.kind}: RssAnon"
        )
        axes[1].plot(batches, result.column("descriptors"), label=result.kind)
    axes[0].set(xlabel="batches", ylabel="MiB (this process + workers)", title="anonymous memory")
    axes[1].set(xlabel="batches", ylabel="open descriptors (this process + workers)", title="descriptors")
    for axis in axes:
        axis.legend(fontsize=8)
        axis.set_ylim(bottom=0)
    figure.tight_layout()
    path = out / "soak.png"
    figure.savefig(path, dpi=110)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40_000)
    parser.add_argument("--kinds", default="documents,tokens")
    parser.add_argument("--resume-every", type=int, default=5_000)
    parser.add_argument("--sample-every", type=int, default=200)
    parser.add_argument("--limit-mib", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=Path("soak-results"))
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    results, failed = [], False
    for kind in arguments.kinds.split(","):
        storage = soak.make_storage(arguments.out / f"storage-{kind}", kind, 600)
        result = soak.run(
            storage, kind, arguments.batches, sample_every=arguments.sample_every, resume_every=arguments.resume_every
        )
        results.append(result)
        with open(arguments.out / f"soak-{kind}.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(result.samples[0]))
            writer.writeheader()
            writer.writerows(result.samples)
        summary = result.summary()
        print(json.dumps(summary), flush=True)
        failed |= (
            result.mismatches > 0
            or summary["pss_anon_growth_mib"] > arguments.limit_mib
            or summary["rss_anon_growth_mib"] > arguments.limit_mib
            or summary["descriptors_growth"] > 1
            or summary["worker_descriptors_growth"] > 1
        )
    chart = plot(results, arguments.out)
    print(f"wrote {arguments.out}/soak-*.csv" + (f" and {chart}" if chart else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
