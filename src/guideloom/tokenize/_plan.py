"""Planning a tokenize run: everything that can be checked is checked here, before anything is written.

The plan holds the jobs (the sorted inputs cut into groups of consecutive files, see ``_groups``), the
settings every worker needs, what earlier runs committed of each group, and the inputs of the groups an
earlier run finished.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._core.checks import check_choice
from guideloom._core.errors import ShardExistsError, StorageNotFoundError
from guideloom._core.sizes import parse_shard_size
from guideloom._remote.object_store import is_url
from guideloom._shards.header import TOKEN_DTYPES
from guideloom._shards.layout import holds_storage, is_unfinished_storage
from guideloom._storage.storages import TokenStorage
from guideloom.tokenize._chat import describe_chat_input
from guideloom.tokenize._chat_template import TRAIN_ON, load_chat_tokenizer
from guideloom.tokenize._groups import (
    MAX_GROUPS,
    SHARDS_PER_GROUP,
    GroupJob,
    group_files,
    group_paths,
    group_progress,
    shard_contents,
)
from guideloom.tokenize._inputs import describe_input, expand_inputs
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
    storage_options: str
    chat: str
    train_on: str
    shard_size: str


PYTHON_NAMES = OptionNames(
    "skip_existing=True",
    "eos_token",
    "text_field",
    "dtype",
    "tokenizer_path",
    "workers",
    "ray",
    "storage_options",
    "chat=True",
    "train_on",
    "shard_size",
)
CLI_NAMES = OptionNames(
    "--skip-existing",
    "--eos-token",
    "--text-field",
    "--dtype",
    "--tokenizer",
    "--workers",
    "--ray",
    "--storage-options",
    "--chat",
    "--train-on",
    "--shard-size",
)


@dataclass(frozen=True)
class TokenizeSettings:
    """What every worker needs to write a shard; small and picklable."""

    output: Path | str  # a directory, or a storage URL
    tokenizer_path: Path
    text_field: str
    dtype: str
    eos_id: int | None
    storage_options: dict[str, Any] | None = None
    train_on: str | None = None  # conversations: what their loss mask marks ("assistant", "all"); None: text

    def storage(self) -> TokenStorage:
        """The output storage (for a URL: through this machine's default cache); masked for conversations."""
        masked = self.train_on is not None
        return TokenStorage(self.output, self.dtype, storage_options=self.storage_options, loss_mask=masked)

    def load_tokenizer(self) -> Any:
        """The run's tokenizer, as a worker loads it: a tokenizer.json, or a tokenizer directory for conversations."""
        if self.train_on is None:
            return load_tokenizer(self.tokenizer_path)
        return load_chat_tokenizer(self.tokenizer_path)


@dataclass(frozen=True)
class TokenizePlan:
    """A checked run: the groups to write, the settings, the loaded tokenizer and the inputs already committed."""

    settings: TokenizeSettings
    jobs: list[GroupJob]
    skipped: list[Path]  #: inputs of the groups an earlier run finished
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


def _check_output(output: Path) -> str | None:
    """The dtype of the token storage already at ``output``, None when there is none yet."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"output {output} exists and is not a directory")
    is_storage = holds_storage(output)
    if output.is_dir() and not is_storage and not is_unfinished_storage(output) and any(output.iterdir()):
        raise ValueError(f"output {output} is a non-empty directory that holds no guideloom storage")
    return TokenStorage(output).dtype.name if is_storage else None


def _existing_dtype(output: Path | str, storage_options: dict[str, Any] | None, names: OptionNames) -> str | None:
    """The dtype of the token storage already at ``output`` (a directory or a URL), None when there is none yet."""
    if not is_url(output):
        if storage_options:
            raise ValueError(f"{names.storage_options} apply to URLs only, but the output {output} is a local path")
        return _check_output(Path(output))
    storage = TokenStorage(output, storage_options=storage_options)
    try:
        storage.header_for_reading()
    except StorageNotFoundError:
        return None
    return storage.dtype.name


def _with_progress(
    jobs: list[GroupJob], storage: TokenStorage, committed: set[int], skip_existing: bool, names: OptionNames
) -> list[GroupJob]:
    """``jobs`` with what the storage's ``committed`` shards hold of each; ShardExistsError unless ``skip_existing``."""
    ours = sorted(shard for shard in committed if shard // SHARDS_PER_GROUP < len(jobs))
    if not ours:
        return jobs
    if not skip_existing:
        first = jobs[ours[0] // SHARDS_PER_GROUP]
        raise ShardExistsError(
            f"{storage.location} already holds {len(ours)} of the shards to write (first: shard {ours[0]} for "
            f"{first.describe()}); write to a new directory, or pass {names.skip_existing} to finish an "
            "interrupted run with the same inputs and options"
        )
    header = storage.header_for_reading()
    contents = shard_contents(storage, header)
    started = {shard // SHARDS_PER_GROUP for shard in ours}
    return [
        replace(job, resume=group_progress(job, header, contents, committed)) if job.group in started else job
        for job in jobs
    ]


def _check_chat_options(train_on: object, text_field: object, eos_token: object, names: OptionNames) -> None:
    """Conversations take the template's tokens as they are: the text options do not apply to them."""
    check_choice(names.train_on, train_on, TRAIN_ON)
    for value, default, option in ((text_field, "text", names.text_field), (eos_token, "auto", names.eos_token)):
        if value != default:
            raise ValueError(
                f"{option} does not apply to conversations ({names.chat}): they are read from the 'messages' "
                "field and hold exactly the chat template's tokens"
            )


def plan_run(
    inputs: Any,
    output: Path | str,
    tokenizer_path: Path,
    *,
    storage_options: dict[str, Any] | None,
    text_field: str,
    dtype: object,
    eos_token: str | None,
    skip_existing: bool,
    shard_size: object,
    train_on: str | None,
    names: OptionNames,
) -> TokenizePlan:
    """Check the inputs, the tokenizer and the output, and group the inputs; raises before anything is written.

    Every option is given by the caller (``tokenize_files`` or the command), whose defaults are the only ones.

    ``train_on`` (``"assistant"`` or ``"all"``) reads conversations instead of text (see ``_chat``); they
    are grouped into shards as text is.
    """
    shard_size = parse_shard_size(shard_size, names.shard_size)
    if train_on is not None:
        _check_chat_options(train_on, text_field, eos_token, names)
    if not isinstance(text_field, str):
        raise TypeError(f"{names.text_field} must be a str, got {type(text_field).__name__}")
    if not text_field:
        raise ValueError(f"{names.text_field} must be a non-empty string, got {text_field!r}")
    paths = expand_inputs(inputs)
    duplicates = sorted(str(path) for path, count in Counter(paths).items() if count > 1)  # 10^5 files: no count()
    if duplicates:
        raise ValueError(f"inputs name the same file more than once: {', '.join(duplicates)}")
    files = [describe_input(path, text_field) if train_on is None else describe_chat_input(path) for path in paths]
    if all(file.size == 0 for file in files):
        which = "the input file is" if len(files) == 1 else f"all {len(files)} input files are"
        raise ValueError(f"the inputs hold no documents: {which} empty")
    groups = group_files(files, shard_size)
    if len(groups) > MAX_GROUPS:
        raise ValueError(
            f"{names.shard_size} {shard_size} cuts the inputs into {len(groups):,} groups of files; at most "
            f"{MAX_GROUPS:,} fit the shard ids: give a larger {names.shard_size}"
        )
    jobs = [GroupJob(group, group_files_of, shard_size) for group, group_files_of in enumerate(groups)]
    if train_on is None:
        check_tokenizer_path(tokenizer_path, names.tokenizer)
        tokenizer = load_tokenizer(tokenizer_path)
        vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    else:
        tokenizer = load_chat_tokenizer(tokenizer_path, names.tokenizer)
        vocab_size = len(tokenizer)
    existing = _existing_dtype(output, storage_options, names)
    chosen = choose_dtype(vocab_size, dtype, existing, names)
    # an existing storage of another kind, dtype or mask fails here, before writing
    masked = train_on is not None
    storage = TokenStorage(output, chosen, storage_options=storage_options, loss_mask=masked)
    committed = set(storage.committed_shards()) if existing is not None else set()
    if committed:
        jobs = _with_progress(jobs, storage, committed, skip_existing, names)
    eos_id = find_eos_id(tokenizer, eos_token, names.eos_token) if train_on is None else None
    settings = TokenizeSettings(output, tokenizer_path, text_field, chosen, eos_id, storage_options, train_on)
    return TokenizePlan(
        settings=settings,
        jobs=[job for job in jobs if not job.resume.finished],
        skipped=group_paths(job for job in jobs if job.resume.finished),
        tokenizer=tokenizer,
        names=names,
    )
