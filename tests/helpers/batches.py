"""Reading a loader's batches as a training loop does, and comparing whole sequences of them by value."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def comparable(value: Any) -> Any:
    """A batch or record in plain values that compare by value: tensors, arrays and NumPy scalars as (nested)
    lists and numbers, through dicts, lists and tuples; anything else as it is."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {key: comparable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [comparable(item) for item in value]
    if isinstance(value, tuple):
        return tuple(comparable(item) for item in value)
    return value


def take(loader: Any, count: int, convert: Callable[[Any], Any] = lambda batch: batch) -> list[Any]:
    """The loader's next ``count`` batches, each through ``convert``, crossing epochs as a training loop does."""
    batches: list[Any] = []
    while len(batches) < count:
        for batch in loader:
            batches.append(convert(batch))
            if len(batches) == count:
                break
    return batches


def assert_resumes_exactly(
    open_loader: Callable[[], Any], total: int, checkpoints: list[int], convert: Callable[[Any], Any] = comparable
) -> None:
    """After each checkpoint step k, a fresh loader given the state yields exactly what an unbroken run yields."""
    with open_loader() as loader:
        expected = take(loader, total, convert)
    for k in checkpoints:
        with open_loader() as loader:
            before = take(loader, k, convert)
            state = json.loads(json.dumps(loader.state_dict()))
        with open_loader() as resumed:
            resumed.load_state_dict(state)
            after = take(resumed, total - k, convert)
        assert before + after == expected, f"resume after step {k} diverged"
