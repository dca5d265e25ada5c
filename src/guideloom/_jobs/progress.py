"""The progress bar of a run: input bytes, and the items written beside them; none when tqdm is missing or it is off."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """A tqdm bar of input bytes labelled ``name``; with ``items`` ("rows"), their count and rate beside it."""

    def __init__(self, total: int, enabled: bool, name: str, items: str | None = None) -> None:
        self.items = items
        self.count = 0
        self.started = time.perf_counter()
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name, file=sys.stderr)

    def update(self, size: int, items: int = 0) -> None:
        """``size`` more input bytes read, ``items`` more written."""
        self.count += items
        if self.bar is None:
            return
        if self.items is not None:
            elapsed = max(1e-9, time.perf_counter() - self.started)
            rate = f"{self.count:,} {self.items}, {self.count / elapsed:,.0f} {self.items}/s"
            self.bar.set_postfix_str(rate, refresh=False)
        self.bar.update(size)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
