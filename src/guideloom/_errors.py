"""Errors for problems with what is on disk or in a state dict.

Argument mistakes raise the built-in ``TypeError`` / ``ValueError`` /
``IndexError``; everything here derives from :class:`GuideloomError` so a
training script can catch the whole family at once.
"""


class GuideloomError(Exception):
    """Base class of every error about a storage's contents or a loader's state."""


class StorageNotFoundError(GuideloomError, FileNotFoundError):
    """The path holds no guideloom storage (missing directory or header)."""


class FormatMismatchError(GuideloomError):
    """The storage was written with another kind, format or token dtype."""


class ShardExistsError(GuideloomError, FileExistsError):
    """The shard is already committed; committed shards are immutable."""


class CorruptStorageError(GuideloomError):
    """A file of the storage is truncated, damaged or fails its checksum."""


class StateMismatchError(GuideloomError):
    """A loader state dict does not belong to this storage or configuration."""


class UnfinishedWriteError(GuideloomError):
    """A named distributed write into the storage never finished; it must be run again or abandoned first."""


class UntrustedFormatWarning(UserWarning):
    """Reading a pickle storage: decoding pickle can run code, so only read storages you trust."""
