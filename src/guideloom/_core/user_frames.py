"""The user's line that a warning points at: the first frame outside guideloom's own code."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep  # guideloom's directory: no frame there is the user's


def users_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside guideloom, for a ``warnings.warn`` in this function's caller."""
    here = inspect.currentframe()
    assert here is not None and here.f_back is not None  # (CPython has frames)
    level, frame = 1, here.f_back  # level 1: the function that calls warnings.warn
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
