"""``guideloom explain STATE`` and ``guideloom inspect PATH --lengths``: output, checkpoints, moved storages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._cli import main
from tests.helpers.batches import take
from tests.helpers.provenance import open_loader, token


def saved_state(mode: str, path: Path, batches: int = 2, **options: Any) -> tuple[dict[str, Any], Path]:
    """A state after ``batches`` batches of rank 0 of 2, saved as JSON; and where."""
    with open_loader(mode, path, rank=0, world_size=2, local_batch_size=2, **options) as loader:
        take(loader, batches)
        state = loader.state_dict()
    saved = path / "state.json"
    saved.write_text(json.dumps(state))
    return state, saved


def run(capsys: pytest.CaptureFixture[str], *arguments: object) -> tuple[int, str, str]:
    try:
        status = main([str(argument) for argument in arguments])
    except SystemExit as usage:  # argparse's own usage errors
        status = int(usage.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def every_rank(mode: str, path: Path, state: dict[str, Any], batches: int) -> list[dict[str, Any]]:
    with open_loader(mode, path, rank=0, world_size=2, local_batch_size=2) as loader:
        loader.load_state_dict(state)
        ranks = [loader.explain(batches, rank=rank) for rank in range(2)]
    return [ranks[rank][number] for number in range(batches) for rank in range(2)]


@pytest.mark.parametrize("mode", ["windows", "packed", "mixture-packed", "mixture-documents", "documents"])
def test_explain_json_is_what_every_rank_s_loader_explains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    state, saved = saved_state(mode, tmp_path)
    status, out, err = run(capsys, "explain", saved, "--batches", 7, "--json")
    assert (status, err) == (0, "")
    assert json.loads(out) == every_rank(mode, tmp_path, state, 7)


def test_explain_prints_each_batch_s_samples_for_a_person(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    with storage.sync_writer() as writer:
        writer.append(3, token(3, 0, np.arange(6)))
        writer.append(3, token(3, 1, np.arange(10)))
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=1, sequence_length=4) as loader:
        next(iter(loader))
        (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
    status, out, _ = run(capsys, "explain", tmp_path / "state.json", "--batches", 2)
    assert status == 0
    assert out.splitlines() == [
        "state:  epoch 0, position 1 of 4 samples (shuffle=False, seed=0); batches of 1 samples on each of 1 rank",
        f"reads:  the storage at {tmp_path / 'tokens'} (token windows, sequence_length 4)",
        "",
        "epoch 0, batch 1, rank 0:",
        "    0  shard 3, record 0 (index 0) [4:6] + shard 3, record 1 (index 1) [0:2]",
        "",
        "epoch 0, batch 2, rank 0:",
        "    0  shard 3, record 1 (index 1) [2:6]",
    ]


def test_explain_reads_a_torch_checkpoint_at_a_key_or_finds_its_only_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, saved = saved_state("packed", tmp_path)
    _, expected, _ = run(capsys, "explain", saved, "--batches", 3, "--rank", 1, "--json")
    checkpoint = tmp_path / "step-100.pt"
    torch.save({"model": {"weight": torch.ones(3)}, "trainer": {"data": {"loader": state}}}, checkpoint)
    assert (
        run(capsys, "explain", checkpoint, "--key", "trainer.data.loader", "--batches", 3, "--rank", 1, "--json")[1]
        == expected
    )
    assert run(capsys, "explain", checkpoint, "--batches", 3, "--rank", 1, "--json")[1] == expected
    torch.save({"a": state, "b": {"c": state}}, checkpoint)
    status, _, err = run(capsys, "explain", checkpoint)
    assert status == 2
    several = "must hold one guideloom loader state, and holds several (a, b.c): say which with --key"
    assert err == f"guideloom explain: error: {checkpoint} {several}\n"
    status, _, err = run(capsys, "explain", checkpoint, "--key", "b.d")
    assert (status, err) == (2, f"guideloom explain: error: --key b.d: {checkpoint} has no 'd' there: it holds 'c'\n")


def test_a_moved_storage_is_named_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, saved = saved_state("mixture-windows", tmp_path)
    shutil.move(tmp_path / "code", tmp_path / "elsewhere")
    status, out, err = run(capsys, "explain", saved)
    assert (status, out) == (1, "")
    assert err == (
        f"guideloom explain: error: the state read the mixture's component 'code' from the storage at "
        f"{tmp_path / 'code'}, which is gone (moved or deleted?): the directory does not exist\n"
    )


def test_summary_counts_each_component_s_samples_and_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state, saved = saved_state("mixture-windows", tmp_path)
    status, out, _ = run(capsys, "explain", saved, "--batches", 12, "--summary", "--json")
    assert status == 0
    document = json.loads(out)
    batches = every_rank("mixture-windows", tmp_path, state, 12)
    assert document["batches"] == batches
    samples = [sample for batch in batches for sample in batch["samples"]]
    assert document["summary"] == [
        {
            "component": name,
            "samples": sum(sample["component"] == name for sample in samples),
            "tokens": 16 * sum(sample["component"] == name for sample in samples),
            "scheduled": share,
        }
        for name, share in (("web", 4 / 6), ("code", 2 / 6))
    ]
    status, out, _ = run(capsys, "explain", saved, "--batches", 12, "--summary")
    lines = out.splitlines()
    assert lines[2:5] == [
        "",
        "summary over 12 batches, 48 samples:",
        "  component  samples  share  tokens  share  scheduled",
    ]
    assert [line.split() for line in lines[5:]] == [
        [
            row["component"],
            str(row["samples"]),
            f"{100 * row['samples'] / 48:.1f}%",
            str(row["tokens"]),
            f"{100 * row['samples'] / 48:.1f}%",
            f"{100 * row['scheduled']:.1f}%",
        ]
        for row in document["summary"]
    ]


def test_plot_draws_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, saved = saved_state("mixture-documents", tmp_path)
    status, _, err = run(capsys, "explain", saved, "--batches", 20, "--plot", tmp_path / "shares.png")
    assert (status, err) == (0, "")
    assert (tmp_path / "shares.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    status, _, err = run(capsys, "explain", saved, "--plot", tmp_path / "shares.jpg")
    assert status == 2 and "give a name ending in .png" in err


def test_a_rank_outside_the_state_s_world_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, saved = saved_state("windows", tmp_path)
    assert run(capsys, "explain", saved, "--rank", 2) == (
        2,
        "",
        "guideloom explain: error: --rank must be < the state's world_size (2), got 2\n",
    )


def test_a_file_that_holds_no_state_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "other.json").write_text('{"step": 3}')
    status, _, err = run(capsys, "explain", tmp_path / "other.json")
    assert status == 2 and "must hold one guideloom loader state, and holds none" in err
    (tmp_path / "other.bin").write_bytes(b"\x00\x01not json")
    status, _, err = run(capsys, "explain", tmp_path / "other.bin")
    assert status == 2 and "is neither JSON nor a torch checkpoint of plain data" in err


def lengths_storage(path: Path) -> TokenStorage:
    storage = TokenStorage(path, "uint16")
    with storage.sync_writer() as writer:
        for shard, lengths in enumerate([[0, 1, 5, 7], [8, 100, 0], [3]]):
            for length in lengths:
                writer.append(shard, np.arange(length) % 1000)
    return storage


def test_inspect_lengths_prints_a_histogram(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths_storage(tmp_path / "tokens")
    status, out, _ = run(capsys, "inspect", tmp_path / "tokens", "--lengths")
    assert status == 0
    assert out.splitlines()[-10:] == [
        "lengths:    tokens per document: 8 documents (2 empty), min 0, mean 15.5, max 100",
        "  tokens  documents  share  of tokens",
        "       0          2  25.0%       0.0%  ########################################",
        "       1          1  12.5%       0.8%  ####################",
        "     2-3          1  12.5%       2.4%  ####################",
        "     4-7          2  25.0%       9.7%  ########################################",
        "    8-15          1  12.5%       6.5%  ####################",
        "   16-31          0   0.0%       0.0%",
        "   32-63          0   0.0%       0.0%",
        "  64-127          1  12.5%      80.6%  ####################",
    ]


def test_inspect_lengths_reads_the_offsets_not_the_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths_storage(tmp_path / "tokens")
    _, before, _ = run(capsys, "inspect", tmp_path / "tokens", "--lengths")
    shard = tmp_path / "tokens" / "shards" / f"{1:012d}.shard"
    data = bytearray(shard.read_bytes())
    data[:200] = bytes(200)  # every token of shard 1, not its index
    shard.write_bytes(bytes(data))
    assert run(capsys, "inspect", tmp_path / "tokens", "--lengths") == (0, before, "")
    assert main(["verify", str(tmp_path / "tokens"), "--quiet"]) == 1  # the tokens did change
    capsys.readouterr()


def test_inspect_lengths_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths_storage(tmp_path / "tokens")
    assert run(capsys, "inspect", tmp_path / "tokens", "--lengths", "--plot", tmp_path / "lengths.png")[0] == 0
    assert (tmp_path / "lengths.png").read_bytes()[:4] == b"\x89PNG"
    assert run(capsys, "inspect", tmp_path / "tokens", "--plot", tmp_path / "lengths.png") == (
        2,
        "",
        "guideloom inspect: error: --plot draws the histogram of --lengths: add --lengths\n",
    )


def test_a_version_2_state_of_one_storage_is_explained_and_of_a_mixture_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, saved = saved_state("packed", tmp_path / "one")
    _, expected, _ = run(capsys, "explain", saved, "--json")
    older = {key: value for key, value in state.items() if key != "next_batch"} | {"guideloom_loader_state": 2}
    saved.write_text(json.dumps(older))
    assert run(capsys, "explain", saved, "--json") == (0, expected, "")
    state, saved = saved_state("mixture-windows", tmp_path / "mixture")
    source = {key: value for key, value in state["source"].items() if key != "storages"}
    saved.write_text(json.dumps({**state, "guideloom_loader_state": 2, "source": source}))
    status, _, err = run(capsys, "explain", saved)
    assert status == 2 and "names no storage of its mixture's components: it was taken by guideloom 0.2" in err


def test_explain_rebuilds_packing_that_truncates_long_documents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, saved = saved_state("packed", tmp_path, long_documents="truncate")
    with open_loader("packed", tmp_path, rank=0, world_size=2, local_batch_size=2, long_documents="truncate") as loader:
        loader.load_state_dict(state)
        expected = loader.explain(4)
    assert json.loads(run(capsys, "explain", saved, "--batches", 4, "--rank", 0, "--json")[1]) == expected
