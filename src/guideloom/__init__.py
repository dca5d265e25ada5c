"""guideloom: sharded training-data storage and a stateful, exactly resumable PyTorch loader."""

from typing import TYPE_CHECKING, Any

from guideloom._errors import (
    CorruptStorageError,
    FormatMismatchError,
    GuideloomError,
    ShardExistsError,
    StateMismatchError,
    StorageNotFoundError,
    UntrustedFormatWarning,
)
from guideloom._formats import DocumentJsonFormat, DocumentMsgpackFormat, DocumentPickleFormat
from guideloom._mixture import Mixture
from guideloom._storage import DocumentStorage, TokenStorage

if TYPE_CHECKING:
    from guideloom._loader import StatefulDataLoader

__version__ = "0.2.0"

__all__ = [
    "CorruptStorageError",
    "DocumentJsonFormat",
    "DocumentMsgpackFormat",
    "DocumentPickleFormat",
    "DocumentStorage",
    "FormatMismatchError",
    "GuideloomError",
    "Mixture",
    "ShardExistsError",
    "StateMismatchError",
    "StatefulDataLoader",
    "StorageNotFoundError",
    "TokenStorage",
    "UntrustedFormatWarning",
]


def __getattr__(name: str) -> Any:
    # The loader needs torch; importing it lazily keeps the CLI and writer processes quick to start.
    if name == "StatefulDataLoader":
        from guideloom._loader import StatefulDataLoader

        return StatefulDataLoader
    raise AttributeError(f"module 'guideloom' has no attribute {name!r}")
