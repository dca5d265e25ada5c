"""Documents as training data: named parts, each measured in one run and reported as ratios or shares.

Parts (``--parts``, all by default):

* ``padding`` (``benchmarks/documents_padding.py``): preference (DPO) records, each a prompt, a chosen and
  a rejected completion of 20 to 600 tokens, read for one shuffled epoch four ways (fixed batches of
  ``--batch`` records and ``batch_tokens=N`` through TRL's ``DataCollatorForPreference``, ``batch_tokens=N``
  laid out padding-free, ``pack_documents=True`` rows of ``--sequence-length``), and the share of the
  token slots of the batches that hold no record token. A record's length is what the DPO layout makes
  of it, ``2 × prompt + chosen + rejected`` tokens: the format's ``length``, recorded by the writer.
  Goals: under 10% padding with a budget, under 2% packed.

The others (``benchmarks/documents_loading.py``) set guideloom's loader beside torch Datasets over flat
files, every measurement in a fresh interpreter, the libraries interleaved, ``--repeats`` times; the
medians are reported, and as guideloom's ratio to each row the median of the ratios of neighbouring runs
(without workers, in the process's CPU time too: an epoch in the main process runs on it alone, and other
work on a shared machine takes wall time from a run, not CPU time):

* ``records``: the same preference records (and an id) in a struct format whose ``unpack_many`` decodes a
  batch at once (its records copied into one buffer, as docs/performance.md writes it); one shuffled epoch of
  batches of 32 padded by ``guideloom.collate.pad``, records/s, against a flat-memmap torch ``Dataset`` (one
  token file and an offsets array, records as NumPy views) read by torch's ``DataLoader``, fetched one by one
  and, tuned, a batch at a time (``__getitems__``), and by torchdata's ``StatefulDataLoader``, all with the
  same collate; main process and 2 workers. One more row: the flat-memmap Dataset whose collate hands NumPy
  arrays over instead of tensors, which shows what torch's tensor transport (shared memory) is worth with
  workers.
* ``large``: records of 100 KB (an id and 25,600 float32 features), batches of 32 (3.2 MB), guideloom
  against plain files (one file a record) read by a torch ``Dataset`` with torch's ``DataLoader`` and its
  default collate (which stacks a batch straight into shared memory in a worker); main process and 2
  workers; records/s, and the main process's peak resident memory (``VmHWM``) and its resident mapped
  file pages at the end of the epoch.
* ``transport``: the hand-over alone, with 2 workers: batches of one float32 tensor of 256 KiB, 1 MiB and
  4 MiB (and the ids), built by guideloom's workers from a storage of small records, against a torch
  ``Dataset`` whose items are the same batches, read by torch's ``DataLoader`` (which sends every tensor
  through shared memory). guideloom pipes arrays under 1 MiB and sends larger ones through shared memory.

Writes ``results/documents.json``: one entry per part measured, with its settings and the machine; the
entries of the parts not measured are kept.

    python -m benchmarks.bench_documents --parts padding           # 20,000 records (seconds)
    python -m benchmarks.bench_documents                           # all parts: 20,000 records, 1,000 large (minutes)
    python -m benchmarks.bench_documents --records 100_000 --large-records 5_000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.documents_data import BATCH
from benchmarks.documents_loading import large_part, measure, records_part, transport_part
from benchmarks.documents_padding import padding_part

PARTS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {
    "padding": padding_part,
    "records": records_part,
    "transport": transport_part,
    "large": large_part,
}


def main() -> None:
    parser = harness.argument_parser(__doc__)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--records", type=harness.count, default=20_000, help="preference records (padding, records)")
    parser.add_argument("--batch", type=int, default=32, help="records per fixed batch (padding)")
    parser.add_argument("--batch-tokens", type=harness.count, default=32_768, help="a batch's budget (padding)")
    parser.add_argument("--sequence-length", type=harness.count, default=8_192, help="a packed row (padding)")
    parser.add_argument("--large-records", type=harness.count, default=1_000, help="records of 100 KB (large)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each row (records, large, transport)")
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts (records, large)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:  # one measurement of documents_loading, in this fresh interpreter
        part, library, root, workers = json.loads(arguments.child)
        print(json.dumps(measure(part, library, Path(root), workers)))
        return
    chosen = [part.strip() for part in arguments.parts.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}: choose from {sorted(PARTS)}")
    for part, option in (("records", "records"), ("large", "large_records")):  # the first batch is not timed
        if part in chosen and getattr(arguments, option) < 2 * BATCH:
            parser.error(
                f"--{option.replace('_', '-')} below {2 * BATCH}: the {part} part times the batches after the first"
            )
    results = harness.read_results("documents") or {}
    with tempfile.TemporaryDirectory(prefix="bench-documents-") as directory:
        for part in chosen:
            root = Path(directory) / part
            root.mkdir()
            results[part] = {**PARTS[part](arguments, root), "machine": harness.machine()}
    harness.write_results("documents", results)


if __name__ == "__main__":
    main()
