"""Errors for problems with what is on disk or in a state dict.

Argument mistakes raise the built-in ``TypeError`` / ``ValueError`` /
``IndexError``; everything here derives from :class:`GuideloomError` so a
training script can catch the whole family at once. Each class names the module
it is public from (``guideloom.ShardExistsError``, not this private module), in
tracebacks and in pickles alike.
"""


class GuideloomError(Exception):
    """Base class of every error about a storage's contents or a loader's state."""

    __module__ = "guideloom"


class StorageNotFoundError(GuideloomError, FileNotFoundError):
    """The path holds no guideloom storage (missing directory or header)."""

    __module__ = "guideloom"


class FormatMismatchError(GuideloomError):
    """The storage was written with another kind, format or token dtype."""

    __module__ = "guideloom"


class ShardExistsError(GuideloomError, FileExistsError):
    """The shard is already committed; committed shards are immutable."""

    __module__ = "guideloom"


class ReadOnlyStorageError(GuideloomError, OSError):
    """A write to a storage that can only be read (one served over HTTP(S) by a static server or CDN)."""

    __module__ = "guideloom"


class CorruptStorageError(GuideloomError):
    """A file of the storage is truncated, damaged or fails its checksum."""

    __module__ = "guideloom"


class RecordPackError(GuideloomError, TypeError, ValueError):
    """A record could not be written: its format's ``pack`` or ``length`` failed or returned nonsense.

    The message names the shard and the record's index in it; the format's own error is chained. It is a
    ``TypeError`` and a ``ValueError`` too, so code that caught the format's errors keeps working.
    """

    __module__ = "guideloom"


class MediaDecodeError(GuideloomError, ValueError):
    """A media field cannot be decoded (damaged bytes, or an image beyond the pixel limit).

    The message names the shard, the record's index in it and the field, and the decoder's own message.
    """

    __module__ = "guideloom.fields"


class StateMismatchError(GuideloomError):
    """A loader state dict does not belong to this storage or configuration."""

    __module__ = "guideloom"


class TokenizeInputError(GuideloomError, ValueError):
    """An input of ``guideloom tokenize`` cannot be read as documents (a bad line, field, encoding, compression)."""

    __module__ = "guideloom.tokenize"


class TokenizeWorkerDied(GuideloomError, RuntimeError):
    """A tokenize worker process ended abruptly (killed, out of memory): the file it was writing was not committed."""

    __module__ = "guideloom.tokenize"


class UnfinishedWriteError(GuideloomError):
    """A named distributed write into the storage never finished; it must be run again or abandoned first."""


class UntrustedFormatWarning(UserWarning):
    """Reading a pickle storage: decoding pickle can run code, so only read storages you trust."""

    __module__ = "guideloom"
