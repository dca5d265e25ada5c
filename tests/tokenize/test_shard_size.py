"""``guideloom tokenize --shard-size``: small files grouped into shards, large ones split, resumable runs."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")  # the 'tokenize' extra

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._cli import main as cli
from guideloom._core.sizes import parse_shard_size
from guideloom._shards.layout import committed_shard_ids, shard_file_name
from guideloom.tokenize import load_tokenizer, tokenize_files, train_tokenizer
from tests.helpers.processes import child_environment

WORDS = "the a fox dog jumps over lazy quick brown alpha beta gamma delta naïve café 東京 def return".split()


def texts(count: int, seed: int, longest: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))) for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(texts(300, 0), 400, tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in lines))
    return path


def read_texts(path: Path, tokenizer_path: Path) -> list[str]:
    tokenizer = load_tokenizer(tokenizer_path)
    with TokenStorage(path).sync_reader() as reader:
        return [tokenizer.decode(reader.read(i)[:-1].tolist()) for i in range(len(reader))]


def shard_bytes(path: Path) -> dict[int, bytes]:
    return {shard: (path / "shards" / shard_file_name(shard)).read_bytes() for shard in committed_shard_ids(path)}


def tokenize_cli(*arguments: object) -> list[str]:
    return [sys.executable, "-m", "guideloom", "tokenize", *map(str, arguments), "--quiet"]


def padding_share(path: Path, sequence_length: int) -> float:
    """The share of an epoch of packed rows that is padding."""
    storage = TokenStorage(path)
    with storage.sync_reader() as reader:
        tokens = reader.token_count
    rows = 0
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=4, sequence_length=sequence_length, pack_documents=True
    ) as loader:
        for batch in loader:
            rows += len(batch["input_ids"])
    return 1 - tokens / (rows * sequence_length)


def test_many_small_files_share_a_shard_and_pack_with_little_padding(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for number, text in enumerate(texts(300, 1, longest=30)):
        (corpus / f"note-{number:03d}.txt").write_text(text)
    done = subprocess.run(
        tokenize_cli(corpus, tmp_path / "grouped", "--tokenizer", tokenizer_path), env=child_environment()
    )
    assert done.returncode == 0
    assert committed_shard_ids(tmp_path / "grouped") == [0]  # 300 files, 40 KB: one group, one shard
    tokenize_files([corpus], tmp_path / "per-file", tokenizer_path, shard_size=1, progress=False)
    assert len(committed_shard_ids(tmp_path / "per-file")) == 300  # what one shard per file was
    grouped, per_file = padding_share(tmp_path / "grouped", 128), padding_share(tmp_path / "per-file", 128)
    assert grouped < 0.05 < 0.5 < per_file, (grouped, per_file)
    assert read_texts(tmp_path / "grouped", tokenizer_path) == read_texts(tmp_path / "per-file", tokenizer_path)


def test_a_large_file_is_split_between_documents(tmp_path: Path, tokenizer_path: Path) -> None:
    lines = texts(400, 2)
    source = write_jsonl(tmp_path / "large.jsonl", lines)
    summary = tokenize_files([source], tmp_path / "out", tokenizer_path, shard_size="1KiB", progress=False)
    shards = committed_shard_ids(tmp_path / "out")
    assert summary.shards == tuple(shards) == tuple(range(len(shards))) and len(shards) > 5  # group 0: 0, 1, ...
    assert read_texts(tmp_path / "out", tokenizer_path) == lines  # every document whole, in order
    with TokenStorage(tmp_path / "out").sync_reader() as reader:
        lengths = [len(reader.read(i)) for i in range(len(reader))]
        counts = [shard.record_count for shard in reader.shards]
    expected, documents, size = [], 0, 0  # a shard is committed at the first document that fills 1 KiB
    for length in lengths:
        documents, size = documents + 1, size + 2 * length
        if size >= 1024:
            expected.append(documents)
            documents, size = 0, 0
    assert counts == [*expected, *([documents] if documents else [])]


def test_a_document_larger_than_the_shard_size_is_kept_whole(tmp_path: Path, tokenizer_path: Path) -> None:
    huge = " ".join(texts(40, 3))
    source = write_jsonl(tmp_path / "a.jsonl", ["short", huge, "after"])
    tokenize_files([source], tmp_path / "out", tokenizer_path, shard_size=64, progress=False)
    with TokenStorage(tmp_path / "out").sync_reader() as reader:
        assert [shard.record_count for shard in reader.shards] == [2, 1]  # "short" + the huge one, then "after"
        assert len(reader.read(1)) * 2 > 64
    assert read_texts(tmp_path / "out", tokenizer_path) == ["short", huge, "after"]


def corpus_of_groups(directory: Path, files: int = 10) -> Path:
    """JSONL files of about 20 KB (6 KB of uint16 tokens): each its own group at 4 KiB, of two shards."""
    directory.mkdir()
    for number in range(files):
        write_jsonl(directory / f"part-{number:02d}.jsonl", texts(110, 10 + number))
    return directory


def test_the_same_shards_whatever_the_workers(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = corpus_of_groups(tmp_path / "corpus")
    options = ["--tokenizer", tokenizer_path, "--shard-size", "4KiB"]
    for workers in (1, 2):
        completed = subprocess.run(
            tokenize_cli(corpus, tmp_path / f"workers-{workers}", *options, "--workers", workers),
            env=child_environment(),
        )
        assert completed.returncode == 0
    one, two = shard_bytes(tmp_path / "workers-1"), shard_bytes(tmp_path / "workers-2")
    assert one == two and {shard // 10**6 for shard in one} == set(range(10)) and len(one) == 20


def test_a_group_interrupted_between_its_shards_resumes_after_them(tmp_path: Path, tokenizer_path: Path) -> None:
    """What a run killed mid-group leaves: the group's first shards. --skip-existing writes exactly the rest."""
    corpus = corpus_of_groups(tmp_path / "corpus")
    tokenize_files([corpus], tmp_path / "reference", tokenizer_path, shard_size="4KiB", progress=False)
    reference = shard_bytes(tmp_path / "reference")
    shutil.copytree(tmp_path / "reference", tmp_path / "out")
    group_0 = [shard for shard in reference if shard < 10**6]
    assert len(group_0) >= 2
    removed = [group_0[-1], *(shard for shard in reference if 3 * 10**6 <= shard < 4 * 10**6)]
    for shard in removed:
        (tmp_path / "out" / "shards" / shard_file_name(shard)).unlink()
    (tmp_path / "out" / "shards.index").unlink()  # as if those commits never happened: the index is rebuilt
    with pytest.raises(Exception, match="pass skip_existing=True"):
        tokenize_files([corpus], tmp_path / "out", tokenizer_path, shard_size="4KiB", progress=False)
    summary = tokenize_files(
        [corpus], tmp_path / "out", tokenizer_path, shard_size="4KiB", skip_existing=True, progress=False
    )
    assert summary.shards == tuple(sorted(removed))
    assert len(summary.skipped_files) == 8  # the groups whose last shard was committed
    with TokenStorage(tmp_path / "out").sync_reader() as reader:
        expected_documents = sum(shard.record_count for shard in reader.shards if shard.id in removed)
    assert summary.documents == expected_documents
    assert shard_bytes(tmp_path / "out") == reference


def test_a_killed_run_finishes_with_skip_existing(tmp_path: Path, tokenizer_path: Path) -> None:
    """SIGKILL the command and its workers once a shard is committed; the rerun completes the same storage."""
    corpus = corpus_of_groups(tmp_path / "corpus", files=30)
    options = ["--tokenizer", tokenizer_path, "--shard-size", "4KiB", "--workers", "2"]
    tokenize_files([corpus], tmp_path / "reference", tokenizer_path, shard_size="4KiB", workers=1, progress=False)
    reference = shard_bytes(tmp_path / "reference")
    output = tmp_path / "out"
    process = subprocess.Popen(tokenize_cli(corpus, output, *options), env=child_environment(), start_new_session=True)
    deadline = time.monotonic() + 120
    while not committed_shard_ids(output) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.002)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    left = shard_bytes(output)
    assert 0 < len(left) < len(reference)
    assert all(reference[shard] == data for shard, data in left.items())  # what it committed is whole
    rerun = subprocess.run(tokenize_cli(corpus, output, *options, "--skip-existing"), env=child_environment())
    assert rerun.returncode == 0
    assert shard_bytes(output) == reference
    subprocess.run([sys.executable, "-m", "guideloom", "clean", str(output), "--older-than", "0"], check=True)
    assert not any((output / "incomplete").iterdir())


def test_skip_existing_on_a_finished_run_writes_nothing(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = corpus_of_groups(tmp_path / "corpus")
    tokenize_files([corpus], tmp_path / "out", tokenizer_path, shard_size="4KiB", progress=False)
    before = shard_bytes(tmp_path / "out")
    summary = tokenize_files(
        [corpus], tmp_path / "out", tokenizer_path, shard_size="4KiB", skip_existing=True, progress=False
    )
    assert (summary.shards, summary.documents, len(summary.skipped_files)) == ((), 0, 10)
    assert shard_bytes(tmp_path / "out") == before


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4096", 4096), ("64MiB", 64 << 20), ("1GiB", 1 << 30), ("1g", 1 << 30), ("500MB", 500_000_000), ("1.5KiB", 1536)],
)
def test_shard_sizes_are_read_with_their_units(value: str, expected: int) -> None:
    assert parse_shard_size(value, "--shard-size") == expected


@pytest.mark.parametrize("value", ["0", "-1", "lots", "12 parsecs", "1.5.2MiB"])
def test_a_bad_shard_size_exits_2(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", ["one"])
    with pytest.raises(SystemExit) as exit_info:
        cli(["tokenize", str(source), str(tmp_path / "out"), "--tokenizer", str(tokenizer_path), "--shard-size", value])
    assert exit_info.value.code == 2
    assert "guideloom tokenize: error: argument --shard-size: must be" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_python_api_names_shard_size(tmp_path: Path, tokenizer_path: Path) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", ["one"])
    with pytest.raises(TypeError, match="shard_size must be an int"):
        tokenize_files([source], tmp_path / "out", tokenizer_path, shard_size=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shard_size must be at least 1 byte, got 0"):
        tokenize_files([source], tmp_path / "out", tokenizer_path, shard_size=0)
    assert not (tmp_path / "out").exists()
