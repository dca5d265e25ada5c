"""Types users subclass or annotate with: the document format base class."""

from guideloom._shards.formats import DocumentStorageFormat

__all__ = ["DocumentStorageFormat"]
