"""Fuzzing, long run: many Hypothesis cases per target over several seeds, then atheris if it is installed.

    python -m tests.stress.run_fuzz [--examples 3000] [--seeds 2] [--jobs 2] [--atheris-runs 20000]

The Hypothesis part runs ``tests/hardening/fuzz/harness.py`` (which documents the properties) once
per (target, seed), ``--jobs`` at a time; each process must exit normally. The atheris part is
coverage-guided: libFuzzer's bytes choose a storage kind and a file (the header or a shard) and
overwrite, splice or truncate it; the same properties are checked (an uncaught exception or a
crash is atheris's failure). ``pip install atheris`` if you want it; it is skipped otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.helpers.processes import child_environment, module_command
from tests.helpers.shard_files import FOOTER_FIELDS

TARGETS = ("header", "footer", "index", "size", "bytes", "layout")


def hypothesis_run(target: str, seed: int, examples: int, root: Path) -> dict[str, object]:
    completed = subprocess.run(
        module_command("tests.hardening.fuzz.harness", "--targets", target, "--examples", examples,
                       "--seed", seed, "--root", root / f"{target}-{seed}"),
        capture_output=True,
        text=True,
        env=child_environment(),
    )  # fmt: skip
    cases = sum(int(line.split()[2]) for line in completed.stdout.splitlines() if line.startswith("CASES "))
    outcomes = next((line[9:] for line in completed.stdout.splitlines() if line.startswith("OUTCOMES ")), "{}")
    return {
        "target": target,
        "seed": seed,
        "cases": cases,
        "returncode": completed.returncode,
        "outcomes": json.loads(outcomes),
        "output": completed.stdout[-20000:] + completed.stderr[-5000:] if completed.returncode else "",
    }


def atheris_child(runs: int, root: Path) -> None:
    """Runs inside its own process: libFuzzer takes over the process and exits it."""
    import atheris

    with atheris.instrument_imports(include=["guideloom"]):
        from tests.hardening.fuzz import harness as fuzz_probe
    fuzzer = fuzz_probe.Fuzzer(root, loader=False)

    def one_input(data: bytes) -> None:
        provider = atheris.FuzzedDataProvider(data)
        kind = fuzz_probe.KINDS[provider.ConsumeIntInRange(0, 1)]
        shard = provider.ConsumeIntInRange(0, 2)
        choice = provider.ConsumeIntInRange(0, 4)
        if choice == 0:
            mutation = {"op": "header-bytes", "data": provider.ConsumeBytes(provider.ConsumeIntInRange(0, 400))}
        elif choice == 1:
            edits = [
                (provider.ConsumeIntInRange(0, 600), provider.ConsumeIntInRange(0, 255))
                for _ in range(provider.ConsumeIntInRange(1, 8))
            ]
            mutation = {"op": "bytes", "shard": shard, "edits": edits}
        elif choice == 2:
            start, remove = provider.ConsumeIntInRange(0, 600), provider.ConsumeIntInRange(0, 100)
            insert = provider.ConsumeBytes(provider.ConsumeIntInRange(0, 100))
            mutation = {"op": "splice", "shard": shard, "start": start, "remove": remove, "insert": insert}
        elif choice == 3:
            names = FOOTER_FIELDS[1:]
            fields = {names[provider.ConsumeIntInRange(0, len(names) - 1)]: provider.ConsumeIntInRange(0, 2**32 - 1)}
            mutation = {"op": "footer-fields", "shard": shard, "fields": fields, "fix_crc": provider.ConsumeBool()}
        else:
            entries = [
                (provider.ConsumeIntInRange(0, 7), provider.ConsumeIntInRange(0, 2**64 - 1))
                for _ in range(provider.ConsumeIntInRange(1, 4))
            ]
            mutation = {"op": "index-set", "shard": shard, "entries": entries, "fix_crc": provider.ConsumeBool()}
        fuzzer.run("atheris", kind, mutation)

    atheris.Setup([sys.argv[0], f"-runs={runs}", "-max_len=512", f"-artifact_prefix={root}/"], one_input)
    atheris.Fuzz()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=3000, help="Hypothesis examples per target and seed")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--atheris-runs", type=int, default=20000, help="0: skip atheris")
    parser.add_argument("--atheris-child", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.atheris_child:
        atheris_child(arguments.atheris_runs, Path(tempfile.mkdtemp(prefix="guideloom-atheris-")))
        return 0
    base = random.randrange(2**31)
    failed = False
    with tempfile.TemporaryDirectory(prefix="guideloom-stress-fuzz-") as scratch:
        started = time.perf_counter()
        jobs = [(target, base + seed) for seed in range(arguments.seeds) for target in TARGETS]
        with ThreadPoolExecutor(arguments.jobs) as pool:
            results = list(pool.map(lambda job: hypothesis_run(*job, arguments.examples, Path(scratch)), jobs))
        outcomes: dict[str, int] = {}
        for result in results:
            for key, value in result["outcomes"].items():  # type: ignore[union-attr]
                outcomes[key] = outcomes.get(key, 0) + value
            if result["returncode"] != 0:
                failed = True
                print(f"FAILED {result['target']} seed {result['seed']} (exit {result['returncode']}):")
                print(result["output"])
        cases = sum(int(result["cases"]) for result in results)  # type: ignore[call-overload]
        print(f"hypothesis: {cases} cases over {len(jobs)} runs (seeds from {base}), "
              f"{sum(r['returncode'] != 0 for r in results)} failed, outcomes {json.dumps(outcomes)}, "
              f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    if arguments.atheris_runs:
        try:
            import atheris  # noqa: F401
        except ImportError:
            print("atheris: not installed, skipped (pip install atheris)")
            return 1 if failed else 0
        started = time.perf_counter()
        completed = subprocess.run(
            module_command("tests.stress.run_fuzz", "--atheris-child", "--atheris-runs", arguments.atheris_runs),
            capture_output=True,
            text=True,
            env=child_environment(),
        )
        done = re.findall(r"Done (\d+) runs", completed.stderr)
        coverage = re.findall(r"cov: (\d+) ft: (\d+)", completed.stderr)
        print(f"atheris: {done[-1] if done else '?'} runs, coverage {coverage[-1] if coverage else '?'} (cov, ft), "
              f"exit {completed.returncode}, {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
        if completed.returncode != 0:
            failed = True
            print(completed.stderr[-20000:])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
