"""Planning a tokenize run: everything that can be checked is checked here, before anything is written.

The plan holds the jobs (input ``i`` of the sorted inputs becomes shard ``i``), the settings every worker
needs, and the shards skipped because a previous run committed them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._errors import ShardExistsError
from guideloom._layout import HEADER_NAME, INCOMPLETE_DIR, SHARDS_DIR, TOKEN_DTYPES, committed_shard_ids
from guideloom._storage import TokenStorage
from guideloom.tokenize._inputs import InputFile, describe_input, expand_inputs
from guideloom.tokenize._tokenizer import check_tokenizer_path, find_eos_id, load_tokenizer


@dataclass(frozen=True)
class OptionNames:
    """How the caller spells each option in messages: Python arguments, or the command's options."""

    skip_existing: str
    eos_token: str
    text_field: str
    dtype: str
    tokenizer: str
    workers: str
    ray: str


PYTHON_NAMES = OptionNames("skip_existing=True", "eos_token", "text_field", "dtype", "tokenizer_path", "workers", "ray")
CLI_NAMES = OptionNames(
    "--skip-existing", "--eos-token", "--text-field", "--dtype", "--tokenizer", "--workers", "--ray"
)


@dataclass(frozen=True)
class FileJob:
    """One input file and the shard it becomes."""

    shard: int
    file: InputFile

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def size(self) -> int:
        return self.file.size


@dataclass(frozen=True)
class Settings:
    """What every worker needs to write a shard; small and picklable."""

    output: Path
    tokenizer_path: Path
    text_field: str
    dtype: str
    eos_id: int | None


@dataclass(frozen=True)
class TokenizePlan:
    """A checked run: the jobs to do, the settings, the loaded tokenizer and the inputs already committed."""

    settings: Settings
    jobs: list[FileJob]
    skipped: list[Path]
    tokenizer: Any
    names: OptionNames


def choose_dtype(vocab_size: int, requested: object, existing: str | None, names: OptionNames = PYTHON_NAMES) -> str:
    """The token dtype: the one requested, else the existing storage's, else the smallest of uint16/uint32 that fits."""
    if requested is None:
        chosen = existing if existing is not None else "uint16" if vocab_size <= 2**16 else "uint32"
    else:
        try:
            chosen = np.dtype(requested).name  # type: ignore[call-overload]
        except TypeError:
            raise TypeError(
                f"{names.dtype} must be a token dtype ({', '.join(TOKEN_DTYPES)}), got {requested!r}"
            ) from None
    if chosen not in TOKEN_DTYPES:
        raise ValueError(f"{names.dtype} {chosen} is not a token dtype; use one of {', '.join(TOKEN_DTYPES)}")
    if vocab_size - 1 > np.iinfo(chosen).max:
        raise ValueError(f"{names.dtype} {chosen} cannot hold the tokenizer's ids (vocabulary of {vocab_size})")
    return chosen


def unfinished_storage(output: Path) -> bool:
    """What a writer killed before it published the header leaves: an empty ``shards/`` and ``incomplete/``."""
    names = set(os.listdir(output))
    if not names or not names <= {SHARDS_DIR, INCOMPLETE_DIR}:
        return False
    if any((output / name).is_symlink() or not (output / name).is_dir() for name in names):
        return False
    return SHARDS_DIR not in names or not any((output / SHARDS_DIR).iterdir())


def _check_output(output: Path) -> str | None:
    """The dtype of the token storage already at ``output``, None when there is none yet."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"output {output} exists and is not a directory")
    is_storage = (output / HEADER_NAME).exists()
    if output.is_dir() and not is_storage and not unfinished_storage(output) and any(output.iterdir()):
        raise ValueError(f"output {output} is a non-empty directory that holds no guideloom storage")
    return TokenStorage(output).dtype.name if is_storage else None


def plan_run(
    inputs: Any,
    output: Path,
    tokenizer_path: Path,
    *,
    text_field: str = "text",
    dtype: object = None,
    eos_token: str | None = "auto",
    skip_existing: bool = False,
    names: OptionNames = PYTHON_NAMES,
) -> TokenizePlan:
    """Check the inputs, the tokenizer and the output, and assign shards; raises before anything is written."""
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"{names.text_field} must be a non-empty string, got {text_field!r}")
    paths = expand_inputs(inputs)
    duplicates = sorted({str(p) for p in paths if paths.count(p) > 1})
    if duplicates:
        raise ValueError(f"inputs name the same file more than once: {', '.join(duplicates)}")
    jobs = [FileJob(shard, describe_input(path, text_field)) for shard, path in enumerate(paths)]
    if all(job.size == 0 for job in jobs):
        raise ValueError(f"the inputs hold no documents: all {len(jobs)} files are empty")
    check_tokenizer_path(tokenizer_path, names.tokenizer)
    tokenizer = load_tokenizer(tokenizer_path)
    existing = _check_output(output)
    chosen = choose_dtype(int(tokenizer.get_vocab_size(with_added_tokens=True)), dtype, existing, names)
    TokenStorage(output, chosen)  # an existing storage of another kind or dtype fails here, before writing
    committed = set(committed_shard_ids(output))
    skipped = [job for job in jobs if job.shard in committed]
    if skipped and not skip_existing:
        raise ShardExistsError(
            f"{output} already holds {len(skipped)} of the shards to write (first: shard {skipped[0].shard} for "
            f"{skipped[0].path}); write to a new directory, or pass {names.skip_existing} to finish an "
            "interrupted run with the same inputs"
        )
    settings = Settings(output, tokenizer_path, text_field, chosen, find_eos_id(tokenizer, eos_token, names.eos_token))
    return TokenizePlan(
        settings=settings,
        jobs=[job for job in jobs if job.shard not in committed],
        skipped=[job.path for job in skipped],
        tokenizer=tokenizer,
        names=names,
    )
