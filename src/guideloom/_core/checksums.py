"""CRC-32 of large buffers: zlib-ng's where it is installed (``pip install zlib-ng``, in the ``import`` extra), about
five times as fast as the system zlib's that Python links; zlib's otherwise. Both give the same numbers."""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - the test extra installs zlib-ng
    from zlib import crc32

__all__ = ["crc32"]
