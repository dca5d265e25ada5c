"""The Hugging Face Trainer with LoaderStateCallback resumes exactly (a two-layer GPT-2 on CPU), alone and under DDP."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from guideloom import StatefulDataLoader, TokenStorage
from guideloom.integrations.transformers import STATE_KEY, LoaderStateCallback
from tests.helpers.loaders import framework_loader
from tests.integrations.two_ranks import run_two_ranks

VOCABULARY = 64  # the token ids of the tokens fixture are below it


def language_model_batch(rows: list[np.ndarray]) -> dict[str, torch.Tensor]:
    windows = torch.from_numpy(np.stack(rows))
    return {"input_ids": windows, "labels": windows}


class GuideloomTrainer(Trainer):  # type: ignore[misc]
    """Reads its training batches from a guideloom loader, and records them."""

    def __init__(self, loader: StatefulDataLoader, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.loader = loader
        self.seen: list[list[list[int]]] = []

    def get_train_dataloader(self) -> StatefulDataLoader:
        return self.loader

    def training_step(self, model: Any, inputs: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        self.seen.append(inputs["input_ids"].tolist())
        return super().training_step(model, inputs, *args, **kwargs)


class StopAfterSaving(TrainerCallback):  # type: ignore[misc]
    """Ends training right after the checkpoint at ``step``, as a crash would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            control.should_training_stop = True


def make_trainer(loader: StatefulDataLoader, output: Path, callbacks: list[Any], **options: Any) -> GuideloomTrainer:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=VOCABULARY)
    arguments = TrainingArguments(
        output_dir=str(output),
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
        **{"ignore_data_skip": True, "save_strategy": "steps", **options},
    )
    return GuideloomTrainer(loader, model=GPT2LMHeadModel(config), args=arguments, callbacks=callbacks)


@pytest.mark.parametrize(
    ("accumulation", "steps", "saved_at"),
    [(1, 20, 6), (3, 7, 2)],  # 15 batches an epoch: 15 or 5 optimizer steps; both runs cross into epoch 2
)
def test_resume_from_checkpoint_continues_with_the_uninterrupted_runs_batches(
    tokens: TokenStorage, tmp_path: Path, accumulation: int, steps: int, saved_at: int
) -> None:
    options = {"max_steps": steps, "save_steps": saved_at, "gradient_accumulation_steps": accumulation}
    with framework_loader(tokens, language_model_batch) as loader:
        callbacks = [LoaderStateCallback(loader)]
        uninterrupted = make_trainer(loader, tmp_path / "uninterrupted", callbacks, **options, save_strategy="no")
        uninterrupted.train()
    with framework_loader(tokens, language_model_batch) as loader:
        callbacks = [LoaderStateCallback(loader), StopAfterSaving(saved_at)]
        interrupted = make_trainer(loader, tmp_path / "run", callbacks, **options)
        interrupted.train()
        checkpoint = tmp_path / "run" / f"checkpoint-{saved_at}"
        saved = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"][STATE_KEY]
        assert saved == loader.state_dict()
    with framework_loader(tokens, language_model_batch) as loader:
        resumed = make_trainer(loader, tmp_path / "run", [LoaderStateCallback(loader)], **options)
        resumed.train(resume_from_checkpoint=str(checkpoint))

    consumed = saved_at * accumulation
    assert len(uninterrupted.seen) == steps * accumulation
    assert interrupted.seen == uninterrupted.seen[:consumed]
    assert resumed.seen == uninterrupted.seen[consumed:]
    for name, parameter in uninterrupted.model.named_parameters():
        assert torch.equal(parameter, resumed.model.get_parameter(name)), name


def test_accumulation_that_does_not_divide_the_epoch_refuses_a_mid_epoch_resume(
    tokens: TokenStorage, tmp_path: Path
) -> None:
    with framework_loader(
        tokens, language_model_batch
    ) as loader:  # 15 batches an epoch, accumulated by 2: 8 optimizer steps
        callback = LoaderStateCallback(loader)
        arguments = TrainingArguments(output_dir=str(tmp_path), gradient_accumulation_steps=2, ignore_data_skip=True)
        state = TrainerState(global_step=3, stateful_callbacks={STATE_KEY: loader.state_dict()})
        with pytest.raises(ValueError, match="cannot resume exactly from step 3"):
            callback.on_train_begin(arguments, state, TrainerControl())
        state.global_step = 8  # the end of the first epoch
        callback.on_train_begin(arguments, state, TrainerControl())
        with pytest.warns(UserWarning, match="does not divide"):  # a fresh run is told at once
            callback.on_train_begin(arguments, TrainerState(), TrainerControl())


def test_the_callback_requires_ignore_data_skip(tokens: TokenStorage, tmp_path: Path) -> None:
    with (
        framework_loader(tokens, language_model_batch) as loader,
        pytest.raises(ValueError, match="ignore_data_skip=True"),
    ):
        make_trainer(loader, tmp_path, [LoaderStateCallback(loader)], ignore_data_skip=False)


def test_a_checkpoint_without_the_loader_state_is_refused(tokens: TokenStorage, tmp_path: Path) -> None:
    with framework_loader(tokens, language_model_batch) as loader:
        arguments = TrainingArguments(output_dir=str(tmp_path), ignore_data_skip=True)
        with pytest.raises(ValueError, match="holds no loader state"):
            LoaderStateCallback(loader).on_train_begin(arguments, TrainerState(global_step=4), TrainerControl())


def test_the_callback_takes_only_a_resumable_loader() -> None:
    with pytest.raises(TypeError, match="state_dict"):
        LoaderStateCallback([1, 2, 3])  # type: ignore[arg-type]


DDP_SCRIPT = """
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from guideloom import StatefulDataLoader, TokenStorage
from guideloom.integrations.transformers import LoaderStateCallback

# torchrun --nproc_per_node 2 train_ddp.py STORAGE OUT [STOP_AT_STEP | CHECKPOINT]: six steps; or a run
# stopped after a step, checkpointed there; or one resumed from a checkpoint. Each rank writes what it read.


def language_model_batch(rows):
    windows = torch.from_numpy(np.stack(rows))
    return {"input_ids": windows, "labels": windows}


class LoaderTrainer(Trainer):
    def __init__(self, loader, **kwargs):
        super().__init__(**kwargs)
        self.loader = loader
        self.seen = []

    def get_train_dataloader(self):
        return self.loader

    def training_step(self, model, inputs, *args, **kwargs):
        self.seen.append(inputs["input_ids"].tolist())
        return super().training_step(model, inputs, *args, **kwargs)


class StopAfterSaving(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


if __name__ == "__main__":
    torch.set_num_threads(1)
    out = Path(sys.argv[2])
    stop_at = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else None
    checkpoint = sys.argv[3] if len(sys.argv) > 3 and stop_at is None else None
    # torchrun sets RANK and WORLD_SIZE before this script runs: the loader can be built first.
    loader = StatefulDataLoader.from_storage(
        TokenStorage(sys.argv[1]), language_model_batch, device="cpu", local_batch_size=4, sequence_length=17,
        shuffle=True, seed=3, drop_last=True,
    )
    torch.manual_seed(0)
    arguments = TrainingArguments(
        output_dir=str(out / "run"), learning_rate=1e-3, report_to="none", use_cpu=True, disable_tqdm=True,
        logging_strategy="no", ignore_data_skip=True, max_steps=6, per_device_train_batch_size=4,
        save_strategy="steps" if stop_at else "no", save_steps=stop_at or 500,
    )
    callbacks = [LoaderStateCallback(loader)] + ([StopAfterSaving(stop_at)] if stop_at else [])
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64)
    trainer = LoaderTrainer(loader, model=GPT2LMHeadModel(config), args=arguments, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=checkpoint)
    result = {"rank": loader.rank, "world_size": loader.world_size, "seen": trainer.seen}
    with open(out / f"rank{loader.rank}.json", "w") as file:
        json.dump(result, file)
    loader.close()
    # Skip the interpreter's teardown: torch's native threads (gloo, the rendezvous store) abort it now and
    # then with "terminate called without an active exception", after everything above is done and written.
    os._exit(0)
"""


def run_ddp(tokens: TokenStorage, script_folder: Path, out: Path, *arguments: str) -> list[dict[str, Any]]:
    """Run the DDP script under torchrun with two ranks on the CPU; what each rank trained on."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return run_two_ranks(torchrun, DDP_SCRIPT, script_folder, out, [str(tokens.path), str(out), *arguments], 180)


def test_ddp_under_torchrun_resumes_each_ranks_batches(tokens: TokenStorage, tmp_path: Path) -> None:
    # The Trainer saves on rank 0 only: every rank resumes from rank 0's loader state.
    stopped = run_ddp(tokens, tmp_path, tmp_path / "stopped", "3")
    resumed = run_ddp(tokens, tmp_path, tmp_path / "resumed", str(tmp_path / "stopped" / "run" / "checkpoint-3"))

    for rank in range(2):
        with StatefulDataLoader.from_storage(
            tokens,
            device="cpu",
            local_batch_size=4,
            sequence_length=17,
            shuffle=True,
            seed=3,
            drop_last=True,
            rank=rank,
            world_size=2,
        ) as loader:
            expected = [batch.tolist() for batch in loader]
        assert (stopped[rank]["rank"], stopped[rank]["world_size"]) == (rank, 2)
        assert stopped[rank]["seen"] == expected[:3]
        assert resumed[rank]["seen"] == expected[3:6]
