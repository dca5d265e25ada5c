"""Mistakes in building a mixture name their cause: a component too short for a window, weights of the wrong form."""

from __future__ import annotations

from pathlib import Path

import pytest

from guideloom import Mixture
from tests.helpers.loaders import window_loader
from tests.helpers.storages import make_counted_tokens


def test_a_mixture_component_too_short_for_a_window_is_named(tmp_path: Path) -> None:
    long, short = (
        make_counted_tokens(tmp_path / "long", shards=3),
        make_counted_tokens(tmp_path / "short", shards=1),
    )
    mixture = Mixture({"long": long, "short": short}, {"long": 1.0, "short": 1.0})
    with pytest.raises(ValueError) as error:
        window_loader(mixture, sequence_length=50)
    assert str(error.value) == (
        f"the mixture's component 'short': the storage at {tmp_path / 'short'} has no samples to load: "
        "sequence_length=50 is longer than its 40 tokens"
    )


def test_mixture_weights_given_as_a_plain_list_say_what_weights_are(tmp_path: Path) -> None:
    storage = make_counted_tokens(tmp_path / "a", shards=1)
    with pytest.raises(TypeError) as caught:
        Mixture({"a": storage, "b": storage}, weights=[0.5, 0.5])
    assert str(caught.value) == (
        "weights must be a dict of component name -> weight, or a schedule: a list of (start, weights) pairs; "
        "got [0.5, 0.5]"
    )


@pytest.mark.parametrize("weight", [float("nan"), float("inf")])
def test_a_mixture_weight_that_is_not_finite_says_so(tmp_path: Path, weight: float) -> None:
    storage = make_counted_tokens(tmp_path / "a", shards=1)
    with pytest.raises(ValueError) as caught:
        Mixture({"a": storage, "b": storage}, weights={"a": 1.0, "b": weight})
    assert str(caught.value) == f"weights['b'] must be a finite number, got {weight}"
