"""The errors of an import: an input that cannot be read as records, and a worker process that died."""

from __future__ import annotations

from guideloom._core.errors import GuideloomError


class ImportInputError(GuideloomError, ValueError):
    """An input cannot be read as records, or a row does not fit the schema: the message names the input (and row)."""

    __module__ = "guideloom.importing"


class ImportWorkerDied(GuideloomError, RuntimeError):
    """An import worker process ended abruptly (killed, out of memory): its shard in progress was not committed."""

    __module__ = "guideloom.importing"
