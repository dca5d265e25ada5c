"""Where imported records came from: a small file per shard, beside the storage's shards, naming input and rows.

An import (``guideloom.importing``) writes ``sources/inputs.json`` once (the inputs, in order, and the
settings of the import) and, before it commits each shard, ``sources/<12-digit shard id>.json``:
``{"runs": [[input, first_row, count], ...], "last": bool}``, the shard's records being ``count`` rows
from ``first_row`` on of input number ``input``, run after run, and ``last`` saying the shard ends its
job. Each file is written whole under a temporary name, fsynced, then renamed into place, so a reader
sees a file whole or not at all; a file of a shard never committed (the import was killed between the
two) is written again, the same, by the run that commits the shard. Readers of records ignore
``sources/``; ``explain`` reads it for each piece's ``"source"``.
"""

from __future__ import annotations

import json
import os
import uuid
from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any

from guideloom._core.errors import CorruptStorageError
from guideloom._remote.object_store import is_url
from guideloom._shards.layout import fsync_directory
from guideloom._shards.shard_names import shard_file_name

SOURCES_DIR = "sources"
INPUTS_NAME = "inputs.json"


def _sources_dir(storage_dir: Path) -> Path:
    return storage_dir / SOURCES_DIR


def shard_sources_path(storage_dir: Path, shard: int) -> Path:
    return _sources_dir(storage_dir) / (shard_file_name(shard).removesuffix(".shard") + ".json")


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    """``path`` holds ``data`` as JSON, whole: written aside, fsynced, renamed into place, the folder fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8") as file:
            json.dump(data, file, separators=(",", ":"))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(path.parent)


def _read(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as error:
        raise CorruptStorageError(f"the provenance file {path} is damaged ({error})") from None


def write_shard_sources(storage_dir: Path, shard: int, runs: list[list[int]], last: bool) -> None:
    write_atomically(shard_sources_path(storage_dir, shard), {"runs": runs, "last": last})


def read_shard_sources(storage_dir: Path, shard: int) -> tuple[list[list[int]], bool] | None:
    """The runs of rows and the ``last`` flag of ``shard``, None when the storage records none for it."""
    path = shard_sources_path(storage_dir, shard)
    data = _read(path)
    if data is None:
        return None
    try:
        runs = [[int(input_), int(first), int(count)] for input_, first, count in data["runs"]]
        last = bool(data["last"])
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptStorageError(f"the provenance file {path} is damaged ({error})") from None
    return runs, last


def write_inputs(storage_dir: Path, record: dict[str, Any]) -> None:
    write_atomically(_sources_dir(storage_dir) / INPUTS_NAME, record)


def read_inputs(storage_dir: Path) -> dict[str, Any] | None:
    data = _read(_sources_dir(storage_dir) / INPUTS_NAME)
    if data is not None and not (isinstance(data, dict) and isinstance(data.get("inputs"), list)):
        raise CorruptStorageError(f"the provenance file {_sources_dir(storage_dir) / INPUTS_NAME} is damaged")
    return data


class ShardSources:
    """The source of records of one storage, read from its provenance files as asked, each file once."""

    def __init__(self, storage_dir: Path | None) -> None:
        self._dir = storage_dir
        self._present = storage_dir is not None and (_sources_dir(storage_dir) / INPUTS_NAME).is_file()
        self._inputs: list[str] | None = None
        self._shards: dict[int, tuple[list[list[int]], list[int]] | None] = {}

    @classmethod
    def at(cls, location: str) -> ShardSources:
        """The sources of the storage at ``location``; a storage on an object store records none (imports write
        local storages)."""
        return cls(None if is_url(location) else Path(location))

    def present(self) -> bool:
        """Whether the storage records sources at all (an imported storage)."""
        return self._present

    def source(self, shard: int, record: int) -> dict[str, Any] | None:
        """``{"file", "row"}`` of record ``record`` of ``shard``, None when it is not recorded."""
        if self._dir is None:
            return None
        if self._inputs is None:
            inputs = read_inputs(self._dir)
            self._inputs = [] if inputs is None else [str(path) for path in inputs["inputs"]]
        if shard not in self._shards:
            found = read_shard_sources(self._dir, shard)
            self._shards[shard] = None if found is None else (found[0], [0, *accumulate(c for _, _, c in found[0])])
        known = self._shards[shard]
        if known is None:
            return None
        runs, starts = known
        run = bisect_right(starts, record) - 1
        if run >= len(runs) or record < 0:
            return None
        input_, first, _ = runs[run]
        if input_ >= len(self._inputs):
            return None
        return {"file": self._inputs[input_], "row": first + record - starts[run]}
