"""Bounded descriptors and mappings: at most ``max_open_shards`` shards mapped per process, under ``ulimit -n``.

Every check that needs a low descriptor limit runs in a fresh interpreter that lowers its own
RLIMIT_NOFILE first, as a user's shell with ``ulimit -n 1024`` would.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from guideloom import StatefulDataLoader
from tests.scale.many_shards import document_shards, token_shards

Run = Callable[..., subprocess.CompletedProcess[str]]

LOW_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
"""


@pytest.fixture(scope="module")
def ten_thousand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scale") / "tokens"
    token_shards(path, 10_000)
    return path


def shard_mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip().endswith(".shard"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_shuffled_epoch_with_workers_reads_ten_thousand_shards_under_ulimit_1024(
    ten_thousand: Path, run_python: Run
) -> None:
    result = run_python(
        LOW_LIMIT
        + """
import json, os
import numpy as np
from guideloom import StatefulDataLoader, TokenStorage
# A collate of its own makes the loader use worker processes (plain windows would use a thread).
with StatefulDataLoader.from_storage(
    TokenStorage(sys.argv[1]), np.stack, device="cpu", local_batch_size=50, sequence_length=16,
    shuffle=True, num_workers=2,
) as loader:
    firsts = [int(token) for batch in loader for token in batch[:, 0].tolist()]
    descriptors = len(os.listdir("/proc/self/fd"))
print(json.dumps({"firsts": firsts, "descriptors": descriptors}))
""",
        ten_thousand,
        1024,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    # Window k holds tokens 16k .. 16k + 15: each of the 10^4 windows once, in a shuffled order.
    assert sorted(found["firsts"]) == list(range(0, 160_000, 16))
    assert found["firsts"] != sorted(found["firsts"])
    assert found["descriptors"] < 1024


def test_inspect_and_a_reader_work_under_a_limit_below_the_shard_count(ten_thousand: Path, run_python: Run) -> None:
    result = run_python(
        LOW_LIMIT
        + """
import json, subprocess
import numpy as np
from guideloom import TokenStorage
with TokenStorage(sys.argv[1]).sync_reader() as reader:
    total = sum(int(reader.read(i)[0]) for i in range(0, len(reader), 7))
print(json.dumps({"documents": len(reader), "total": total}))
from guideloom._cli import main
main(["inspect", sys.argv[1]])
""",
        ten_thousand,
        256,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[0])
    assert found == {"documents": 20_000, "total": sum(range(0, 20_000, 7)) * 8}
    assert "10,000" in result.stdout  # inspect's shard count


def test_running_out_of_descriptors_is_an_oserror_naming_the_limit_and_the_knobs(
    tmp_path: Path, run_python: Run
) -> None:
    token_shards(tmp_path / "tokens", 300)
    result = run_python(
        LOW_LIMIT
        + """
from guideloom import TokenStorage
with TokenStorage(sys.argv[1], max_open_shards=1000).sync_reader() as reader:
    try:
        for i in range(len(reader)):
            reader.read(i)
    except OSError as error:
        print(type(error).__name__, error)
""",
        tmp_path / "tokens",
        100,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OSError")  # not CorruptStorageError: the storage is fine
    assert "max_open_shards" in result.stdout and "ulimit -n" in result.stdout and "100" in result.stdout


def test_a_reader_maps_at_most_max_open_shards(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 50, max_open_shards=8)
    with storage.sync_reader() as reader:
        assert shard_mappings() == 0  # opening reads the listing and the index, no shard
        for index in range(len(reader)):
            reader.read(index)
            assert shard_mappings() <= 8
    assert shard_mappings() == 0


def test_views_into_a_closed_shard_stay_valid(tmp_path: Path) -> None:
    storage = document_shards(tmp_path / "documents", 20, max_open_shards=2)
    with storage.sync_reader() as reader:
        views = [reader.read_encoded(index)[0] for index in range(len(reader))]  # shards close behind us
        tokens = [np.frombuffer(view, np.uint8) for view in views]
        assert [json.loads(bytes(view)) for view in views] == [{"id": index} for index in range(40)]
    assert [json.loads(array.tobytes()) for array in tokens] == [{"id": index} for index in range(40)]


def test_max_open_shards_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_open_shards"):
        token_shards(tmp_path / "tokens", 1, max_open_shards=0)
    with pytest.raises(TypeError, match="max_open_shards"):
        token_shards(tmp_path / "tokens", 1, max_open_shards="8")


def _target(descriptor: Path) -> str:
    """What an open descriptor of this process points to ("" if it closed meanwhile)."""
    try:
        return os.readlink(descriptor)
    except OSError:
        return ""


@pytest.mark.parametrize("mode", ["plain", "document_boundaries", "pack_documents"])
def test_close_releases_every_descriptor_and_mapping(tmp_path: Path, mode: str) -> None:
    storage = token_shards(tmp_path / "tokens", 300)

    def files() -> tuple[int, int]:
        with open("/proc/self/maps") as maps:
            mapped = sum(1 for line in maps if ".shard" in line or ".pack" in line)
        return len(list(Path("/proc/self/fd").iterdir())), mapped

    before = files()
    modes = {} if mode == "plain" else {mode: True}
    loader = StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=40, sequence_length=8, shuffle=True, **modes
    )
    for _ in loader:
        pass
    assert files()[1] > before[1]
    loader.close()
    descriptors, mapped = files()
    # Nothing of the storage stays open or mapped, and no descriptor is left behind; other tests' leftovers in this
    # process (a parallel test runner's worker) may close meanwhile, so the count may fall but never rise.
    assert mapped == before[1] and descriptors <= before[0]
    assert not [link for link in Path("/proc/self/fd").iterdir() if str(tmp_path) in _target(link)]
    del loader
