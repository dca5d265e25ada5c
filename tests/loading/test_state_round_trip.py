"""Every way of cutting samples survives its state: ``state_dict`` -> ``guideloom explain`` -> a loader reopened
from the state alone reads the batches the original loader reads next.

A source kind that a state records but guideloom cannot reopen fails here, whichever mode it belongs to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from guideloom import Mixture, StatefulDataLoader
from guideloom._cli import main
from guideloom._loading.reopen import loader_from_state
from tests.helpers.batches import comparable, take
from tests.helpers.provenance import write_documents, write_tokens

WINDOWS = {"sequence_length": 16}
BOUNDARIES = {"sequence_length": 16, "document_boundaries": True}
PACKED = {"sequence_length": 16, "pack_documents": True}


def tokens(path: Path) -> Any:
    return write_tokens(path / "tokens")


def masked(path: Path) -> Any:
    return write_tokens(path / "masked", masked=True)


def documents(path: Path) -> Any:
    return write_documents(path / "documents")


def mixture_of(first: Callable[[Path], Any], second: Callable[[Path], Any]) -> Callable[[Path], Any]:
    def make(path: Path) -> Any:
        parts = {"web": first(path / "web"), "code": second(path / "code")}
        return Mixture(parts, {"web": 2, "code": 1}, block_size=6, samples_per_epoch=40)

    return make


CASES: dict[str, tuple[Callable[[Path], Any], dict[str, Any]]] = {
    "windows": (tokens, WINDOWS),
    "int32 windows": (tokens, {**WINDOWS, "window_dtype": torch.int32}),
    "boundaries": (tokens, BOUNDARIES),
    "packed, long documents split": (tokens, {**PACKED, "long_documents": "split", "pad_id": 7}),
    "packed, long documents truncated": (tokens, {**PACKED, "long_documents": "truncate"}),
    "packed, long documents dropped": (tokens, {**PACKED, "long_documents": "drop"}),
    "masked windows": (masked, WINDOWS),
    "masked boundaries": (masked, BOUNDARIES),
    "masked packed": (masked, PACKED),
    "documents": (documents, {}),
    "mixture of windows": (mixture_of(tokens, tokens), WINDOWS),
    "mixture of packed": (mixture_of(tokens, tokens), PACKED),
    "mixture of masked and plain windows": (mixture_of(masked, tokens), WINDOWS),
    "mixture of masked boundaries": (mixture_of(tokens, masked), BOUNDARIES),
    "mixture of documents": (mixture_of(documents, documents), {}),
    "documents by budget": (documents, {"local_batch_size": None, "batch_tokens": 150}),
    "mixture of documents by budget": (
        mixture_of(documents, documents),
        {"local_batch_size": None, "batch_tokens": 150},
    ),
    "packed documents' records": (documents, {"sequence_length": 200, "pack_documents": True}),
    "mixture of packed documents' records": (
        mixture_of(documents, documents),
        {"sequence_length": 200, "pack_documents": True},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_state_of_every_mode_is_explained_and_reopened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make_storage, options = CASES[case]
    settings = {"device": "cpu", "local_batch_size": 3, "shuffle": True, "seed": 5, **options}
    with StatefulDataLoader.from_storage(make_storage(tmp_path), **settings) as loader:
        take(loader, 2)
        state = json.loads(json.dumps(loader.state_dict()))
        explained = loader.explain(3)
        after = take(loader, 3, comparable)  # values: a reopened loader serves int64 whatever the dtype
    saved = tmp_path / "state.json"
    saved.write_text(json.dumps(state))

    status = main(["explain", str(saved), "--batches", "3", "--json"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    assert json.loads(out) == explained

    with loader_from_state(state) as reopened:
        assert reopened.explain(3) == explained
        if "documents" not in case:  # a reopened document storage serves records as their bytes
            assert take(reopened, 3, comparable) == after
