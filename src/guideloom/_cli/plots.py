"""Pictures for ``--plot``: matplotlib is an extra (``guideloom[plot]``), imported only when a picture is drawn."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend; a clear ImportError naming the extra when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'guideloom[plot]'") from None
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def check_png(text: str) -> Path:
    """A ``--plot`` value: the PNG file to write (its folder must exist)."""
    path = Path(text)
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"writes a PNG file: give a name ending in .png, got {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: the folder {path.parent} does not exist")
    return path


def save(figure: Any, path: Path) -> None:
    """Write ``figure`` to ``path`` and release it."""
    plt = pyplot()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
