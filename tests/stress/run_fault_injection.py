"""Fault injection, long run: hundreds of killed writers (every syscall instant too) and killed tokenize runs.

    python -m tests.stress.run_fault_injection [--writer-cases 400] [--tokenize-cases 120] [--seed N]

See ``tests/hardening/fault_injection/harness.py`` and ``tokenize_kills.py`` there for what is
injected and checked. Prints the figures; exit status 1 if any case failed.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import traceback
from pathlib import Path

from tests.hardening.fault_injection import tokenize_kills
from tests.helpers.processes import run_harness


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writer-cases", type=int, default=400, help="random instants (besides every call instant)")
    parser.add_argument("--no-exhaustive", action="store_true", help="skip the before/after every call instants")
    parser.add_argument("--tokenize-cases", type=int, default=120)
    parser.add_argument("--seed", type=int, default=random.randrange(2**31))
    arguments = parser.parse_args()
    print(f"seed {arguments.seed}", flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="guideloom-stress-kill-") as scratch:
        root = Path(scratch)
        started = time.perf_counter()
        exhaustive = [] if arguments.no_exhaustive else ["--exhaustive"]
        completed, lines = run_harness("tests.hardening.fault_injection.harness", "--cases", arguments.writer_cases,
                                       "--seed", arguments.seed, "--root", root / "writers", *exhaustive)  # fmt: skip
        for line in lines:
            if line.get("ok") is False:
                print("FAILED writer case:", json.dumps(line, indent=1), flush=True)
        summary = lines[-1] if lines and "summary" in lines[-1] else {"summary": {"error": completed.stderr[-3000:]}}
        print("killed writers:", json.dumps(summary["summary"]), f"({time.perf_counter() - started:.0f} s)", flush=True)
        failed |= completed.returncode != 0

        started = time.perf_counter()
        setup = tokenize_kills.prepare(root / "tokenize")
        figures = {"cases": 0, "killed": 0, "failures": 0, "shards visible after the kill": 0}
        for number, case in enumerate(tokenize_kills.plan(setup, arguments.tokenize_cases, arguments.seed)):
            try:
                outcome = tokenize_kills.run_case(setup, case)
                figures["killed"] += outcome["killed"]
                figures["shards visible after the kill"] += len(outcome["visible"])
            except Exception:
                figures["failures"] += 1
                print(f"FAILED tokenize case {number} {json.dumps(case)}:\n{traceback.format_exc()}", flush=True)
            figures["cases"] += 1
        print("killed tokenize runs:", json.dumps(figures), f"({time.perf_counter() - started:.0f} s)", flush=True)
        failed |= figures["failures"] > 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
