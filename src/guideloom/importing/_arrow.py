"""Hugging Face datasets saved with ``save_to_disk``, and Arrow IPC files: read with pyarrow, no network.

A ``save_to_disk`` folder (``state.json`` beside ``data-*.arrow`` files) stands for its Arrow files in the
order ``state.json`` lists them; a ``DatasetDict`` folder (``dataset_dict.json``) for its splits' folders.
An Arrow file is read as an IPC stream (what ``datasets`` writes) or, failing that, an IPC file; each is
one piece. Its schema's ``huggingface`` metadata decides media columns (see ``_arrow_columns``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from guideloom.importing._arrow_columns import fields_of_schema, first_binary_values, rows_of_batch
from guideloom.importing._errors import ImportInputError
from guideloom.importing._files import InputPath, open_binary, size_of
from guideloom.importing._stream import Described, Piece, Row


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def saved_dataset_files(path: Path) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` folder, in the dataset's order."""
    if (path / "dataset_dict.json").is_file():
        try:
            splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        except (ValueError, KeyError, TypeError) as error:
            raise ImportInputError(f"{path / 'dataset_dict.json'}: not a dataset dict record ({error})") from None
        return [file for split in splits for file in saved_dataset_files(_inside(path, str(split)))]
    state = path / "state.json"
    try:
        names = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
    except (ValueError, KeyError, TypeError) as error:
        raise ImportInputError(f"{state}: not a saved dataset's state ({error})") from None
    return [_inside(path, str(name)) for name in names]


def _inside(folder: Path, name: str) -> Path:
    """``folder / name``, refusing a name that leads out of the folder."""
    candidate = folder / name
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ImportInputError(f"{folder}: names {name!r}, which lies outside the folder")
    return candidate


def _reader(path: InputPath, options: dict[str, Any] | None) -> Any:
    """An iterator of record batches with a ``schema``: an IPC stream, else an IPC file."""
    try:
        import pyarrow
        import pyarrow.ipc as ipc
    except ImportError as error:
        raise ImportError("reading Arrow files needs pyarrow: pip install pyarrow") from error
    source = pyarrow.memory_map(str(path)) if isinstance(path, Path) else pyarrow.PythonFile(open_binary(path, options))
    try:
        return ipc.open_stream(source)
    except pyarrow.ArrowInvalid:
        source.seek(0)
    try:
        file = ipc.open_file(source)
    except pyarrow.ArrowInvalid as error:
        raise ImportInputError(f"{path}: not an Arrow IPC stream or file ({error})") from None
    return _FileBatches(file)


class _FileBatches:
    """An IPC file's record batches, read in order like a stream's."""

    def __init__(self, file: Any) -> None:
        self.schema = file.schema
        self._file = file

    def __iter__(self) -> Iterator[Any]:
        for index in range(self._file.num_record_batches):
            yield self._file.get_batch(index)


def describe(path: InputPath, shard_size: int, options: dict[str, Any] | None = None) -> Described:
    del shard_size
    try:
        reader = _reader(path, options)
        first: dict[str, Any] = {}
        for batch in reader:
            if batch.num_rows:
                first = first_binary_values(batch)
                break
        fields = fields_of_schema(reader.schema, first)
    except (ImportInputError, FileNotFoundError, PermissionError):
        raise
    except Exception as error:
        raise ImportInputError(f"{path}: a damaged Arrow file ({error})") from None
    return Described(fields, [Piece(path, "arrow", 0, None, size_of(path, options), (), options)])


def batches(piece: Piece, start: int) -> Iterator[tuple[int, Any, int]]:
    """The file's record batches from row ``start`` on: ``(first row, batch, bytes read after it)``."""
    row = consumed = 0
    try:
        reader = _reader(piece.path, piece.options)
        for batch in reader:
            consumed += batch.nbytes  # bytes read so far, as the batches' buffers count them
            if row < start:
                skipped = min(batch.num_rows, start - row)
                batch, row = batch.slice(skipped), row + skipped
            if batch.num_rows:
                yield row, batch, min(piece.size, consumed)
            row += batch.num_rows
    except (ImportInputError, FileNotFoundError, PermissionError):
        raise
    except Exception as error:
        raise ImportInputError(f"{piece.path}: a damaged Arrow file near row {row} ({error})") from None


def rows(piece: Piece, fields: Any, start: int) -> Iterator[Row]:
    for first, batch, position in batches(piece, start):
        yield from rows_of_batch(piece.path, first, batch, fields, position)
