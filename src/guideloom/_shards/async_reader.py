"""The reader for event loops: each read of a synchronous reader runs in a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Generic, TypeVar

import numpy as np

from guideloom._shards.reader import StorageReader, TokenReader

Out = TypeVar("Out")


class AsyncReader(Generic[Out]):
    """The reader for event loops: ``await reader.read(i)``, ``len(reader)``, ``async for``."""

    def __init__(self, opener: Callable[[], StorageReader[Out]]) -> None:
        self._opener = opener
        self._reader: StorageReader[Out] | None = None

    def _sync(self) -> StorageReader[Out]:
        if self._reader is None:
            raise ValueError("use the async reader inside 'async with'")
        return self._reader

    def __len__(self) -> int:
        return len(self._sync())

    async def read(self, index: int) -> Out:
        return await asyncio.to_thread(self._sync().read, index)

    async def __aiter__(self) -> AsyncIterator[Out]:
        for index in range(len(self)):
            yield await self.read(index)

    async def loss_mask(self, index: int) -> np.ndarray:
        """Document ``index``'s loss mask (a masked token storage's reader only)."""
        reader = self._sync()
        if not isinstance(reader, TokenReader):
            raise ValueError("loss_mask applies to the reader of a TokenStorage created with loss_mask=True")
        return await asyncio.to_thread(reader.loss_mask, index)

    async def verify(self) -> list[str]:
        return await asyncio.to_thread(self._sync().verify)

    async def __aenter__(self) -> AsyncReader[Out]:
        self._reader = await asyncio.to_thread(self._opener)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
