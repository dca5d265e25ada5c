"""The ``guideloom tokenize`` command: its options, registered on the one ``guideloom`` command line.

Like every command, it is prepared (everything checked: a mistake exits 2 with nothing written) and then
run (a failed input exits 1, with the shards finished before it committed).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from guideloom._core.checks import check_path
from guideloom._core.subcommands import Subcommands
from guideloom._jobs import options
from guideloom._remote.object_store import is_url, parse_storage_options
from guideloom._shards.header import TOKEN_DTYPES
from guideloom._storage.storages import local_path
from guideloom.tokenize._chat_template import TRAIN_ON, import_transformers
from guideloom.tokenize._groups import DEFAULT_SHARD_SIZE
from guideloom.tokenize._plan import CLI_NAMES, plan_run
from guideloom.tokenize._run import execute
from guideloom.tokenize._tokenizer import import_tokenizers

DESCRIPTION = """\
Tokenize text into a guideloom token storage in shards of --shard-size bytes
of tokens (default 256MiB): the sorted inputs are cut into groups of
consecutive files of at least that many input bytes, and group g writes
shards g*1000000, g*1000000+1, ...: the same shards whatever the number of
workers. Documents are never cut; a shard is committed once it holds
--shard-size bytes of tokens, so it ends with a whole document.

  .jsonl     one document per line: the string in --text-field (default "text")
  .parquet   one document per row of the --text-field column (needs pyarrow)
  others     UTF-8 text, one document per file (.txt, .md, .py, ...)
  directory  its .txt, .jsonl and .parquet files, recursively

gzip, zstd, bz2 and xz files (.jsonl.gz, .jsonl.zst, .txt.xz, ...) are read
as they are. After each document the tokenizer's end-of-text id is appended
(<|endoftext|>, </s>, ... if it has one; --eos-token / --no-eos to choose).

Missing or unreadable files, bad Parquet columns and an existing output are
reported before anything is written (exit status 2). A file that fails (e.g.
a JSONL line without the field, reported with its line number) commits
nothing more and stops the run with exit status 1; shards finished before
stay committed, and --skip-existing after fixing the input (same inputs,
same options) writes only what is missing.

--chat reads conversations instead: the "messages" field of .jsonl and
.parquet rows (a list of {"role", "content"}), rendered with the chat
template of the Hugging Face tokenizer directory --tokenizer, one
conversation per document, into a masked storage whose loss mask marks the
assistant's turns (--train-on all: every token). Conversation files are
grouped into shards as text files are. Needs guideloom[chat].
"""


def _token_dtype(text: str) -> str:
    if text not in TOKEN_DTYPES:
        raise argparse.ArgumentTypeError(f"{text} is not a token dtype; use one of {', '.join(TOKEN_DTYPES)}")
    return text


def add_tokenize_command(commands: Subcommands) -> None:
    """Register ``guideloom tokenize`` on the command line's subcommands."""
    command = options.add_command(
        commands,
        "tokenize",
        "tokenize .txt/.jsonl/.parquet files (compressed or not) into a token storage",
        DESCRIPTION,
    )
    command.add_argument("inputs", nargs="+", metavar="INPUT", help="input files or directories")
    command.add_argument("output", metavar="OUTPUT", help="the token storage directory (or URL) to write")
    command.add_argument(
        "--tokenizer",
        required=True,
        metavar="TOKENIZER",
        help="a tokenizers tokenizer.json; with --chat, a Hugging Face tokenizer directory with a chat template",
    )
    command.add_argument(
        "--chat", action="store_true", help="read conversations (the messages field) into a masked storage"
    )
    command.add_argument(
        "--train-on",
        choices=TRAIN_ON,
        default=None,
        help="with --chat: the tokens the loss mask marks (default: assistant, the assistant's turns)",
    )
    options.add_workers(
        command, "worker processes (default: min(4, cpu count), none for inputs under 8 MiB; 1: no processes)"
    )
    options.add_ray(
        command,
        "run one Ray task per group of input files on the Ray cluster at ADDRESS (default: RAY_ADDRESS, else a "
        "new local cluster); needs the ray extra",
    )
    command.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text")
    command.add_argument(
        "--dtype", type=_token_dtype, default=None, help="token dtype (default: uint16 if the vocabulary fits)"
    )
    eos = command.add_mutually_exclusive_group()
    eos.add_argument("--eos-token", default="auto", help="token appended after each document (default: auto)")
    eos.add_argument("--no-eos", dest="eos_token", action="store_const", const=None, help="append nothing")
    options.add_shard_size(
        command, DEFAULT_SHARD_SIZE, "bytes of token ids per shard: 256MiB (the default), 1GiB, 500MB, 1048576, ..."
    )
    command.add_argument(
        "--skip-existing", action="store_true", help="finish an interrupted run: write only what is not committed"
    )
    options.add_quiet(command)
    options.add_storage_options(command, "for an OUTPUT URL: fsspec options as a JSON object")
    command.set_defaults(prepare=prepare_tokenize)


def prepare_tokenize(arguments: argparse.Namespace) -> Callable[[], int]:
    """Check everything and plan the run; the returned function runs it."""
    if arguments.ray is not None and arguments.workers is not None:
        raise ValueError("--workers and --ray exclude each other: Ray runs one task per group of input files")
    if arguments.train_on is not None and not arguments.chat:
        raise ValueError("--train-on applies to conversations only: add --chat")
    if arguments.chat:
        import_transformers()
    else:
        import_tokenizers()
    plan = plan_run(
        arguments.inputs,
        arguments.output if is_url(arguments.output) else local_path(arguments.output, "OUTPUT"),
        check_path(CLI_NAMES.tokenizer, arguments.tokenizer),
        storage_options=parse_storage_options(arguments.storage_options),
        text_field=arguments.text_field,
        dtype=arguments.dtype,
        eos_token=arguments.eos_token,
        skip_existing=arguments.skip_existing,
        shard_size=arguments.shard_size,
        train_on=(arguments.train_on or "assistant") if arguments.chat else None,
        names=CLI_NAMES,
    )

    def run() -> int:
        summary = execute(plan, arguments.workers, progress=not arguments.quiet, ray=options.ray_address(arguments))
        print(summary.describe())
        return 0

    return run
