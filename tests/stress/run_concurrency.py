"""Concurrency, long run: thousands of racing-writer rounds and snapshot checks under heavier commit traffic.

python -m tests.stress.run_concurrency [--rounds 3000] [--writers 4] [--shards-per-writer 200] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from tests.hardening.concurrency import snapshots
from tests.helpers.processes import run_harness


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--shards-per-writer", type=int, default=200)
    parser.add_argument("--snapshot-runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=random.randrange(2**31))
    arguments = parser.parse_args()
    print(f"seed {arguments.seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="guideloom-stress-race-") as scratch:
        started = time.perf_counter()
        completed, lines = run_harness("tests.hardening.concurrency.harness", "--rounds", arguments.rounds,
                                       "--seed", arguments.seed, "--root", Path(scratch) / "race")  # fmt: skip
        for line in lines[:-1]:
            print("FAILED round:", json.dumps(line, indent=1), flush=True)
        print("racing writers:", json.dumps(lines[-1]["summary"] if lines else completed.stderr[-3000:]),
              f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
        started = time.perf_counter()
        totals: dict[str, int] = {}
        for run in range(arguments.snapshot_runs):
            figures = snapshots.run(
                Path(scratch) / f"snapshots-{run}",
                arguments.writers,
                arguments.shards_per_writer,
                pause=0.005,
                loaders=20,
            )
            for key, value in figures.items():
                totals[key] = totals.get(key, 0) + value
        print("snapshots:", json.dumps(totals), f"({time.perf_counter() - started:.0f} s)", flush=True)
    return completed.returncode


if __name__ == "__main__":
    raise SystemExit(main())
