"""Exact resume under the Hugging Face ``Trainer``: a callback that checkpoints the loader's state.

The ``Trainer`` knows nothing of a loader that is not a ``torch.utils.data.DataLoader``: on resume it
would either try to skip the consumed batches by rebuilding a ``DataLoader`` from ``loader.dataset``
(which fails) or, with ``TrainingArguments(ignore_data_skip=True)``, start the data again at the
first batch. :class:`LoaderStateCallback` stores ``loader.state_dict()`` in every checkpoint (in its
``trainer_state.json``) and gives it back to the loader when ``trainer.train(resume_from_checkpoint=...)``
begins, so the resumed run reads exactly the batches an uninterrupted run would have read.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Protocol, runtime_checkable

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

STATE_KEY = "guideloom_loader"
"""Where the loader's state lives in ``TrainerState.stateful_callbacks`` (so in ``trainer_state.json``)."""


@runtime_checkable
class ResumableLoader(Protocol):
    """What the callback needs of a loader: its epoch length and its state."""

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LoaderStateCallback(TrainerCallback):
    """Save the loader's state with every checkpoint and restore it when training resumes from one.

    Use it with a ``Trainer`` whose ``get_train_dataloader()`` returns ``loader`` and with
    ``TrainingArguments(ignore_data_skip=True)``: the loader itself continues where the checkpoint
    was taken, so the ``Trainer`` must not try to skip batches (it cannot, for this loader).
    """

    def __init__(self, loader: ResumableLoader) -> None:
        if not isinstance(loader, ResumableLoader):
            raise TypeError(
                "loader must have __len__, state_dict and load_state_dict (a guideloom StatefulDataLoader), "
                f"got {type(loader).__name__}"
            )
        self.loader = loader

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        _require_ignore_data_skip(args)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        _require_ignore_data_skip(args)
        saved = _callback_states(state).get(STATE_KEY)
        if saved is None and state.global_step > 0:
            raise ValueError(
                f"the checkpoint resumed at step {state.global_step} holds no loader state (it was saved without "
                "LoaderStateCallback): the loader would read the data again from its first batch"
            )
        mid_epoch = saved is not None and state.global_step % self._updates_per_epoch(args) != 0
        uneven = args.gradient_accumulation_steps > 1 and len(self.loader) % args.gradient_accumulation_steps != 0
        if uneven and mid_epoch:
            raise ValueError(
                f"cannot resume exactly from step {state.global_step}, in the middle of an epoch of "
                f"{len(self.loader)} batches, with gradient_accumulation_steps={args.gradient_accumulation_steps}: "
                "the Trainer counts the resumed epoch's batches from 0 and would not step the optimizer after its "
                "last, incomplete accumulation. Resume from a checkpoint taken at the end of an epoch, or use "
                "a number of batches per epoch that gradient_accumulation_steps divides"
            )
        if uneven and saved is None:
            warnings.warn(
                f"gradient_accumulation_steps={args.gradient_accumulation_steps} does not divide the "
                f"{len(self.loader)} batches of an epoch: checkpoints taken in the middle of an epoch cannot be "
                "resumed exactly (LoaderStateCallback refuses to); checkpoints at the end of an epoch can",
                stacklevel=2,
            )
        if saved is not None:
            self.loader.load_state_dict(saved)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # The Trainer writes trainer_state.json right after this hook (and after on_epoch_end), when it saves.
        _callback_states(state)[STATE_KEY] = self.loader.state_dict()

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        _callback_states(state)[STATE_KEY] = self.loader.state_dict()

    def _updates_per_epoch(self, args: TrainingArguments) -> int:
        return max(1, math.ceil(len(self.loader) / args.gradient_accumulation_steps))


def _callback_states(state: TrainerState) -> dict[str, Any]:
    """The states the Trainer saves in ``trainer_state.json``: a dict once the state exists (annotated as a list)."""
    states: Any = state.stateful_callbacks
    assert isinstance(states, dict)
    return states


def _require_ignore_data_skip(args: TrainingArguments) -> None:
    if not args.ignore_data_skip:
        raise ValueError(
            "LoaderStateCallback needs TrainingArguments(ignore_data_skip=True): the loader resumes itself from "
            "the checkpoint, and the Trainer's own skipping of consumed batches cannot work with it "
            "(it rebuilds a torch DataLoader from loader.dataset)"
        )
