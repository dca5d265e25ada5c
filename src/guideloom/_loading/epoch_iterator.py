"""What ``iter(loader)`` returns: the epoch's batches, and after a batch raised, that failure again.

A generator that raised is finished, so a plain one would answer the next ``next()`` with
``StopIteration``: a retry loop around ``next(it)`` would end the epoch silently. This one keeps
raising instead, saying how to continue (a fresh ``iter(loader)`` continues with the failed batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


class EpochIterator(Iterator[T]):
    """The batches of one ``iter(loader)``; once one of them raised, every later ``next()`` raises."""

    def __init__(self, batches: Iterator[T]) -> None:
        self._batches = batches
        self._failure: BaseException | None = None

    def __iter__(self) -> EpochIterator[T]:
        return self

    def __next__(self) -> T:
        if self._failure is not None:
            failure = self._failure
            raise RuntimeError(
                f"a batch of this iterator failed ({type(failure).__name__}: {failure}); it yields nothing more: "
                "call iter(loader) again to continue with the failed batch"
            ) from failure
        try:
            return next(self._batches)
        except StopIteration:
            raise
        except BaseException as error:
            self._failure = error
            raise

    def close(self) -> None:
        """Stop the epoch's batches now (as a generator's ``close()``)."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
