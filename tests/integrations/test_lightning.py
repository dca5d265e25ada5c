"""Lightning: fit and resume from ``ckpt_path`` are exact in one process; under DDP the ranks read disjoint data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from guideloom import StatefulDataLoader, TokenStorage

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


def make_loader(tokens: TokenStorage, **options: Any) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(
        tokens, device="cpu", local_batch_size=4, sequence_length=17, shuffle=True, seed=3, **options
    )


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
    with make_loader(tokens) as loader:
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
import sys

import lightning
import torch

from guideloom import StatefulDataLoader, TokenStorage


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


if __name__ == "__main__":
    torch.set_num_threads(1)
    model = Recorder()
    trainer = lightning.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(model)
    loader = trainer.train_dataloader
    result = {"rank": loader.rank, "world_size": loader.world_size, "seen": model.seen}
    with open(f"{sys.argv[2]}/rank{trainer.global_rank}.json", "w") as file:
        json.dump(result, file)
"""


def test_ddp_ranks_read_disjoint_slices_with_the_loader_built_in_train_dataloader(
    tokens: TokenStorage, tmp_path: Path
) -> None:
    script = tmp_path / "train_ddp.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    completed = subprocess.run(
        [sys.executable, str(script), str(tokens.path), str(tmp_path)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]

    assert [(result["rank"], result["world_size"]) for result in ranks] == [(0, 2), (1, 2)]
    for rank, result in enumerate(ranks):
        with make_loader(tokens, drop_last=True, rank=rank, world_size=2) as loader:
            assert result["seen"] == [batch.tolist() for batch in loader]
    windows = [{tuple(row) for batch in result["seen"] for row in batch} for result in ranks]
    assert len(windows[0]) == len(windows[1]) == 7 * 4 and not windows[0] & windows[1]
