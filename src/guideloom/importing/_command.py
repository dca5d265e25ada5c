"""The ``guideloom import`` command: its options, registered on the one ``guideloom`` command line.

Like every command it is prepared (sources, schema and destination checked, fields inferred: a mistake
exits 2) and then run (an input that fails mid-way exits 1; the shards committed before it stay, and the
same command run again finishes the import).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from guideloom._core.subcommands import Subcommands
from guideloom._jobs import options
from guideloom._remote.object_store import parse_storage_options
from guideloom._storage.storages import local_path
from guideloom.importing._plan import DEFAULT_SHARD_SIZE, gather_inputs, plan_import
from guideloom.importing._run import CLI_NAMES, execute, start_workers

DESCRIPTION = """\
Import rows into a guideloom document storage, one record per row, in
shards of --shard-size bytes of records (default 256MiB).

  .parquet                 Parquet files (read in batches)
  .arrow, saved datasets   Arrow IPC files; folders written by save_to_disk
                           (Image / Audio features become media fields)
  .jsonl, .jsonl.zst, ...  JSON Lines, plain or gzip/zstd/bz2/xz-compressed
  .tar, .tar.gz, ...       WebDataset tars: members grouped by key, one field
                           per extension (jpg png webp flac wav mp3 mp4 webm
                           txt json cls), the key kept as __key__
  MDS, LitData folders     an index.json of theirs, read without their library
  other folders            the files above they hold, recursively
  s3://..., gs://...       Parquet, Arrow, JSONL and tar objects, or a prefix
                           of them (--storage-options for fsspec)

The fields are inferred from the sources unless --schema gives them (a JSON
file, or module:attribute naming a RecordSchema or a dict); a row that does
not fit stops the import with its input and row named. Records keep each input's row order;
`guideloom explain` names each record's input and row.

An import killed at any moment finishes when the same command runs again,
every row written once; over a finished import it writes nothing.
"""


def add_import_command(commands: Subcommands) -> None:
    """Register ``guideloom import`` on the command line's subcommands."""
    command = options.add_command(
        commands,
        "import",
        "import Parquet, saved datasets, JSONL, WebDataset tars, MDS or LitData folders into a storage",
        DESCRIPTION,
    )
    command.add_argument("sources", nargs="+", metavar="SRC", help="input files or folders")
    command.add_argument("destination", metavar="DEST", help="the document storage folder to write")
    command.add_argument("--schema", metavar="S", help="the fields: a JSON file, or module:attribute")
    options.add_workers(command, "worker processes (default: one per core, none for inputs under 8 MiB; 1: none)")
    options.add_shard_size(
        command, DEFAULT_SHARD_SIZE, "bytes of records per shard: 256MiB (the default), 1GiB, 500MB, 1048576, ..."
    )
    options.add_ray(
        command,
        "one Ray task per job on the Ray cluster at ADDRESS (default: RAY_ADDRESS, else a new local cluster); "
        "every machine must see DEST at the same path; needs the ray extra",
    )
    options.add_quiet(command)
    options.add_storage_options(command, "for sources on an object store: fsspec options as a JSON object")
    command.set_defaults(prepare=prepare_import)


def prepare_import(arguments: argparse.Namespace) -> Callable[[], int]:
    """Check everything and plan the import; the returned function runs it."""
    import time

    started = time.perf_counter()
    storage_options = parse_storage_options(arguments.storage_options)
    ray = options.ray_address(arguments)
    inputs = gather_inputs(arguments.sources, CLI_NAMES, storage_options)
    processes = start_workers(inputs, arguments.workers, ray, arguments.shard_size, CLI_NAMES)
    try:
        plan = plan_import(
            inputs,
            local_path(arguments.destination, "DEST"),
            arguments.schema,
            arguments.shard_size,
            CLI_NAMES,
            storage_options,
        )
    except BaseException:
        processes.close()
        raise

    def run() -> int:
        with processes:
            summary = execute(plan, arguments.workers, not arguments.quiet, started, ray, processes)
        print(summary.describe())
        return 0

    return run
