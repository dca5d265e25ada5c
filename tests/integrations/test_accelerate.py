"""accelerate: prepare() passes the loader through; register_for_checkpointing makes save_state/load_state exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from guideloom import TokenStorage
from tests.helpers.loaders import framework_loader

VOCABULARY = 64  # the token ids of the tokens fixture are below it

BATCHES = 20  # the epoch has 15 batches: the resumed run crosses into the second epoch
SAVED_AT = 8


def train(
    tokens: TokenStorage, checkpoint: Path, accumulation: int, *, stop_at: int, resume: bool = False
) -> tuple[list[list[list[int]]], dict[str, torch.Tensor]]:
    """Train up to batch ``stop_at`` of the run (saving the state there), or resume from the saved state."""
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCABULARY, 8), torch.nn.Linear(8, VOCABULARY))
    seen: list[list[list[int]]] = []
    with framework_loader(tokens) as loader:
        model, optimizer, prepared = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
        assert prepared is loader
        accelerator.register_for_checkpointing(loader)
        done = 0
        if resume:
            accelerator.load_state(str(checkpoint))
            done = SAVED_AT
        while done < stop_at:
            for batch in loader:
                with accelerator.accumulate(model):
                    logits = model(batch[:, :-1])
                    accelerator.backward(
                        torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
                    )
                    optimizer.step()
                    optimizer.zero_grad()
                seen.append(batch.tolist())
                done += 1
                if done == SAVED_AT and not resume:
                    assert accelerator.sync_gradients  # checkpoints are taken right after an optimizer step
                    accelerator.save_state(str(checkpoint))
                if done == stop_at:
                    break
    return seen, {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


@pytest.mark.parametrize("accumulation", [1, 2])
def test_save_state_and_load_state_resume_exactly(tokens: TokenStorage, tmp_path: Path, accumulation: int) -> None:
    uninterrupted, final = train(tokens, tmp_path / "unused", accumulation, stop_at=BATCHES)
    interrupted, _ = train(tokens, tmp_path / "state", accumulation, stop_at=SAVED_AT)
    resumed, resumed_final = train(tokens, tmp_path / "state", accumulation, stop_at=BATCHES, resume=True)

    assert len(uninterrupted) == BATCHES
    assert interrupted == uninterrupted[:SAVED_AT]
    assert resumed == uninterrupted[SAVED_AT:]
    for name, parameter in final.items():
        assert torch.equal(parameter, resumed_final[name]), name
