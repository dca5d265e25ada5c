"""A record as a writer stores it: its bytes (or tokens), their count, and its length; errors name the record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guideloom._core.errors import RecordPackError
from guideloom._shards.record_lengths import checked_length


class RecordEncoder:
    """Turns a record into what a shard stores, naming the shard and record in any error: its bytes (or tokens)
    and their count, and its length where the storage records lengths."""

    def __init__(self, encode: Callable[[Any], tuple[memoryview, int]], measure: Callable[[Any], int] | None):
        self.encode = encode
        self.measure = measure

    def __call__(self, data: Any, where: Callable[[], str]) -> tuple[memoryview, int, int | None]:
        """Encode ``data``; ``where`` names the record in an error ("record 3 of shard 7")."""
        try:
            payload, element_count = self.encode(data)
            if self.measure is None:
                return payload, element_count, None
            return payload, element_count, checked_length(self.measure(data), "this record")
        except Exception as error:
            raise self.error(error, where()) from error

    @staticmethod
    def error(error: Exception, where: str) -> RecordPackError:
        """The error to raise for ``error``, met encoding or measuring the record ``where`` names."""
        return RecordPackError(f"cannot write {where}: {type(error).__name__}: {error}")
