"""Quick-start, step 2: train a small GPT on a guideloom TokenStorage, checkpoint, resume exactly.

The model is a few-layer GPT in plain PyTorch, small enough to train on two CPU
cores. Batches come from ``StatefulDataLoader`` (shuffled, seeded): windows of
``--context + 1`` tokens of the storage's token stream, so inputs and next-token
targets are the same window shifted by one.

Every ``--checkpoint-every`` steps (and at the last step) the script saves, atomically,
everything the rest of the run depends on: the model, the optimizer, the loader's
``state_dict()`` (a few integers: no replay of consumed batches on resume), the
torch RNG state (dropout) and the losses so far. ``--resume`` continues from the
last checkpoint. On CPU the run is deterministic (``torch.manual_seed``,
``torch.use_deterministic_algorithms(True)``, a fixed number of threads), so a run
killed at any moment and resumed produces the same losses, step for step and bit
for bit, as a run never interrupted. Losses go to ``OUT/losses.json``::

    python examples/quickstart/train.py --data runs/quickstart/data/tokens --out runs/quickstart/train --steps 300
    # kill it (Ctrl-C, kill -9, preemption) and run the same command with --resume
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from guideloom import StatefulDataLoader, TokenStorage

CHECKPOINT = "checkpoint.pt"
LOSSES = "losses.json"
# Arguments that must not change across a resume: they decide what the run computes.
RUN_DEFINING = (
    "data",
    "steps",
    "batch_size",
    "context",
    "layers",
    "dim",
    "heads",
    "dropout",
    "lr",
    "seed",
    "threads",
    "vocab_size",
)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dropout(self.proj(attended.transpose(1, 2).reshape(batch, length, dim)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, context: int, layers: int, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.position_embedding = nn.Embedding(context, dim)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied embeddings
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def learning_rate(step: int, total: int, peak: float) -> float:
    """Linear warm-up over 10% of the steps, then cosine decay to 10% of the peak (a function of the step)."""
    warmup = max(1, total // 10)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def endless(loader: StatefulDataLoader) -> Iterator[Any]:
    """Batch after batch across epochs; iter() continues the loader's epoch or starts the next."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise RuntimeError("the loader yields no batches: the storage is smaller than one batch")


def vocabulary_size(data: Path, storage: TokenStorage) -> int:
    """From the tokenizer.json that preprocess.py saves beside the storage, else the largest id + 1."""
    tokenizer = data.parent / "tokenizer.json"
    if tokenizer.is_file():
        from tokenizers import Tokenizer

        return int(Tokenizer.from_file(str(tokenizer)).get_vocab_size(with_added_tokens=True))
    with storage.sync_reader() as reader:
        return 1 + max((int(reader.read(i).max()) for i in range(len(reader)) if reader.read(i).size), default=0)


def save_atomically(path: Path, write: Any) -> None:
    """Write to a temporary file, fsync, rename over ``path``: a kill leaves the old or the new file."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_losses(out: Path, losses: list[float], config: dict[str, Any], extra: dict[str, Any]) -> None:
    document = {"config": config, "losses": losses, **extra}
    save_atomically(out / LOSSES, lambda file: file.write(json.dumps(document, indent=1).encode()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("runs/quickstart/data/tokens"), help="token storage")
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart/train"), help="checkpoint + losses dir")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=50, metavar="K")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt if there is one")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=64, help="tokens per training sequence (T)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed: part of determinism)")
    parser.add_argument("--vocab-size", type=int, default=None, help="default: from DATA/../tokenizer.json")
    parser.add_argument("--log-every", type=int, default=1)
    arguments = parser.parse_args(argv)
    if arguments.steps < 1 or arguments.checkpoint_every < 1:
        parser.error("--steps and --checkpoint-every must be positive")

    torch.set_num_threads(arguments.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(arguments.seed)
    device = torch.device("cpu")

    storage = TokenStorage(arguments.data)
    if arguments.vocab_size is None:
        arguments.vocab_size = vocabulary_size(arguments.data, storage)
    config = {key: str(value) if isinstance(value, Path) else value for key, value in vars(arguments).items()}
    defining = {key: config[key] for key in RUN_DEFINING}

    model = GPT(
        arguments.vocab_size, arguments.context, arguments.layers, arguments.dim, arguments.heads, arguments.dropout
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=arguments.lr, weight_decay=0.1, betas=(0.9, 0.95))
    parameters = sum(p.numel() for p in model.parameters())

    arguments.out.mkdir(parents=True, exist_ok=True)
    checkpoint_path = arguments.out / CHECKPOINT
    step = 0
    losses: list[float] = []
    with StatefulDataLoader.from_storage(
        storage,
        device=device,
        local_batch_size=arguments.batch_size,
        sequence_length=arguments.context + 1,  # inputs and next-token targets from one window
        shuffle=True,
        seed=arguments.seed,
        drop_last=True,
    ) as loader:
        if checkpoint_path.exists():
            if not arguments.resume:
                parser.error(f"{checkpoint_path} exists: pass --resume to continue it, or choose another --out")
            checkpoint = torch.load(checkpoint_path, map_location=device, weights_only=True)
            if checkpoint["run"] != defining:
                changed = sorted(key for key in defining if checkpoint["run"].get(key) != defining[key])
                parser.error(f"the checkpoint was made with other settings: {', '.join(changed)}")
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            loader.load_state_dict(checkpoint["loader"])
            torch.set_rng_state(checkpoint["torch_rng"])
            step, losses = checkpoint["step"], list(checkpoint["losses"])
            print(f"resumed from step {step} (loader epoch {loader.epoch}, position {loader.position})", flush=True)
        elif arguments.resume:
            print("no checkpoint yet: starting from step 0", flush=True)

        tokens_per_step = arguments.batch_size * arguments.context
        print(
            f"model: {parameters:,} parameters; {len(loader)} batches of {arguments.batch_size} x "
            f"{arguments.context + 1} tokens per epoch; {arguments.steps} steps",
            flush=True,
        )
        model.train()
        batches = endless(loader)
        started = time.perf_counter()
        first_step = step
        while step < arguments.steps:
            batch = next(batches)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, arguments.steps, arguments.lr)
            loss = model(batch[:, :-1], batch[:, 1:])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            losses.append(loss.item())
            if step % arguments.log_every == 0 or step == arguments.steps:
                print(f"step {step} loss {losses[-1]:.4f}", flush=True)
            if step % arguments.checkpoint_every == 0 or step == arguments.steps:
                state = {
                    "step": step,
                    "run": defining,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),  # taken between batches: the position after this one
                    "torch_rng": torch.get_rng_state(),
                    "losses": losses,
                }
                save_atomically(checkpoint_path, lambda file, state=state: torch.save(state, file))
                write_losses(arguments.out, losses, config, {"complete": step == arguments.steps})
                print(f"checkpoint step {step}", flush=True)
        seconds = time.perf_counter() - started
        trained = step - first_step
        rate = trained * tokens_per_step / seconds if seconds > 0 else 0.0
        write_losses(
            arguments.out,
            losses,
            config,
            {"complete": True, "tokens_per_second": rate, "steps_this_process": trained, "seconds": seconds},
        )
    print(f"done: {trained} steps in {seconds:.1f} s, {rate:,.0f} tokens/s; final loss {losses[-1]:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
