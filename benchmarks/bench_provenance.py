"""Provenance: what the next-batch digest adds to ``state_dict()``, what ``explain`` costs, and ``--lengths``.

Writes ``results/provenance.json`` and prints a table. One run, best of 5 each:

1. ``state_dict()`` at a new position (after each batch, as a loop that saves every step calls it),
   as a ratio to the batch itself (one shuffled (8, 2048) batch of the same loader, ``num_workers``
   0), for plain windows, packed rows and a mixture of two storages. The digest locates one sample
   from its indexes; a second call at the same position is cached.
2. ``explain(1)`` per batch, against the same batch.
3. ``guideloom inspect --lengths`` (the histogram from the shards' offsets) against the straightforward
   way a user would take: ``len(reader.read(i))`` for every document.

    python -m benchmarks.bench_provenance              # 20M tokens, under a minute on 2 cores
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import argument_parser, machine, timed, write_results
from guideloom import Mixture, StatefulDataLoader, TokenStorage
from guideloom._cli.lengths import Lengths

SEQUENCE_LENGTH = 2048
BATCH = 8


def write(path: Path, tokens: int, shards: int, seed: int) -> TokenStorage:
    """Documents of 50-5,000 uint32 tokens, about ``tokens`` in all, over ``shards`` shards."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 5001, tokens // 2525 + 1)
    storage = TokenStorage(path, dtype="uint32")
    with storage.sync_writer() as writer:
        for document, length in enumerate(lengths.tolist()):
            writer.append(document * shards // len(lengths), rng.integers(0, 50_000, length, dtype=np.uint32))
    return storage


def best(run: Callable[[], object], repeats: int = 5) -> float:
    return timed(run, repeats).best


def per_batch(make: Callable[[], StatefulDataLoader], steps: int) -> dict[str, float]:
    """Seconds per batch read, per state_dict() at a new position, per explain(1)."""
    with make() as loader:

        def read() -> None:
            iterator = iter(loader)
            for _ in range(steps):
                next(iterator)

        def states() -> None:
            for _ in range(steps):
                loader.skip(1)
                loader.state_dict()

        def skips() -> None:
            for _ in range(steps):
                loader.skip(1)

        def explains() -> None:
            for _ in range(steps):
                loader.explain(1)

        loader.state_dict()  # the source's identity, computed once per loader
        batch = best(read) / steps
        state = (best(states) - best(skips)) / steps
        explain = best(explains) / steps
    return {"batch_s": batch, "state_dict_s": state, "explain_s": explain}


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        web = write(Path(directory) / "web", arguments.tokens, arguments.shards, 0)
        code = write(Path(directory) / "code", arguments.tokens // 4, arguments.shards, 1)
        options: dict[str, Any] = {"device": "cpu", "local_batch_size": BATCH, "sequence_length": SEQUENCE_LENGTH}
        modes: dict[str, Callable[[], StatefulDataLoader]] = {
            "windows": lambda: StatefulDataLoader.from_storage(web, shuffle=True, **options),
            "packed": lambda: StatefulDataLoader.from_storage(web, shuffle=True, pack_documents=True, **options),
            "mixture": lambda: StatefulDataLoader.from_storage(
                Mixture({"web": web, "code": code}, {"web": 3, "code": 1}), shuffle=True, **options
            ),
        }
        rows = {name: per_batch(make, arguments.steps) for name, make in modes.items()}
        with web.sync_reader() as reader:
            lengths = best(lambda: Lengths.of(reader, tokens=True), 3)
            reading = best(lambda: [len(reader.read(i)) for i in range(len(reader))], 3)
            documents = len(reader)
    print(f"{'mode':<10}{'batch':>12}{'state_dict':>14}{'ratio':>8}{'explain(1)':>14}{'ratio':>8}")
    for name, row in rows.items():
        print(
            f"{name:<10}{1e3 * row['batch_s']:>10.2f}ms{1e6 * row['state_dict_s']:>12.0f}us"
            f"{row['state_dict_s'] / row['batch_s']:>8.3f}{1e6 * row['explain_s']:>12.0f}us"
            f"{row['explain_s'] / row['batch_s']:>8.3f}"
        )
    print(
        f"lengths of {documents:,} documents: offsets {1e3 * lengths:.1f}ms, reading every document "
        f"{1e3 * reading:.1f}ms ({reading / lengths:.1f}x slower)"
    )
    write_results(
        "provenance",
        {
            "machine": machine(),
            "tokens": arguments.tokens,
            "modes": rows,
            "lengths": {"documents": documents, "offsets_s": lengths, "read_every_document_s": reading},
        },
    )


if __name__ == "__main__":
    main()
