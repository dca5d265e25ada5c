"""Every way the derived shard index can be damaged: it never hides, loses or invents a shard.

The shard files are the commits; ``shards.index`` only saves readers a listing and footer reads.
Deleted, cut short, replaced by another storage's index, forged, flipped or replaced by a huge
sparse file, it is named by ``verify`` and ``inspect``, bypassed by readers and the loader (who read
exactly the batches of the undamaged storage), never makes ``clean`` delete a shard, and is rebuilt.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._cli import main
from guideloom._shards.index import HEADER, INDEX_NAME, read_index
from guideloom._shards.shard_table import RECORD, record_checks

SHARDS = 12
Damage = Callable[[Path], None]


def write_storage(path: Path, shards: range, offset: int = 0) -> TokenStorage:
    """A storage committed by writers, shard ``s`` holding documents that name it; ``offset`` sets it apart."""
    storage = TokenStorage(path, "uint32")
    for part in (shards[: len(shards) // 2], shards[len(shards) // 2 :]):  # two writers, one after the other
        with storage.sync_writer() as writer:
            for shard in part:
                for document in range(3):
                    writer.append(shard, np.arange(5 + document, dtype=np.uint32) + 1_000 * shard + offset)
    storage.committed_shards()  # the index, as the first reader leaves it
    return storage


def batches(storage: TokenStorage) -> list[list[list[int]]]:
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=4, sequence_length=6, shuffle=True, seed=3
    ) as loader:
        return [batch.tolist() for batch in loader]


def cut(count: int) -> Damage:
    def damage(index: Path) -> None:
        index.write_bytes(index.read_bytes()[:-count])

    return damage


def to_header(index: Path) -> None:
    index.write_bytes(index.read_bytes()[: HEADER.size])


def to_the_0_3_preamble(index: Path) -> None:
    index.write_bytes(index.read_bytes()[: RECORD.itemsize])


def deleted(index: Path) -> None:
    index.unlink()


def forged_id(index: Path) -> None:
    """Shard 4's record made to name shard 40, its check recomputed: a forgery only the checksum shows."""
    raw = bytearray(index.read_bytes())
    records = np.frombuffer(raw, RECORD, offset=HEADER.size).copy()
    records["id"][4] = 40
    records["check"] = record_checks(records)
    index.write_bytes(bytes(raw[: HEADER.size]) + records.tobytes())


def flipped(position: int) -> Damage:
    def damage(index: Path) -> None:
        raw = bytearray(index.read_bytes())
        raw[position % len(raw)] ^= 0x10
        index.write_bytes(bytes(raw))

    return damage


def sparse(size: int, keep_header: bool) -> Damage:
    def damage(index: Path) -> None:
        if not keep_header:
            index.unlink()
        with open(index, "ab") as file:
            file.truncate(size)

    return damage


def forged_huge_header(index: Path) -> None:
    """A header counting 4 GiB of records, the file made that large without writing them."""
    count = (4 << 30) // RECORD.itemsize
    with open(index, "r+b") as file:
        file.write(HEADER.pack(b"GLOOMIX1", 2, 0, count, 0, 0, 0, 1))
        file.truncate(HEADER.size + count * RECORD.itemsize)


DAMAGES: dict[str, Damage] = {
    "cut by 7 bytes": cut(7),
    "cut by one record": cut(RECORD.itemsize),
    "cut to its header": to_header,
    "cut to the 0.3 preamble's size": to_the_0_3_preamble,
    "a forged record with a wrong id": forged_id,
    "a flipped bit in the header": flipped(20),
    "a flipped bit in a record": flipped(HEADER.size + 5 * RECORD.itemsize + 17),
    "a sparse 4 GiB file": sparse(4 << 30, keep_header=False),
    "a sparse 1 TiB file": sparse(1 << 40, keep_header=False),
    "cut short, then extended to 4 GiB": sparse(4 << 30, keep_header=True),
    "a forged header of 4 GiB of records": forged_huge_header,
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[list[int]]]]:
    path = tmp_path_factory.mktemp("reference") / "tokens"
    return path, batches(write_storage(path, range(SHARDS)))


@pytest.fixture
def storage(tmp_path: Path) -> TokenStorage:
    return write_storage(tmp_path / "tokens", range(SHARDS))


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=list(DAMAGES))
def test_verify_names_the_damage_and_rebuilds_the_index(storage: TokenStorage, damage: Damage) -> None:
    damage(storage.path / INDEX_NAME)
    problems = storage.verify()
    assert len(problems) == 1 and problems[0].startswith(f"the shard index {storage.path / INDEX_NAME} "), problems
    assert read_index(storage.path).problem is None
    assert storage.verify() == []


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=list(DAMAGES))
def test_the_command_line_names_it(storage: TokenStorage, damage: Damage, capsys: pytest.CaptureFixture[str]) -> None:
    damage(storage.path / INDEX_NAME)
    assert main(["inspect", str(storage.path)]) == 0
    index_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("index:")]
    named = f"index:      not used, the storage was listed whole: the shard index {storage.path / INDEX_NAME} "
    assert len(index_lines) == 1 and index_lines[0].startswith(named), index_lines
    damage(storage.path / INDEX_NAME)
    assert main(["verify", str(storage.path)]) == 1
    corrupt = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CORRUPT")]
    assert len(corrupt) == 1 and corrupt[0].startswith(f"CORRUPT the shard index {storage.path / INDEX_NAME} ")


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=list(DAMAGES))
def test_a_snapshot_says_why_it_bypassed_the_index(storage: TokenStorage, damage: Damage) -> None:
    storage.snapshot()
    assert storage.index_problem is None
    damage(storage.path / INDEX_NAME)
    assert storage.snapshot().ids.tolist() == list(range(SHARDS))
    assert str(storage.index_problem).startswith(f"the shard index {storage.path / INDEX_NAME} is damaged: ")
    storage.snapshot()  # the index it rebuilt
    assert storage.index_problem is None


@pytest.mark.parametrize("damage", [deleted, *DAMAGES.values()], ids=["deleted", *DAMAGES])
def test_readers_and_the_loader_read_every_shard(
    storage: TokenStorage, damage: Damage, reference: tuple[Path, list[list[list[int]]]]
) -> None:
    damage(storage.path / INDEX_NAME)
    assert storage.committed_shards() == list(range(SHARDS))
    damage(storage.path / INDEX_NAME)
    assert batches(storage) == reference[1]
    assert read_index(storage.path).problem is None and storage.verify() == []


@pytest.mark.parametrize("damage", [deleted, *DAMAGES.values()], ids=["deleted", *DAMAGES])
def test_clean_deletes_no_shard(storage: TokenStorage, damage: Damage) -> None:
    damage(storage.path / INDEX_NAME)
    assert main(["clean", str(storage.path), "--older-than", "0"]) == 0
    assert len(os.listdir(storage.path / "shards")) == SHARDS
    assert storage.committed_shards() == list(range(SHARDS))


def test_another_storage_s_index_copied_in_is_named_and_bypassed(
    storage: TokenStorage, tmp_path: Path, reference: tuple[Path, list[list[list[int]]]]
) -> None:
    other = write_storage(tmp_path / "other", range(3, 9), offset=500)  # ids in common, other contents
    (storage.path / INDEX_NAME).write_bytes((other.path / INDEX_NAME).read_bytes())
    assert main(["clean", str(storage.path), "--older-than", "0"]) == 0
    problems = storage.verify()
    assert len(problems) == 1 and "made for another shards/ directory" in problems[0]
    (storage.path / INDEX_NAME).write_bytes((other.path / INDEX_NAME).read_bytes())
    assert batches(storage) == reference[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.integers(min_value=0), min_size=1, max_size=4))
def test_bit_flips_anywhere_never_change_what_is_read(storage: TokenStorage, flips: list[int]) -> None:
    index = storage.path / INDEX_NAME
    storage.committed_shards()  # a sound index again (the previous example's flips are rebuilt away)
    raw = bytearray(index.read_bytes())
    for flip in flips:
        raw[(flip // 8) % len(raw)] ^= 1 << (flip % 8)
    index.write_bytes(bytes(raw))
    snapshot = storage.snapshot()
    assert snapshot.ids.tolist() == list(range(SHARDS))
    with storage.sync_reader() as reader:
        assert [shard.info for shard in reader.shards] == list(snapshot)


def test_verify_says_an_index_it_cannot_write_was_not_rebuilt(storage: TokenStorage) -> None:
    # A file where the draft's directory belongs stops the rebuild's write, as a read-only storage does (for root too).
    cut(7)(storage.path / INDEX_NAME)
    damaged = (storage.path / INDEX_NAME).read_bytes()
    os.rmdir(storage.path / "incomplete")
    (storage.path / "incomplete").write_bytes(b"")
    for _ in range(2):  # nothing rebuilt: the second run finds the same damage
        assert storage.verify() == [
            f"the shard index {storage.path / INDEX_NAME} is damaged: it is {len(damaged)} bytes, but its header "
            f"counts {SHARDS} shards; not rebuilt: cannot write in {storage.path / 'incomplete'} (Not a directory)"
        ]
    assert (storage.path / INDEX_NAME).read_bytes() == damaged


def test_verify_by_a_user_who_may_not_write_the_storage(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``guideloom verify`` of a read-only storage. Where the tests run as root (whom modes do not stop), it runs as
    user 65534 through ``setpriv``, in a folder that user can reach."""
    as_root = os.geteuid() == 0
    if as_root and shutil.which("setpriv") is None:
        pytest.skip("running as root, and setpriv is missing to verify as a user without root's rights")
    folder = Path(tempfile.mkdtemp()) if as_root else tmp_path_factory.mktemp("read-only")
    folder.chmod(0o755)
    storage = write_storage(folder / "tokens", range(3))
    cut(7)(storage.path / INDEX_NAME)
    damaged = (storage.path / INDEX_NAME).read_bytes()
    directories = (storage.path, storage.path / "shards", storage.path / "incomplete")
    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_root else []
    for directory in directories:
        directory.chmod(0o555)
    try:
        done = subprocess.run(
            [*as_user, sys.executable, "-m", "guideloom", "verify", "tokens"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        for directory in directories:
            directory.chmod(0o755)
    assert (done.returncode, done.stdout) == (
        1,
        f"CORRUPT the shard index tokens/{INDEX_NAME} is damaged: it is {len(damaged)} bytes, but its header counts "
        "3 shards; not rebuilt: cannot write in tokens/incomplete (Permission denied)\n",
    ), done.stderr
    assert (storage.path / INDEX_NAME).read_bytes() == damaged
    if as_root:
        shutil.rmtree(folder)


def test_verify_rebuilds_no_index_without_a_shard_it_could_not_open(storage: TokenStorage) -> None:
    cut(7)(storage.path / INDEX_NAME)
    shard = storage.path / "shards" / "000000000003.shard"
    shard.write_bytes(shard.read_bytes()[:-10])
    problems = storage.verify()
    assert problems[1:] == [
        f"the shard index {storage.path / INDEX_NAME} is damaged: it is {(storage.path / INDEX_NAME).stat().st_size} "
        f"bytes, but its header counts {SHARDS} shards; not rebuilt while a shard is damaged (readers bypass it)"
    ]
    assert problems[0].startswith("shard 3 has a damaged footer")
