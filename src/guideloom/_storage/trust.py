"""When reading a pickle storage warns: decoding pickle runs whatever code the data names.

The warning is for data from elsewhere. It is not given for a storage opened with ``trusted=True``,
nor when every shard a reader opens was committed by this process (records it pickled itself a
moment ago), and otherwise once per storage and process. It points at the user's line that opened
the reader, not at guideloom's code.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path

from guideloom._core.errors import UntrustedFormatWarning

_PACKAGE = (
    str(Path(__file__).resolve().parents[1]) + os.sep
)  # guideloom's own directory: frames there are not the user's
_committed_here: dict[str, set[int]] = {}  # storage key -> ids of the shards this process committed
_warned: set[str] = set()


def note_committed(key: str, shard: int) -> None:
    """Remember that this process committed ``shard`` of the storage ``key`` (its records are its own)."""
    _committed_here.setdefault(key, set()).add(shard)


def warn_untrusted(key: str, location: str, shard_ids: Iterable[int]) -> None:
    """Warn that decoding the storage at ``location`` runs the data's code, unless this process wrote all of
    ``shard_ids`` or was warned about it already."""
    if key in _warned or set(shard_ids) <= _committed_here.get(key, set()):
        return
    _warned.add(key)
    warnings.warn(
        f"{location} is a pickle storage: decoding pickle can run arbitrary code, so read only storages you trust. "
        "Open one you trust with DocumentStorage(..., trusted=True) to silence this; JSON, MessagePack or your own "
        "format decode without running code",
        UntrustedFormatWarning,
        stacklevel=_users_frame(),
    )


def _users_frame() -> int:
    """The ``stacklevel`` of the first frame outside guideloom, seen from the caller of ``warnings.warn``."""
    level, frame = 1, sys._getframe(1)  # level 1: warn_untrusted itself
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
