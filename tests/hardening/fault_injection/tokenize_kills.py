"""Kill ``guideloom tokenize`` runs at random instants, then finish them with ``--skip-existing``.

Two ways to kill:

``delay``  the whole process group (the command and its worker processes, as a job scheduler or the
           OOM killer of a container does) gets SIGKILL after a random delay within a full run's time;
``call``   the command (``--workers 1``: it writes every shard itself) kills itself just before or
           after the k-th call of ``os.fsync``, ``os.link``, ``open``, ... (see ``inject_cli.py``), k
           uniform over a full run's calls: lands on header creation, commits, and between shards
           (of one group of files and of different groups).

After each kill: every committed shard is byte-identical to an undisturbed run's, the storage opens
and verifies (or holds no header and no shard yet), and a rerun with ``--skip-existing`` exits 0
and completes the storage to exactly the undisturbed one; ``guideloom clean --older-than 0``
then leaves ``incomplete/`` empty.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guideloom import TokenStorage
from guideloom._shards.header import HEADER_NAME
from guideloom._shards.layout import committed_shard_ids, shard_file_name
from tests.helpers.processes import child_environment, module_command
from tests.helpers.storages import committed_shards

INJECT_CLI = "tests.hardening.fault_injection.inject_cli"
WORDS = "the a fox dog jumps over lazy quick brown alpha beta gamma delta naïve café 東京 def return".split()


@dataclass
class Setup:
    root: Path
    inputs: Path
    tokenizer: Path
    reference: dict[int, bytes]
    seconds: float
    calls: dict[str, int]


def _command(*arguments: object) -> list[str]:
    return [sys.executable, "-m", "guideloom", *map(str, arguments)]


def _tokenize_arguments(setup: Setup, output: Path, workers: int, *extra: str) -> list[str]:
    # 8 KiB shards: the groups of files write several shards each, so kills also land between a group's shards
    return ["tokenize", str(setup.inputs), str(output), "--tokenizer", str(setup.tokenizer), "--quiet",
            "--workers", str(workers), "--shard-size", "8KiB", *extra]  # fmt: skip


def prepare(root: Path, files: int = 8, documents: int = 150) -> Setup:
    """Inputs, a tokenizer, and an undisturbed run: its shard files, duration and call counts."""
    from guideloom.tokenize import train_tokenizer

    rng = random.Random(0)
    inputs = root / "inputs"
    inputs.mkdir(parents=True)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 300))) for _ in range(files * documents)]
    for number in range(files - 2):
        lines = texts[number * documents : (number + 1) * documents]
        (inputs / f"part-{number}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    (inputs / "whole.txt").write_text("\n".join(texts[-documents:]))  # one document
    (inputs / "zz-empty.txt").write_text("")  # no document, no shard
    tokenizer = train_tokenizer(texts[:200], 400, root / "tokenizer.json")
    setup = Setup(root, inputs, tokenizer, {}, 0.0, {})
    output = root / "reference"
    started = time.perf_counter()
    completed = subprocess.run(_command(*_tokenize_arguments(setup, output, 1)), capture_output=True, text=True)
    setup.seconds = time.perf_counter() - started
    assert completed.returncode == 0, completed.stderr
    setup.reference = {
        shard: (output / "shards" / shard_file_name(shard)).read_bytes() for shard in committed_shard_ids(output)
    }
    counted = root / "counted"
    completed = subprocess.run(
        module_command(INJECT_CLI, "count", "0", "-", *_tokenize_arguments(setup, counted, 1)),
        capture_output=True,
        text=True,
        env=child_environment(),
    )
    assert completed.returncode == 0, completed.stderr
    setup.calls = json.loads(completed.stderr.rsplit("COUNTS ", 1)[1])
    return setup


def plan(setup: Setup, count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    instants = [(name, k) for name, calls in sorted(setup.calls.items()) for k in range(1, calls + 1)]
    cases: list[dict[str, Any]] = []
    for number in range(count):
        if number % 3 == 2:
            name, k = rng.choice(instants)
            cases.append({"mode": "call", "workers": 1, "target": [name, k, rng.choice(["before", "after"])]})
        else:
            cases.append({"mode": "delay", "workers": 1 + number % 2, "delay": rng.uniform(0, setup.seconds * 1.1)})
    return cases


def _wait_for_group(group: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, "processes of the killed run remain"
        time.sleep(0.02)


def run_case(setup: Setup, case: dict[str, Any]) -> dict[str, Any]:
    output = setup.root / "case" / "out"
    shutil.rmtree(output.parent, ignore_errors=True)
    output.parent.mkdir()
    arguments = _tokenize_arguments(setup, output, case["workers"])
    if case["mode"] == "delay":
        process = subprocess.Popen(
            _command(*arguments), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(case["delay"])
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        _wait_for_group(process.pid)
        killed = process.returncode == -signal.SIGKILL
    else:
        name, k, when = case["target"]
        completed = subprocess.run(
            module_command(INJECT_CLI, name, k, when, *arguments),
            capture_output=True,
            text=True,
            env=child_environment(),
        )
        killed = completed.returncode == -signal.SIGKILL
        assert killed or completed.returncode == 0, completed.stderr
    # what the killed run left
    names = sorted(os.listdir(output / "shards")) if (output / "shards").is_dir() else []
    if (output / HEADER_NAME).exists():
        visible = committed_shards(output)
        assert names == sorted(map(shard_file_name, visible)), f"unexpected names in shards/: {names}"
        for shard in visible:  # a shard file under its name is committed, and complete
            assert (output / "shards" / shard_file_name(shard)).read_bytes() == setup.reference[shard], shard
        storage = TokenStorage(output)
        with storage.sync_reader() as reader:
            assert [shard.id for shard in reader.shards] == visible
            reader.read_tokens(0, reader.token_count)
        assert storage.verify() == []
    else:
        visible = []
        assert names == [], f"shards without a header: {names}"
    # finish the run
    completed = subprocess.run(_command(*arguments, "--skip-existing"), capture_output=True, text=True)
    assert completed.returncode == 0, f"the rerun with --skip-existing failed: {completed.stderr}"
    assert committed_shards(output) == sorted(setup.reference)
    for shard, data in setup.reference.items():
        assert (output / "shards" / shard_file_name(shard)).read_bytes() == data, f"shard {shard} differs"
    assert TokenStorage(output).verify() == []
    completed = subprocess.run(_command("clean", output, "--older-than", "0"), capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert os.listdir(output / "incomplete") == []
    return {"killed": killed, "visible": visible}
