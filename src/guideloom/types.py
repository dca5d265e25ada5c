"""Types users subclass or annotate with: the document format base class."""

from guideloom._formats import DocumentStorageFormat

__all__ = ["DocumentStorageFormat"]
