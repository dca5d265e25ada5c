"""Stub: only the names that ``streaming.vision`` imports."""

from .. import _unavailable as to_tensor  # noqa: F401
