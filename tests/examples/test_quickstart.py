"""The quick-start end to end: preprocess, train, SIGKILL, resume; the losses must be identical."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("matplotlib")
pytest.importorskip("msgpack")

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def run(script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [sys.executable, str(QUICKSTART / script), *arguments], capture_output=True, text=True, timeout=240
    )
    assert completed.returncode == 0, f"{script} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed


def example(name: str) -> types.ModuleType:
    """A quick-start script imported from its file as the module ``quickstart_NAME``."""
    spec = importlib.util.spec_from_file_location(f"quickstart_{name}", QUICKSTART / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # classes defined there are found by name (dataclasses, pickle)
    spec.loader.exec_module(module)
    return module


def printed_commands(output: str) -> list[list[str]]:
    """The commands the quick-start printed (``$ ...`` lines), as a shell would split them."""
    return [shlex.split(line[2:], comments=True) for line in output.splitlines() if line.startswith("$ ")]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("quickstart")
    completed = run(
        "run_all.py",
        *("--workdir", str(work), "--max-files", "5", "--steps", "40", "--checkpoint-every", "10"),
        *("--kill-at", "24", "--batch-size", "8", "--context", "32"),
    )
    return work, completed.stdout


def test_killed_and_resumed_run_has_identical_losses(quickstart: tuple[Path, str]) -> None:
    work, output = quickstart
    assert "identical: all 40 losses" in output
    assert "killed with SIGKILL at step" in output
    resumed = re.search(r"resumed from step (\d+) \(loader epoch (\d+)", output)
    assert resumed is not None and int(resumed.group(1)) >= 20
    assert int(resumed.group(2)) >= 1  # the tiny corpus makes the run cross epochs: reshuffles are resumed too
    a = json.loads((work / "run-a" / "losses.json").read_text())
    b = json.loads((work / "run-b" / "losses.json").read_text())
    assert len(a["losses"]) == 40 and a["losses"] == b["losses"]  # exact float equality, step for step
    assert b["steps_this_process"] < 40  # run B's last process only did the steps after the checkpoint
    assert a["tokens_per_second"] > 0
    assert (work / "losses.png").stat().st_size > 0


def test_conversations_in_two_formats(quickstart: tuple[Path, str], tmp_path: Path) -> None:
    work, _ = quickstart
    completed = run(
        "preprocess_conversations.py",
        *("--output", str(tmp_path), "--max-files", "12", "--tokenizer", str(work / "data" / "tokenizer.json")),
    )
    assert "struct:" in completed.stdout and "msgpack:" in completed.stdout and "batch 1:" in completed.stdout


def test_printed_commands_can_be_pasted(quickstart: tuple[Path, str]) -> None:
    """Each printed command names the interpreter and gives each option once."""
    _, output = quickstart
    commands = printed_commands(output)
    assert [Path(command[1]).name for command in commands] == ["preprocess.py", *["train.py"] * 3]
    for command in commands:
        assert command[0] == sys.executable
        options = [word for word in command if word.startswith("--")]
        assert len(options) == len(set(options)), f"an option given twice: {shlex.join(command)}"


def test_a_pasted_command_runs_and_gives_the_same_losses(quickstart: tuple[Path, str]) -> None:
    """Run A's printed command, pasted as it is (after removing run A), trains the same run again."""
    work, output = quickstart
    run_a = next(command for command in printed_commands(output) if str(work / "run-a") in command)
    before = json.loads((work / "run-a" / "losses.json").read_text())["losses"]
    shutil.rmtree(work / "run-a")
    completed = subprocess.run(run_a, capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stderr
    assert json.loads((work / "run-a" / "losses.json").read_text())["losses"] == before


def test_plot_legend_covers_no_curve() -> None:
    """The legend lies outside the axes (and off the axis label), inside the figure."""
    losses = [7.5 * 0.99**step + 3 for step in range(300)]
    figure = example("run_all").draw(losses, losses, killed_at=157, resumed_at=150)
    figure.canvas.draw()  # places the axis labels, as saving does
    renderer = figure.canvas.get_renderer()
    axes = figure.axes[0]
    legend = axes.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(axes.get_window_extent(renderer))
    assert not legend.overlaps(axes.xaxis.label.get_window_extent(renderer))
    assert figure.bbox.x0 <= legend.x0 and legend.x1 <= figure.bbox.x1 and figure.bbox.y0 <= legend.y0


def test_conversation_format_round_trip(tmp_path: Path) -> None:
    conversation_format = example("conversation_format")
    IGNORE_INDEX, ConversationFormat, collate = (
        conversation_format.IGNORE_INDEX,
        conversation_format.ConversationFormat,
        conversation_format.collate,
    )
    from guideloom import DocumentStorage

    conversations = [
        {
            "conversation_id": 5,
            "messages": [
                {"role": "system", "tokens": [1]},
                {"role": "user", "tokens": [2, 3]},
                {"role": "assistant", "tokens": [4, 5, 6]},
            ],
        },
        {"conversation_id": 2**40, "messages": []},
    ]
    storage = DocumentStorage(tmp_path, ConversationFormat())
    with storage.sync_writer() as writer:
        for conversation in conversations:
            writer.append(3, conversation)
    with storage.sync_reader() as reader:
        first, empty = reader.read(0), reader.read(1)
        assert first["conversation_id"] == 5 and first["shard"] == 3
        assert first["roles"].tolist() == [0, 1, 2] and first["lengths"].tolist() == [1, 2, 3]
        assert first["tokens"].tolist() == [1, 2, 3, 4, 5, 6] and not first["tokens"].flags.writeable  # zero-copy
        assert empty["conversation_id"] == 2**40 and empty["tokens"].size == 0
        batch = collate([first, first])
        del first, empty
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5]] * 2
    assert batch["labels"].tolist() == [[IGNORE_INDEX, IGNORE_INDEX, 4, 5, 6]] * 2  # loss on assistant tokens only
    with pytest.raises(ValueError, match="role"):
        ConversationFormat().pack({"conversation_id": 1, "messages": [{"role": "robot", "tokens": [1]}]})
    assert np.array_equal(np.frombuffer(ConversationFormat().pack(conversations[1]), "<u8", 1), [2**40])
