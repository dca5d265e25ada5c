"""When a process runs out of descriptors or mappings: an OSError that names the limit and the knobs.

A storage is fine when that happens, so it is never a CorruptStorageError; the reader maps at most
``max_open_shards`` shards at once, and the message says to lower it or to raise the limit.
"""

from __future__ import annotations

import errno
import resource
from pathlib import Path

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def out_of_resources(error: OSError, shard: int, path: Path) -> OSError:
    """The error for shard ``shard`` (at ``path``) that could not be opened or mapped for lack of resources."""
    if error.errno == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = f"this process's limit of {soft} open files (ulimit -n)"
        remedy = "raise ulimit -n"
    elif error.errno == errno.ENFILE:
        limit = "the system's limit of open files (fs.file-max)"
        remedy = "raise fs.file-max"
    else:
        limit = "this process's limit of memory mappings (vm.max_map_count) or its memory"
        remedy = "raise vm.max_map_count"
    return OSError(
        error.errno,
        f"shard {shard} cannot be opened or mapped ({path}): {limit} is reached ({error.strerror or error}); "
        f"lower the storage's max_open_shards= (the shards a process keeps mapped at once, in every worker "
        f"and for every storage of a mixture) or {remedy}",
    )
