"""guideloom: sharded training-data storage and a stateful, exactly resumable PyTorch loader."""

from guideloom._errors import (
    CorruptStorageError,
    FormatMismatchError,
    GuideloomError,
    ShardExistsError,
    StateMismatchError,
    StorageNotFoundError,
)
from guideloom._formats import DocumentJsonFormat, DocumentMsgpackFormat, DocumentPickleFormat
from guideloom._loader import StatefulDataLoader
from guideloom._storage import DocumentStorage, TokenStorage

__version__ = "0.1.0"

__all__ = [
    "CorruptStorageError",
    "DocumentJsonFormat",
    "DocumentMsgpackFormat",
    "DocumentPickleFormat",
    "DocumentStorage",
    "FormatMismatchError",
    "GuideloomError",
    "ShardExistsError",
    "StateMismatchError",
    "StatefulDataLoader",
    "StorageNotFoundError",
    "TokenStorage",
]
