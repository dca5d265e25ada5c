"""Lightning: fit and resume from ``ckpt_path`` are exact, in one process and under DDP (ranks read disjoint data)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from guideloom import TokenStorage
from tests.helpers.loaders import framework_loader
from tests.integrations.two_ranks import run_two_ranks

VOCABULARY = 64  # the token ids of the tokens fixture are below it


class TinyLanguageModel(lightning.LightningModule):
    """An embedding and a linear layer; records every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, 8)
        self.head = torch.nn.Linear(8, VOCABULARY)
        self.seen: list[list[list[int]]] = []

    def training_step(self, batch: torch.Tensor, batch_index: int) -> torch.Tensor:
        self.seen.append(batch.tolist())
        logits = self.head(self.embedding(batch[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        # Reading estimated_stepping_batches is safe with max_steps and no max_epochs (Lightning issue #20550).
        total = int(self.trainer.estimated_stepping_batches)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class StopAt(lightning.Callback):
    """Ends training after batch ``step`` (its checkpoint is written in the same hook), as a crash would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: lightning.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


def fit(
    tokens: TokenStorage, callbacks: list[Any], accumulation: int, steps: int, ckpt_path: Path | None = None
) -> TinyLanguageModel:
    torch.manual_seed(0)
    model = TinyLanguageModel()
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        accumulate_grad_batches=accumulation,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(callback, ModelCheckpoint) for callback in callbacks),
    )
    with framework_loader(tokens) as loader:
        trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize(
    ("accumulation", "steps", "saved_at", "batches"),
    [(1, 20, 6, 20), (2, 11, 3, 21)],  # 15 batches an epoch: 15 or 8 optimizer steps (the last with one batch)
)
def test_resume_from_ckpt_path_continues_with_the_uninterrupted_runs_batches(
    tokens: TokenStorage, tmp_path: Path, accumulation: int, steps: int, saved_at: int, batches: int
) -> None:
    uninterrupted = fit(tokens, [], accumulation, steps)
    assert len(uninterrupted.seen) == batches
    saving = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints", filename="{step}", every_n_train_steps=saved_at, save_top_k=-1
    )
    interrupted = fit(tokens, [saving, StopAt(saved_at)], accumulation, steps)
    resumed = fit(tokens, [], accumulation, steps, ckpt_path=tmp_path / "checkpoints" / f"step={saved_at}.ckpt")

    consumed = saved_at * accumulation
    assert interrupted.seen == uninterrupted.seen[:consumed]
    assert resumed.seen == uninterrupted.seen[consumed:]
    for name, parameter in uninterrupted.named_parameters():
        assert torch.equal(parameter, resumed.get_parameter(name)), name


DDP_SCRIPT = """
import json
import os
import sys
import time
from pathlib import Path

import lightning
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from guideloom import StatefulDataLoader, TokenStorage

# python train_ddp.py STORAGE OUT [STOP_AT_STEP | CHECKPOINT]: a whole epoch; or one stopped after a
# step, checkpointed there; or one resumed from a checkpoint. Each rank writes what it trained on.


class Recorder(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.seen = []

    def train_dataloader(self):
        # Built here, once the process group exists: the loader takes its rank from it.
        return StatefulDataLoader.from_storage(
            TokenStorage(sys.argv[1]), device="cpu", local_batch_size=4, sequence_length=17,
            shuffle=True, seed=3, drop_last=True,
        )

    def training_step(self, batch, batch_index):
        self.seen.append(batch.tolist())
        return self.layer(batch[:, 1:].float()).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopAt(lightning.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            trainer.should_stop = True


if __name__ == "__main__":
    torch.set_num_threads(1)
    out = Path(sys.argv[2])
    stop_at = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else None
    checkpoint = sys.argv[3] if len(sys.argv) > 3 and stop_at is None else None
    callbacks = []
    if stop_at is not None:
        callbacks = [
            ModelCheckpoint(dirpath=out / "checkpoints", filename="{step}", every_n_train_steps=stop_at, save_top_k=-1),
            StopAt(stop_at),
        ]
    model = Recorder()
    trainer = lightning.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False, callbacks=callbacks,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=stop_at is not None,
    )
    trainer.fit(model, ckpt_path=checkpoint)
    loader = trainer.train_dataloader
    result = {"rank": loader.rank, "world_size": loader.world_size, "seen": model.seen}
    written = out / f"rank{trainer.global_rank}.json"
    written.with_suffix(".part").write_text(json.dumps(result))
    written.with_suffix(".part").rename(written)
    # Rank 0 started rank 1 and is the process the test waits for: it ends once every rank's result is
    # written. Then skip the interpreter's teardown: torch's native threads (gloo) abort it now and then
    # with "terminate called without an active exception", after everything above is done.
    deadline = time.monotonic() + 60
    while not all((out / f"rank{rank}.json").exists() for rank in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0)
"""


def run_ddp(tokens: TokenStorage, script_folder: Path, out: Path, *arguments: str) -> list[dict[str, Any]]:
    """Run the DDP script with two ranks on the CPU (Lightning starts the second); what each rank trained on."""
    return run_two_ranks(
        [sys.executable], DDP_SCRIPT, script_folder, out, [str(tokens.path), str(out), *arguments], 120
    )


def rank_batches(tokens: TokenStorage, rank: int) -> list[list[list[int]]]:
    """The epoch that rank ``rank`` of two reads, from a loader told its rank."""
    with framework_loader(tokens, drop_last=True, rank=rank, world_size=2) as loader:
        return [batch.tolist() for batch in loader]


def test_ddp_ranks_read_disjoint_slices_with_the_loader_built_in_train_dataloader(
    tokens: TokenStorage, tmp_path: Path
) -> None:
    ranks = run_ddp(tokens, tmp_path, tmp_path)

    assert [(result["rank"], result["world_size"]) for result in ranks] == [(0, 2), (1, 2)]
    for rank, result in enumerate(ranks):
        assert result["seen"] == rank_batches(tokens, rank)
    windows = [{tuple(row) for batch in result["seen"] for row in batch} for result in ranks]
    assert len(windows[0]) == len(windows[1]) == 7 * 4 and not windows[0] & windows[1]


def test_ddp_resume_from_ckpt_path_continues_each_ranks_batches(tokens: TokenStorage, tmp_path: Path) -> None:
    # Lightning writes the checkpoint on rank 0 only: every rank resumes from rank 0's loader state.
    stopped = run_ddp(tokens, tmp_path, tmp_path / "stopped", "3")
    resumed = run_ddp(tokens, tmp_path, tmp_path / "resumed", str(tmp_path / "stopped" / "checkpoints" / "step=3.ckpt"))

    for rank in range(2):
        expected = rank_batches(tokens, rank)
        assert stopped[rank]["seen"] == expected[:3]
        assert resumed[rank]["seen"] == expected[3:]
