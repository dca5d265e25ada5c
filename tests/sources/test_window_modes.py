"""Window modes are values: the arguments that choose one give it back, and so does what a state records of it."""

from __future__ import annotations

import inspect

import pytest

from guideloom import StatefulDataLoader
from guideloom._core.errors import StateMismatchError
from guideloom._sources.window_modes import MODES, PackedDocuments, WindowMode, recorded_mode, window_mode

EXAMPLES = [mode() for mode in MODES] + [PackedDocuments(7, "truncate"), PackedDocuments(0, "drop")]
PARAMETERS = inspect.signature(StatefulDataLoader.from_storage).parameters


def defaults() -> dict[str, object]:
    """Every mode's from_storage arguments at their defaults (each must be an argument of from_storage)."""
    names = {name for mode in EXAMPLES for name in mode.arguments()}
    return {name: PARAMETERS[name].default for name in names}


@pytest.mark.parametrize("mode", EXAMPLES, ids=repr)
def test_a_mode_s_arguments_choose_it(mode: WindowMode) -> None:
    assert window_mode({**defaults(), **mode.arguments()}) == mode


@pytest.mark.parametrize("mode", EXAMPLES, ids=repr)
def test_what_a_state_records_of_a_mode_gives_it_back_for_each_of_its_kinds(mode: WindowMode) -> None:
    for kind in type(mode).kinds:
        assert recorded_mode({"kind": kind, "sequence_length": 16, **mode.recorded()}) == mode


def test_every_kind_belongs_to_one_mode() -> None:
    kinds = [kind for mode in MODES for kind in mode.kinds]
    assert len(kinds) == len(set(kinds))


def test_a_kind_no_mode_makes_is_refused() -> None:
    with pytest.raises(StateMismatchError, match="'token soup' is not one guideloom reads"):
        recorded_mode({"kind": "token soup"})
