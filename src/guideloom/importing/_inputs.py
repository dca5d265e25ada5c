"""The sources of an import: which inputs they stand for, of which format, and each format's module.

A source is a file or a folder. Files are known by their names: ``.parquet``; ``.arrow``; ``.jsonl``,
compressed or not (``.jsonl.zst``, ``.jsonl.gz``, ``.jsonl.bz2``, ``.jsonl.xz``); ``.tar``, ``.tar.gz``,
``.tgz``, ``.tar.bz2``, ``.tar.xz`` (WebDataset). A folder is a dataset saved with ``save_to_disk``
(``state.json`` or ``dataset_dict.json``), an MDS folder or a LitData folder (an ``index.json`` of theirs),
or else stands for the files above it holds, recursively, sorted by path. Sources keep the order given.
An object store URL (``s3://bucket/key``, any fsspec URL) names one such file, or a prefix standing for
the files under it (saved datasets, MDS and LitData folders are read from a local disk only).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import guideloom.importing._arrow as _arrow
import guideloom.importing._jsonl as _jsonl
import guideloom.importing._litdata as _litdata
import guideloom.importing._mds as _mds
import guideloom.importing._parquet as _parquet
import guideloom.importing._webdataset as _webdataset
from guideloom._remote.object_store import is_url
from guideloom.importing._files import InputPath, remote_entries

# Each source format's module by its name (imported as modules, not from the package, which imports this one).
FORMATS: dict[str, ModuleType] = {
    "parquet": _parquet,
    "arrow": _arrow,
    "jsonl": _jsonl,
    "webdataset": _webdataset,
    "mds": _mds,
    "litdata": _litdata,
}
# The formats read as Arrow record batches too (``batches``), which an import packs a batch at a time.
COLUMNAR_FORMATS: dict[str, ModuleType] = {"parquet": _parquet, "arrow": _arrow}
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.zst", ".jsonl.gz", ".jsonl.bz2", ".jsonl.xz")
FOLDER_RECORDS = ("index.json", "state.json", "dataset_dict.json")  # what marks an MDS, LitData or saved dataset folder
SUPPORTED = ".parquet, .arrow, .jsonl (.zst, .gz, .bz2, .xz), WebDataset .tar, saved datasets, MDS and LitData folders"


def format_of_name(path: Path) -> str | None:
    """The format a file's name says, None when it says none we read."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".arrow"):
        return "arrow"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(TAR_SUFFIXES):
        return "webdataset"
    return None


def _in_folder(path: Path) -> list[tuple[InputPath, str]]:
    if _arrow.is_saved_dataset(path):
        return [(file, "arrow") for file in _arrow.saved_dataset_files(path)]
    if _mds.is_mds(path):
        return [(path, "mds")]
    if _litdata.is_litdata(path):
        return [(path, "litdata")]
    found: list[tuple[InputPath, str]] = []
    for file in sorted(path.rglob("*"), key=str):
        kind = format_of_name(file)
        if kind is not None and file.is_file() and not file.is_symlink():
            found.append((file, kind))
    if not found:
        raise ValueError(f"source folder {path} holds no input we read ({SUPPORTED})")
    return found


def _remote_source(url: str, options: dict[str, Any] | None) -> list[tuple[InputPath, str]]:
    """The inputs an object store URL stands for: the object, or the objects under a prefix we read."""
    folder, entries = remote_entries(url, options)
    if not folder:
        kind = format_of_name(Path(url))
        if kind is None:
            raise ValueError(f"source {url}: not a format we import ({SUPPORTED})")
        return [(url, kind)]
    if any(entry.rsplit("/", 1)[-1] in FOLDER_RECORDS for entry in entries):
        raise ValueError(
            f"source {url} is a saved dataset, MDS or LitData folder: on an object store only Parquet, Arrow, "
            "JSONL and tar files are imported; copy the folder to a local disk first"
        )
    found: list[tuple[InputPath, str]] = [(entry, kind) for entry in entries if (kind := format_of_name(Path(entry)))]
    if not found:
        raise ValueError(f"source {url} holds no input we read ({SUPPORTED})")
    return found


def expand_sources(sources: object, options: dict[str, Any] | None = None) -> list[tuple[InputPath, str]]:
    """``(input, format)`` for every input the sources stand for, in order; ValueError for what we cannot read.

    A source may be an object store URL (an object, or a prefix standing for the objects under it), read with
    fsspec's ``options``."""
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    if not isinstance(sources, list | tuple):
        raise TypeError(f"sources must be a path or a list of paths, got {type(sources).__name__}")
    inputs: list[tuple[InputPath, str]] = []
    for source in sources:
        if not isinstance(source, str | os.PathLike):
            raise TypeError(f"sources must be paths, got {type(source).__name__}")
        if os.fspath(source) == "":
            raise ValueError("sources hold an empty path")
        if isinstance(source, str) and is_url(source):
            inputs.extend(_remote_source(source, options))
            continue
        path = Path(os.path.abspath(source))
        if path.is_dir():
            inputs.extend(_in_folder(path))
            continue
        if not path.exists():
            raise FileNotFoundError(f"source not found: {source}")
        kind = format_of_name(path)
        if kind is None:
            raise ValueError(f"source {source}: not a format we import ({SUPPORTED})")
        if not path.is_file():
            raise ValueError(f"source {source} is not a regular file")
        inputs.append((path, kind))
    if not inputs:
        raise ValueError("sources is empty: give at least one input")
    repeated = sorted(str(path) for path, count in Counter(path for path, _ in inputs).items() if count > 1)
    if repeated:
        raise ValueError(f"sources name the same input more than once: {', '.join(repeated)}")
    return inputs
