"""A CPU loader hands a batch of CPU tensors, NumPy arrays and plain values over as it is; any other tensor moves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from guideloom._loading.devices import move_to_device

CPU = torch.device("cpu")


def test_a_batch_already_on_the_cpu_is_handed_over_as_it_is() -> None:
    records = [{"id": 1, "tokens": np.arange(3), "name": "a"}, {"id": 2, "tokens": np.arange(2), "name": None}]
    padded = {"input_ids": torch.zeros(2, 3, dtype=torch.long), "lengths": (torch.tensor([3, 2]), [3, 2])}
    assert move_to_device(records, CPU) is records
    assert move_to_device(padded, CPU) is padded


def test_a_tensor_elsewhere_is_moved_even_among_cpu_arrays() -> None:
    batch = [{"tokens": np.arange(3)}, {"tokens": torch.zeros(2, device="meta")}]
    with pytest.raises(NotImplementedError, match="meta tensor"):  # moved to the CPU: torch cannot copy a meta tensor
        move_to_device(batch, CPU)


def test_a_tensor_subclass_goes_through_the_full_walk() -> None:
    class Tagged(torch.Tensor):
        pass

    tagged = torch.zeros(2).as_subclass(Tagged)
    moved = move_to_device({"x": tagged}, CPU)
    assert type(moved["x"]) is Tagged and torch.equal(moved["x"], tagged)
