"""The quick-start, end to end: preprocess, train, kill, resume, and check the losses are identical.

1. ``preprocess.py`` tokenizes a slice of the Python standard library's source (no
   download) into a TokenStorage (small files grouped into shards of 256 MiB of tokens).
2. ``train.py`` trains a small GPT for ``--steps`` steps without interruption (run A).
3. ``train.py`` trains the same run again (run B), and this script kills it with
   ``SIGKILL`` a few steps after a checkpoint: no clean-up code runs, as in a crash
   or a preempted node.
4. ``train.py --resume`` continues run B from its last checkpoint to the end.
5. The per-step losses of A and B are compared exactly (bit for bit): the script
   prints ``identical`` or exits with status 1. A plot of both curves is written as
   ``WORKDIR/losses.png``.

Everything lands in ``--workdir`` (default ``runs/quickstart``)::

    python examples/quickstart/run_all.py            # a few minutes on 2 CPU cores
    python examples/quickstart/run_all.py --steps 60 --max-files 10   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run(command: list[str]) -> None:
    """Run ``command``, printed first as a line a user can paste into a shell."""
    print(f"$ {shlex.join(command)}", flush=True)
    completed = subprocess.run(command)
    if completed.returncode != 0:
        raise SystemExit(f"failed with status {completed.returncode}: {shlex.join(command)}")


def train_and_kill(command: list[str], kill_at: int, print_every: int) -> tuple[int, int]:
    """Run ``command`` and SIGKILL it once it has printed step ``kill_at``: (last step seen, last checkpoint)."""
    print(f"$ {shlex.join(command)}   # SIGKILL after step {kill_at}", flush=True)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert process.stdout is not None
    last_step = last_checkpoint = 0
    for line in process.stdout:
        words = line.split()
        if words[:1] == ["step"]:
            last_step = int(words[1])
        elif words[:2] == ["checkpoint", "step"]:
            last_checkpoint = int(words[2])
        if last_step >= kill_at:
            os.kill(process.pid, signal.SIGKILL)
            break
        if words[:1] != ["step"] or last_step % print_every == 0:
            print(f"  {line.rstrip()}", flush=True)
    process.stdout.close()
    status = process.wait()
    if status != -signal.SIGKILL:
        raise SystemExit(f"the training run ended by itself (status {status}) before step {kill_at}: nothing to resume")
    print(f"  ** killed with SIGKILL at step {last_step} (last checkpoint seen: step {last_checkpoint})", flush=True)
    return last_step, last_checkpoint


def draw(losses_a: list[float], losses_b: list[float], killed_at: int, resumed_at: int) -> Any:
    """The figure of :func:`plot` (a matplotlib ``Figure``), its legend outside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8, 5))
    steps = range(1, len(losses_a) + 1)
    axes.plot(steps, losses_a, label="A: uninterrupted", linewidth=3, alpha=0.5)
    axes.plot(range(1, len(losses_b) + 1), losses_b, label="B: killed, then resumed", linestyle="--", color="black")
    axes.axvline(killed_at, color="gray", linestyle=":", linewidth=1, label=f"B killed (SIGKILL) at step {killed_at}")
    axes.axvline(resumed_at, color="red", linewidth=1, label=f"B resumed from the checkpoint of step {resumed_at}")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.set_title("Exact resume with guideloom's StatefulDataLoader")
    # Below the axes, so that it never covers a curve, whatever their shape.
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    figure.tight_layout()
    return figure


def plot(losses_a: list[float], losses_b: list[float], killed_at: int, resumed_at: int, path: Path) -> None:
    """Both loss curves, the kill and the resume, as a PNG at ``path``."""
    from matplotlib import pyplot

    figure = draw(losses_a, losses_b, killed_at, resumed_at)
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--max-files", type=int, default=100, help="standard-library files to tokenize")
    parser.add_argument("--workers", type=int, default=None, help="tokenize processes")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--kill-at", type=int, default=None, help="step after which run B is killed")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-plot", action="store_true")
    arguments = parser.parse_args(argv)
    kill_at = arguments.kill_at
    if kill_at is None:  # a few steps past a checkpoint a little after half-way
        kill_at = (arguments.steps // 2 // arguments.checkpoint_every) * arguments.checkpoint_every
        kill_at += max(1, min(7, arguments.checkpoint_every // 2))
    if not 0 < kill_at < arguments.steps:
        parser.error(f"--kill-at must be between 1 and --steps - 1, got {kill_at}")

    started = time.perf_counter()
    python = sys.executable
    work = arguments.workdir
    data, run_a, run_b = work / "data", work / "run-a", work / "run-b"
    for directory in (data, run_a, run_b):
        if directory.exists():
            shutil.rmtree(directory)

    print("== 1. preprocess", flush=True)
    command = [python, str(HERE / "preprocess.py"), "--output", str(data), "--max-files", str(arguments.max_files)]
    if arguments.workers is not None:
        command += ["--workers", str(arguments.workers)]
    run(command)

    train = [
        python,
        str(HERE / "train.py"),
        "--data",
        str(data / "tokens"),
        "--steps",
        str(arguments.steps),
        "--checkpoint-every",
        str(arguments.checkpoint_every),
        "--batch-size",
        str(arguments.batch_size),
        "--context",
        str(arguments.context),
        "--seed",
        str(arguments.seed),
    ]
    every = str(max(1, arguments.steps // 10))
    print(f"\n== 2. run A: {arguments.steps} steps, uninterrupted", flush=True)
    run([*train, "--out", str(run_a), "--log-every", every])

    print("\n== 3. run B: the same run, killed", flush=True)
    # Every step is logged, so this script sees the step to kill at; it shows one line in ``every``.
    killed_at, _ = train_and_kill([*train, "--out", str(run_b), "--log-every", "1"], kill_at, int(every))

    print("\n== 4. run B: resume from its last checkpoint", flush=True)
    checkpointed = json.loads((run_b / "losses.json").read_text())
    resumed_at = len(checkpointed["losses"])
    run([*train, "--out", str(run_b), "--resume", "--log-every", every])

    print("\n== 5. compare", flush=True)
    result_a = json.loads((run_a / "losses.json").read_text())
    result_b = json.loads((run_b / "losses.json").read_text())
    losses_a, losses_b = result_a["losses"], result_b["losses"]
    if not arguments.no_plot:
        plot(losses_a, losses_b, killed_at, resumed_at, work / "losses.png")
        print(f"plot: {work / 'losses.png'}")
    print(f"run A: {result_a['tokens_per_second']:,.0f} tokens/s of training on CPU")
    print(f"quick-start took {time.perf_counter() - started:.0f} s")
    if len(losses_a) != arguments.steps or losses_a != losses_b:
        differing = [i + 1 for i, (a, b) in enumerate(zip(losses_a, losses_b, strict=False)) if a != b]
        print(
            f"DIFFERENT: {len(losses_a)} vs {len(losses_b)} losses; first differing step: "
            f"{differing[0] if differing else 'none (lengths differ)'}"
        )
        return 1
    print(f"identical: all {len(losses_a)} losses of the killed-and-resumed run equal the uninterrupted run's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
