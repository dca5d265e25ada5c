"""A fresh packing cache for a test of window modes that counts or damages what the cache holds."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own packing cache (``GUIDELOOM_CACHE_DIR``): empty at the start, nothing shared with others."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("GUIDELOOM_CACHE_DIR", str(directory))
    return directory
