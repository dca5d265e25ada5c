"""Bring your data: Parquet, saved Hugging Face datasets, JSONL, WebDataset tars, MDS and LitData into a storage.

``import_records(sources, destination)`` (and ``guideloom import SRC... DEST``) writes a ``DocumentStorage``
whose records hold the sources' rows, one record per row, in the sources' order within each input,
in parallel and exactly once; see docs/importing.md.

Sources (``_inputs``; one module per format behind one record stream, ``_stream``)
    ``_parquet`` (Parquet files, row groups in batches), ``_arrow`` (``save_to_disk`` folders and Arrow
    IPC files), ``_jsonl`` (JSON Lines, compressed or not), ``_webdataset`` (tars read as data only),
    ``_mds`` (MosaicML MDS folders) and ``_litdata`` (LitData folders), the last two read from their
    documented on-disk formats without their libraries.

Fields (``_schema``, ``_arrow_columns``)
    Inferred from the sources (Arrow types, Hugging Face features, JSON values, tar extensions, MDS
    encodings, LitData formats) or given (``schema=``); a row that does not fit is an
    :class:`ImportInputError` naming the input and the row.

Exactly once (``_plan``, ``_write``)
    The inputs' pieces are cut into jobs; job ``j`` writes shards ``j * 10**6 + k``, each committed after
    its provenance file (``sources/<shard>.json``: the input and rows it holds, and whether it ends the
    job). A run killed at any moment and run again goes on after the last committed shard of each job;
    over a finished import it writes nothing. ``explain`` reads the provenance files and names each
    record's input and row.

Running (``_work``, ``_run``, ``_command``)
    Through ``guideloom._jobs``: worker processes (default: one per core) or Ray tasks, a progress bar
    (bytes/s, rows/s), and a summary (:class:`ImportSummary`: rows, shards, bytes, skipped rows by reason).
"""

from guideloom.importing._errors import ImportInputError, ImportWorkerDied
from guideloom.importing._run import ImportSummary, import_records, imported_schema

__all__ = ["ImportInputError", "ImportSummary", "ImportWorkerDied", "import_records", "imported_schema"]
