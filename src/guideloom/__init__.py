"""guideloom: sharded training-data storage and a stateful, exactly resumable PyTorch loader."""

from typing import TYPE_CHECKING, Any

from guideloom._core.errors import (
    CorruptStorageError,
    FormatMismatchError,
    GuideloomError,
    ReadOnlyStorageError,
    RecordPackError,
    ShardExistsError,
    StateMismatchError,
    StorageNotFoundError,
    UntrustedFormatWarning,
)
from guideloom._mixture.mixture import Mixture
from guideloom._shards.formats import DocumentJsonFormat, DocumentMsgpackFormat, DocumentPickleFormat
from guideloom._storage.storages import DocumentStorage, TokenStorage

if TYPE_CHECKING:
    from guideloom._loading.loader import StatefulDataLoader

    __version__: str

__all__ = [
    "CorruptStorageError",
    "DocumentJsonFormat",
    "DocumentMsgpackFormat",
    "DocumentPickleFormat",
    "DocumentStorage",
    "FormatMismatchError",
    "GuideloomError",
    "Mixture",
    "ReadOnlyStorageError",
    "RecordPackError",
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
        from guideloom._loading.loader import StatefulDataLoader

        return StatefulDataLoader
    # The version lives in one place, the package's metadata (pyproject.toml); reading it costs tens of ms.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("guideloom")
        except PackageNotFoundError:  # a source tree on sys.path that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'guideloom' has no attribute {name!r}")
