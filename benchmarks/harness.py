"""What every benchmark shares: timing, child processes, free ports, the local S3 server, results, arguments.

Benchmarks are modules of the ``benchmarks`` package, run from the repository root::

    python -m benchmarks.bench_window_modes --repeats 5

so they import one another (``from benchmarks.harness import ...``) without editing ``sys.path``. A
child process runs a module the same way (:func:`module_command`), from the repository root, with
``src`` first on its path (:func:`child_environment`), whichever interpreter it is (the peers run
under ``.venv-bench``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
BENCHMARKS = REPOSITORY / "benchmarks"
RESULTS = BENCHMARKS / "results"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}

# ----------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    """The wall times of repeated runs of one measurement: a shared machine only ever slows a run, so the
    best is the figure to compare; the median and the spread say how much the machine moved it."""

    seconds: tuple[float, ...]

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.seconds), max(self.seconds)

    def summary(self) -> dict[str, Any]:
        """For a results file: best, median and spread (seconds), and how many runs."""
        return {"best_s": self.best, "median_s": self.median, "spread_s": list(self.spread), "runs": len(self.seconds)}


def timed(run: Callable[[], object], repeats: int = 1, prepare: Callable[[], object] | None = None) -> Timing:
    """Wall time of ``run``, ``repeats`` times; ``prepare`` runs untimed before each."""
    seconds = []
    for _ in range(repeats):
        if prepare is not None:
            prepare()
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return Timing(tuple(seconds))


def interleaved(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[Any]]:
    """Each of ``runs`` once per round, ``repeats`` rounds: what each returned, round by round.

    Interleaving gives every measurement the same share of a shared machine's load, so the ratios of one
    round are comparable even when the absolute figures move from one round to the next.
    """
    results: dict[str, list[Any]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            results[name].append(run())
    return results


def spread(values: list[float]) -> dict[str, Any]:
    """Median, lowest and highest of ``values`` (ratios of several rounds, say)."""
    return {"median": statistics.median(values), "low": min(values), "high": max(values), "values": values}


# ----------------------------------------------------------------------------- arguments


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """The parser every benchmark starts from: its module docstring as the help text."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def count(text: str) -> int:
    """A count on the command line, digits grouped or not: ``20_000_000``."""
    return int(text.replace("_", ""))


# ----------------------------------------------------------------------------- child processes


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment with the repository's ``src`` and root first on ``PYTHONPATH``, plus ``extra``
    (guideloom's modules compiled first: see :func:`compile_package`)."""
    compile_package()
    paths = [str(REPOSITORY / "src"), str(REPOSITORY), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path), **extra}


@functools.cache
def compile_package() -> None:
    """guideloom's modules compiled to bytecode, as installing its wheel does: timed child processes then load them
    as a user's do (with ``PYTHONDONTWRITEBYTECODE`` set, a source checkout compiles them afresh in every process,
    some 0.1 s each, while the peers' installed packages come compiled)."""
    import compileall

    compileall.compile_dir(str(REPOSITORY / "src" / "guideloom"), quiet=1)


def module_command(module: str, *args: str, python: str = sys.executable) -> list[str]:
    """The command that runs benchmark module ``module`` (``benchmarks.run``, say) under ``python``."""
    return [python, "-m", module, *args]


def run_json_child(command: list[str], timeout: float, **options: Any) -> dict[str, Any]:
    """Run ``command`` from the repository root and return the JSON of its last stdout line.

    A failure or a time-out is returned as ``{"error": ...}``, not raised, so one broken measurement
    (a peer library that fails, say) leaves the others of a run standing.
    """
    options = {"cwd": REPOSITORY, "env": child_environment(), **options}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_child(command: list[str], timeout: float = 3600, **options: Any) -> tuple[float, str]:
    """Run ``command`` from the repository root: its wall time (start-up included) and stdout.

    A failure raises, with the end of its output: the steps of such a benchmark depend on one another.
    """
    options = {"cwd": REPOSITORY, "env": child_environment(), **options}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, **options)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return seconds, done.stdout


# ----------------------------------------------------------------------------- ports and servers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_listening(port: int, process: subprocess.Popen[bytes], what: str, log: Path) -> None:
    """Wait (30 s at most) until something accepts connections on ``port``; else stop ``process`` and raise."""
    for _ in range(300):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{what} did not start; see {log}")


@contextmanager
def s3_server(log: Path) -> Iterator[str]:
    """A local S3 API server (``remote/s3_server.py``, counting what it sends) in its own process: its
    endpoint, while the block runs. The credentials it takes are set in this process's environment."""
    os.environ.update(S3_CREDENTIALS)
    port = free_port()
    with open(log, "wb") as errors:
        server = subprocess.Popen(
            module_command("benchmarks.remote.s3_server", str(port)),
            cwd=REPOSITORY,
            env=child_environment(),
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    try:
        wait_until_listening(port, server, "the S3 server", log)
        endpoint = f"http://127.0.0.1:{port}"
        s3_counters(endpoint)  # it answers requests, not only connections
        yield endpoint
    finally:
        server.kill()
        server.wait()


def s3_counters(endpoint: str, reset: bool = False) -> dict[str, int]:
    """The server's counts of object GETs, the bytes they sent, and listings; ``reset``: set them to 0."""
    request = urllib.request.Request(f"{endpoint}/_bench/counters", method="POST" if reset else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        counters: dict[str, int] = json.loads(response.read())
        return counters


# ----------------------------------------------------------------------------- results


def machine() -> dict[str, Any]:
    """What the figures were measured on, and how loaded it was (other work on a shared machine skews them)."""
    described: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()),
    }
    for module in ("numpy", "torch", "guideloom"):
        if module in sys.modules:
            described[module] = getattr(sys.modules[module], "__version__", "?")
    return described


def write_results(name: str, results: dict[str, Any], markdown: str | None = None, *, to: Path | None = None) -> Path:
    """``results/<name>.json`` (or ``to``), replaced whole, and ``<name>.md`` beside it when ``markdown`` is given."""
    path = to or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(results, indent=2, default=str) + "\n")
    os.replace(temporary, path)
    if markdown is not None:
        path.with_suffix(".md").write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    return path


def read_results(name: str) -> dict[str, Any] | None:
    """What an earlier run wrote to ``results/<name>.json``, if any."""
    path = RESULTS / f"{name}.json"
    return dict(json.loads(path.read_text())) if path.exists() else None
