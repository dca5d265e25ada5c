"""Reading ahead in a thread gives the same items in the same order, an error where it happened, and stops early."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from guideloom.importing._read_ahead import read_ahead


def numbers(count: int, fail_at: int | None = None) -> Iterator[int]:
    for number in range(count):
        if number == fail_at:
            raise ValueError(f"damaged at {number}")
        yield number


def readers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "guideloom-read-ahead"]


def test_the_items_come_in_their_order() -> None:
    assert list(read_ahead(numbers(1000))) == list(range(1000))
    assert list(read_ahead(numbers(0))) == []


def test_an_error_comes_after_the_items_made_before_it() -> None:
    seen = []
    with pytest.raises(ValueError, match="damaged at 7"):
        for item in read_ahead(numbers(20, fail_at=7)):
            seen.append(item)
    assert seen == list(range(7))


def test_a_caller_that_stops_early_stops_the_thread() -> None:
    made = []

    def slow() -> Iterator[int]:
        for number in range(10_000):
            made.append(number)
            time.sleep(0.001)
            yield number

    items = read_ahead(slow(), depth=2)
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    items.close()  # what leaving a for loop by an error does
    assert readers() == []
    assert len(made) <= 3 + 2 + 1  # those taken, those held, the one being made
