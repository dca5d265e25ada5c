"""Writers on a shared file system, emulated: appends that read the size then write, locks that lock nothing,
``fsync`` failing with EIO at the N-th call (``nfs_emulation.c``, loaded with ``LD_PRELOAD``).

Six writer processes commit hundreds of small shards into one storage, two of them contesting the same
ids, while ``guideloom clean --older-than 0`` and readers run in a loop beside them. Every commit that
returned is readable byte for byte, every contested id is committed exactly once, ``ShardExistsError``
is raised only where the shard is committed, and nothing else is in ``shards/``.
"""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from guideloom import TokenStorage
from tests.helpers.processes import child_environment, module_command
from tests.storage.nfs_writer import documents

WRITERS = 6
OWN_SHARDS = 60  # per writer
CONTESTED = list(range(10_000, 10_050))  # written by writers 0 and 1 alike

BESIDE_THE_WRITERS = """
import sys, pathlib, time
from guideloom import TokenStorage
from guideloom._cli import main
path, stop = sys.argv[1], pathlib.Path(sys.argv[2])
storage = TokenStorage(path, "uint32")
runs = 0
while not stop.exists():
    main(["clean", path, "--older-than", "0"])
    storage.committed_shards()  # a reader's snapshot, rebuilding the index beside the commits
    runs += 1
    time.sleep(0.02)
print(runs, file=sys.stderr)
"""

APPENDER = """
import os, sys, pathlib, time
path, mark, ready = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
(ready / str(mark)).touch()
while len(list(ready.iterdir())) < 2:
    time.sleep(0.001)
descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
for _ in range(200):
    os.write(descriptor, bytes([mark]) * 40)
"""


def emulated(library: Path, fsync_fail_at: int = 0, append_delay_us: int = 50) -> dict[str, str]:
    """The environment of a process that sees NFS."""
    return {
        **child_environment(),
        "LD_PRELOAD": str(library),
        "GUIDELOOM_NFS_APPEND_DELAY_US": str(append_delay_us),
        "GUIDELOOM_NFS_FSYNC_FAIL_AT": str(fsync_fail_at),
    }


def test_the_emulation_loses_concurrent_appends_as_nfs_does(nfs_emulation: Path, tmp_path: Path) -> None:
    (tmp_path / "ready").mkdir()
    appenders = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(tmp_path / "log"), str(mark), str(tmp_path / "ready")],
            env=emulated(nfs_emulation, append_delay_us=1000),
        )
        for mark in (1, 2)
    ]
    assert [appender.wait(timeout=60) for appender in appenders] == [0, 0]
    assert (tmp_path / "log").stat().st_size < 2 * 200 * 40  # records written at a size already taken


def test_writers_on_nfs_lose_no_commit(nfs_emulation: Path, tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    TokenStorage(path, "uint32").create()
    stop = tmp_path / "stop"
    beside = subprocess.Popen(
        [sys.executable, "-c", BESIDE_THE_WRITERS, str(path), str(stop)],
        env=emulated(nfs_emulation),
        stderr=subprocess.PIPE,
        text=True,
    )
    writers = []
    (tmp_path / "ready").mkdir()
    for writer in range(WRITERS):
        shards = (CONTESTED if writer < 2 else []) + [writer * 1_000 + shard for shard in range(OWN_SHARDS)]
        command = module_command("tests.storage.nfs_writer", path, tmp_path / "ready", WRITERS, writer, *shards)
        environment = emulated(nfs_emulation, fsync_fail_at=17 + 10 * writer)  # one EIO each, mid-way
        writers.append(subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, text=True))
    outputs = [writer.communicate(timeout=300)[0] for writer in writers]
    stop.touch()
    beside.wait(timeout=60)
    assert [writer.returncode for writer in writers] == [0] * WRITERS
    outcomes = [json.loads(line) for output in outputs for line in output.splitlines()]
    assert len(outcomes) == WRITERS * OWN_SHARDS + 2 * len(CONTESTED)

    storage = TokenStorage(path, "uint32")
    committed = storage.committed_shards()
    winners: dict[int, list[int]] = defaultdict(list)
    for outcome in outcomes:
        if outcome["outcome"] == "committed":
            winners[outcome["shard"]].append(outcome["writer"])
        if outcome["outcome"] == "exists":  # raised only where the shard is committed (and stays so)
            assert outcome["shard"] in committed, outcome
    assert all(len(writers_of) == 1 for writers_of in winners.values()), "two writers both committed one id"
    assert committed == sorted(winners), "a commit that returned is missing, or a shard appeared uncommitted"
    with storage.sync_reader() as reader:
        read = {int(shard): position for position, shard in enumerate(reader.infos.ids)}
        first_document = np.cumsum([0, *reader.infos.rows["record_count"].tolist()])
        for shard, (writer,) in winners.items():
            expected = documents(writer, shard)
            start = int(first_document[read[shard]])
            assert [reader.read(start + i).tolist() for i in range(len(expected))] == [d.tolist() for d in expected]
    assert storage.verify() == []
    kinds = {kind: sum(outcome["outcome"] == kind for outcome in outcomes) for kind in ("committed", "exists")}
    assert kinds["committed"] >= WRITERS * OWN_SHARDS // 4 and kinds["exists"] > 0, kinds
    assert any("Input/output error" in outcome["error"] for outcome in outcomes), "no injected EIO was seen"


COMMIT_ONE_SHARD = """
import sys
import numpy as np
from guideloom import TokenStorage
try:
    with TokenStorage(sys.argv[1], "uint32").sync_writer() as writer:
        for _ in range(int(sys.argv[2])):
            writer.append(7, np.arange(1 << 20, dtype=np.uint32))  # 4 MiB a document
except OSError as error:
    print(error.errno, error, sep="\\n")
"""


@pytest.mark.parametrize("documents", [1, 5], ids=["at commit", "flushed in the background"])
def test_an_eio_from_the_shard_files_own_fsync_names_shard_and_file(
    nfs_emulation: Path, tmp_path: Path, documents: int
) -> None:
    # The writer's first fsync is its shard file's: at the commit, or of the first 8 MiB flushed while appends go on.
    path = tmp_path / "tokens"
    TokenStorage(path, "uint32").create()
    done = subprocess.run(
        [sys.executable, "-c", COMMIT_ONE_SHARD, str(path), str(documents)],
        env=emulated(nfs_emulation, fsync_fail_at=1),
        capture_output=True,
        text=True,
        timeout=120,
    )
    number, message = done.stdout.splitlines()
    unfinished = re.fullmatch(r".*fsync of its file (\S+) failed.*", message)
    assert unfinished is not None and Path(unfinished[1]).parent == path / "incomplete", message
    assert (int(number), message) == (
        errno.EIO,
        f"[Errno 5] shard 7 cannot be committed: fsync of its file {unfinished[1]} failed (Input/output error), so its "
        f"data may not be on disk; the shard is not committed: '{unfinished[1]}'",
    )
    assert TokenStorage(path).committed_shards() == []
