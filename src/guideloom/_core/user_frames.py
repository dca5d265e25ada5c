"""The user's line that a warning points at: the first frame outside guideloom's own code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep  # guideloom's directory: no frame there is the user's


def users_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside guideloom, for a ``warnings.warn`` in this function's caller."""
    level, frame = 1, sys._getframe(1)  # level 1: the function that calls warnings.warn
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
