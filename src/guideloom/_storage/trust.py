"""When reading a pickle storage warns: decoding pickle runs whatever code the data names.

The warning is for data from elsewhere. It is not given for a storage opened with ``trusted=True``,
nor when every shard a reader opens was committed by this process (records it pickled itself a
moment ago), and otherwise once per storage and process. It points at the user's line that opened
the reader, not at guideloom's code.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from guideloom._core.errors import UntrustedFormatWarning
from guideloom._core.user_frames import users_stacklevel

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
        stacklevel=users_stacklevel(),
    )
