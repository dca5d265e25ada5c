"""The tokenize engine (``guideloom tokenize``): inputs of every kind, parallel shards, clear failures."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")  # the 'tokenize' extra

from guideloom import ShardExistsError, TokenStorage
from guideloom._cli import main as cli
from guideloom._shards.layout import committed_shard_ids
from guideloom.tokenize import TokenizeWorkerDied, load_tokenizer, tokenize_files, train_tokenizer

TOKEN_DTYPES = "uint8, uint16, uint32, uint64, int8, int16, int32, int64"
DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "",
    "Unicode stays intact: naïve café, 東京, emoji 🦊.",
    "Tabs\tand  double  spaces\nand trailing newline\n",
    "x" * 300,
]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return train_tokenizer(DOCUMENTS * 20, 300, path)


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: text, "id": i}) + "\n" for i, text in enumerate(texts)))
    return path


def write_parquet(path: Path, texts: list[str], column: str = "text") -> Path:
    pa = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    parquet.write_table(pa.table({column: texts, "n": list(range(len(texts)))}), path, row_group_size=2)
    return path


def read_back(path: Path, tokenizer_path: Path) -> list[str]:
    tokenizer = load_tokenizer(tokenizer_path)
    eos = tokenizer.token_to_id("<|endoftext|>")
    texts = []
    with TokenStorage(path).sync_reader() as reader:
        for index in range(len(reader)):
            ids = reader.read(index)
            assert ids[-1] == eos  # every document ends with the end-of-text id
            texts.append(tokenizer.decode(ids[:-1].tolist(), skip_special_tokens=False))
    return texts


def assert_nothing_in_progress(path: Path) -> None:
    incomplete = path / "incomplete"
    leftovers = [entry.name for entry in incomplete.iterdir()] if incomplete.exists() else []
    assert leftovers == [], leftovers


def test_jsonl_parquet_and_text_in_parallel(tmp_path: Path, tokenizer_path: Path) -> None:
    inputs = [
        write_jsonl(tmp_path / "a.jsonl", DOCUMENTS[:3]),
        write_parquet(tmp_path / "b.parquet", DOCUMENTS[3:]),
        tmp_path / "c.txt",
        tmp_path / "d.md",
    ]
    inputs[2].write_text(DOCUMENTS[0] + "\n\n" + DOCUMENTS[1])  # a text file is ONE document
    inputs[3].write_text(DOCUMENTS[3])
    output = tmp_path / "tokens"

    # 64 bytes: every file is a group of its own (each holds at least 64 bytes), cut into several shards
    summary = tokenize_files(list(reversed(inputs)), output, tokenizer_path, workers=2, progress=False, shard_size=64)

    expected = [*DOCUMENTS, DOCUMENTS[0] + "\n\n" + DOCUMENTS[1], DOCUMENTS[3]]  # sorted input order
    assert read_back(output, tokenizer_path) == expected
    assert summary.files == 4 and summary.documents == len(expected) and summary.groups == 4
    assert summary.shards == tuple(committed_shard_ids(output))
    assert {shard // 10**6 for shard in summary.shards} == {0, 1, 2, 3}  # group g writes shards g * 10**6 + k
    assert summary.dtype == "uint16" and TokenStorage(output).dtype == np.uint16
    with TokenStorage(output).sync_reader() as reader:
        assert summary.tokens == reader.token_count == sum(len(reader.read(i)) for i in range(len(reader)))
    assert summary.tokens_per_second > 0 and summary.processes == 2
    assert_nothing_in_progress(output)

    # one worker (no processes) writes exactly the same storage
    one = tokenize_files(inputs, tmp_path / "one", tokenizer_path, workers=1, progress=False, shard_size=64)
    assert one.processes == 0 and committed_shard_ids(tmp_path / "one") == committed_shard_ids(output)
    with TokenStorage(output).sync_reader() as many, TokenStorage(tmp_path / "one").sync_reader() as alone:
        assert alone.fingerprint == many.fingerprint
        assert np.array_equal(alone.read_tokens(0, alone.token_count), many.read_tokens(0, many.token_count))


def test_text_field_and_no_eos(tmp_path: Path, tokenizer_path: Path) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS, field="body")
    summary = tokenize_files([source], tmp_path / "out", tokenizer_path, text_field="body", eos_token=None)
    tokenizer = load_tokenizer(tokenizer_path)
    with TokenStorage(tmp_path / "out").sync_reader() as reader:
        assert [tokenizer.decode(reader.read(i).tolist()) for i in range(len(reader))] == DOCUMENTS
    assert summary.eos_id is None
    assert summary.processes == 0  # workers=None: small inputs are tokenized in this process
    assert summary.tokens == sum(len(tokenizer.encode(text, add_special_tokens=False).ids) for text in DOCUMENTS)


@pytest.mark.parametrize("workers", [1, 2])
def test_missing_field_names_file_and_line(tmp_path: Path, tokenizer_path: Path, workers: int) -> None:
    good = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "fine too"}\n{"body": "where is text?"}\n')
    output = tmp_path / "out"
    size = good.stat().st_size  # each file a group of its own, each group one shard
    with pytest.raises(ValueError, match=r"b\.jsonl:3: no field 'text' \(fields: body\)"):
        tokenize_files([good, bad], output, tokenizer_path, workers=workers, progress=False, shard_size=size)
    committed = committed_shard_ids(output)
    assert 10**6 not in committed  # the failed file's shard was not committed
    if workers == 1:
        assert committed == [0]  # groups are done in order: the one before the failure is committed
    assert_nothing_in_progress(output)
    if committed:  # with 2 workers the failing group may stop the run before the other created the storage
        with TokenStorage(output).sync_reader() as reader:  # what was committed is whole
            assert len(reader) == len(DOCUMENTS) * len(committed)

    # fix the input and finish the run: only the missing shards are written
    bad.write_text('{"text": "fine"}\n')
    if committed:
        with pytest.raises(ShardExistsError, match=r"pass skip_existing=True to finish"):
            tokenize_files([good, bad], output, tokenizer_path, progress=False, shard_size=size)
    summary = tokenize_files(
        [good, bad], output, tokenizer_path, workers=1, progress=False, skip_existing=True, shard_size=size
    )
    assert committed_shard_ids(output) == [0, 10**6]
    assert summary.shards == tuple(sorted({0, 10**6} - set(committed)))
    assert read_back(output, tokenizer_path) == [*DOCUMENTS, "fine"]


@pytest.mark.parametrize(
    "content, match",
    [
        (b'{"text": "ok"}\nnot json\n', r"bad\.jsonl:2: not valid JSON"),
        (b'{"text": "ok"}\n[1, 2]\n', r"bad\.jsonl:2: a JSON object was expected"),
        (b'{"text": 7}\n', r"bad\.jsonl:1: field 'text' holds int, not a string"),
    ],
)
def test_bad_jsonl_lines(tmp_path: Path, tokenizer_path: Path, content: bytes, match: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        tokenize_files([bad], tmp_path / "out", tokenizer_path, progress=False)
    assert committed_shard_ids(tmp_path / "out") == []
    assert_nothing_in_progress(tmp_path / "out")


def test_text_that_is_not_utf8(tmp_path: Path, tokenizer_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt: not UTF-8 text"):
        tokenize_files([bad], tmp_path / "out", tokenizer_path, progress=False)
    assert committed_shard_ids(tmp_path / "out") == []


def test_errors_found_before_anything_is_written(tmp_path: Path, tokenizer_path: Path) -> None:
    good = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    output = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=r"input file not found: .*missing\.jsonl"):
        tokenize_files([good, tmp_path / "missing.jsonl"], output, tokenizer_path)
    (tmp_path / "broken.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(ValueError, match=r"broken\.parquet: not a readable Parquet file"):
        tokenize_files([good, tmp_path / "broken.parquet"], output, tokenizer_path)
    write_parquet(tmp_path / "other.parquet", ["a"], column="body")
    with pytest.raises(ValueError, match=r"other\.parquet: no column 'text' \(columns: body, n\)"):
        tokenize_files([good, tmp_path / "other.parquet"], output, tokenizer_path)
    (tmp_path / "a.jsonl.gz").write_text('{"text": "not compressed"}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl\.gz: the name says gzip but the file does not hold gzip data"):
        tokenize_files([good, tmp_path / "a.jsonl.gz"], output, tokenizer_path)
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        tokenize_files([good], output, tmp_path / "nope.json")
    with pytest.raises(ValueError, match="more than once"):
        tokenize_files([good, good], output, tokenizer_path)
    with pytest.raises(ValueError, match="cannot hold"):
        tokenize_files([good], output, tokenizer_path, dtype="uint8")
    with pytest.raises(ValueError, match="inputs is empty"):
        tokenize_files([], output, tokenizer_path)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        tokenize_files([good], tmp_path / "a-file", tokenizer_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="non-empty directory that holds no guideloom storage"):
        tokenize_files([good], tmp_path / "other", tokenizer_path)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]
    assert not output.exists()  # none of these wrote anything


def test_unreadable_file(tmp_path: Path, tokenizer_path: Path) -> None:
    """In a child process without the capabilities that let root read any file."""
    locked = write_jsonl(tmp_path / "locked.jsonl", DOCUMENTS)
    locked.chmod(0)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from guideloom.tokenize import tokenize_files\n"
        "try:\n"
        f"    tokenize_files([Path({str(locked)!r})], Path({str(tmp_path / 'out')!r}), Path({str(tokenizer_path)!r}))\n"
        "except PermissionError as error:\n"
        "    print(error)\n"
        "    sys.exit(3)\n"
    )
    unprivileged = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    done = subprocess.run([*unprivileged, sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert re.search(r"cannot read input file .*locked\.jsonl", done.stdout)
    assert not (tmp_path / "out").exists()


def test_empty_inputs(tmp_path: Path, tokenizer_path: Path) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_text("\n\n  \n")
    with pytest.raises(ValueError, match="the inputs hold no documents: the input file is empty"):
        tokenize_files([tmp_path / "empty.txt"], tmp_path / "out", tokenizer_path)
    with pytest.raises(ValueError, match="hold no documents"):
        tokenize_files([tmp_path / "blank.jsonl", tmp_path / "empty.txt"], tmp_path / "out", tokenizer_path, workers=1)
    assert not (tmp_path / "out").exists()
    # an empty file among others is simply no shard
    good = write_jsonl(tmp_path / "z.jsonl", ["one"])
    summary = tokenize_files(
        [tmp_path / "blank.jsonl", good], tmp_path / "out", tokenizer_path, workers=1, progress=False
    )
    assert summary.shards == (0,) and summary.empty_files == (tmp_path / "blank.jsonl",)


def test_existing_output_is_not_overwritten(tmp_path: Path, tokenizer_path: Path) -> None:
    good = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    tokenize_files([good], tmp_path / "out", tokenizer_path, progress=False)
    with pytest.raises(ShardExistsError, match="already holds 1 of the shards"):
        tokenize_files([good], tmp_path / "out", tokenizer_path, progress=False)
    summary = tokenize_files([good], tmp_path / "out", tokenizer_path, skip_existing=True, progress=False)
    assert summary.skipped_files == (good,) and summary.documents == 0


def test_cli(tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    output = tmp_path / "out"
    assert cli(["tokenize", str(source), str(output), "--tokenizer", str(tokenizer_path), "--quiet"]) == 0
    assert f"{len(DOCUMENTS)} documents" in capsys.readouterr().out
    assert read_back(output, tokenizer_path) == DOCUMENTS

    bad = tmp_path / "b.jsonl"
    bad.write_text('{"body": 1}\n')
    assert cli(["tokenize", str(bad), str(tmp_path / "o2"), "--tokenizer", str(tokenizer_path), "--quiet"]) == 1
    error = capsys.readouterr().err
    assert "guideloom tokenize: error:" in error and "b.jsonl:1: no field 'text'" in error


def test_cli_without_tokenizers(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if the package were not installed
    source = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    assert cli(["tokenize", str(source), str(tmp_path / "out"), "--tokenizer", str(tokenizer_path)]) == 2
    assert "pip install 'guideloom[tokenize]'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def tokenize_command(*arguments: object) -> list[str]:
    return ["tokenize", *map(str, arguments), "--quiet"]


def test_cli_mistakes_exit_2_in_the_command_line_words(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    output = tmp_path / "out"
    assert cli(tokenize_command(source, output, "--tokenizer", tmp_path)) == 2
    assert capsys.readouterr().err == (
        f"guideloom tokenize: error: --tokenizer {tmp_path} is a directory, not a tokenizer.json file\n"
    )
    assert cli(tokenize_command(source, output, "--tokenizer", tokenizer_path, "--eos-token", "<nope>")) == 2
    assert capsys.readouterr().err == (
        "guideloom tokenize: error: --eos-token '<nope>' is not in the tokenizer's vocabulary\n"
    )
    assert cli(tokenize_command(source, output, "--tokenizer", tokenizer_path, "--text-field", "")) == 2
    assert capsys.readouterr().err == "guideloom tokenize: error: --text-field must be a non-empty string, got ''\n"
    assert not output.exists()


def test_cli_names_the_directory_holding_the_tokenizer(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    assert cli(tokenize_command(source, tmp_path / "out", "--tokenizer", tokenizer_path.parent)) == 2
    assert capsys.readouterr().err == (
        f"guideloom tokenize: error: --tokenizer {tokenizer_path.parent} is a directory, not a tokenizer.json "
        f"file; did you mean {tokenizer_path}?\n"
    )


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--workers", "0", "must be a positive integer, got 0"),
        ("--workers", "-1", "must be a positive integer, got -1"),
        ("--workers", "two", "must be a positive integer, got 'two'"),
        ("--dtype", "float32", f"float32 is not a token dtype; use one of {TOKEN_DTYPES}"),
        ("--dtype", "unit16", f"unit16 is not a token dtype; use one of {TOKEN_DTYPES}"),
    ],
)
def test_cli_option_values_are_checked_by_the_command_line(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    with pytest.raises(SystemExit) as exit_info:
        cli(tokenize_command(source, tmp_path / "out", "--tokenizer", tokenizer_path, option, value))
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"guideloom tokenize: error: argument {option}: {message}"


def test_api_dtype_must_be_a_token_dtype(tmp_path: Path, tokenizer_path: Path) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    with pytest.raises(ValueError) as raised:
        tokenize_files([source], tmp_path / "out", tokenizer_path, dtype="float32")
    assert str(raised.value) == f"dtype float32 is not a token dtype; use one of {TOKEN_DTYPES}"


def test_cli_existing_shards_exit_2_and_name_the_option(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    output = tmp_path / "out"
    assert cli(tokenize_command(source, output, "--tokenizer", tokenizer_path)) == 0
    capsys.readouterr()
    assert cli(tokenize_command(source, output, "--tokenizer", tokenizer_path)) == 2
    assert capsys.readouterr().err == (
        f"guideloom tokenize: error: {output} already holds 1 of the shards to write (first: shard 0 for "
        f"{source}); write to a new directory, or pass --skip-existing to finish an interrupted run with the "
        "same inputs and options\n"
    )
    assert cli(tokenize_command(source, output, "--tokenizer", tokenizer_path, "--skip-existing")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 input file skipped: its shards already existed"


def test_cli_failed_input_exits_1_and_says_how_to_finish(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": 1}\n')
    size = str(good.stat().st_size)  # two groups: the good file's shard is committed before the failure
    command = tokenize_command(good, bad, tmp_path / "out", "--tokenizer", tokenizer_path, "--shard-size", size)
    assert cli([*command, "--workers", "1"]) == 1
    assert capsys.readouterr().err == (
        f"guideloom tokenize: error: {bad}:2: no field 'text' (fields: body)\n"
        "1 shard was committed before the failure (the shard in progress was not); fix the input and "
        "rerun with --skip-existing to write the rest\n"
    )


def test_cli_zstd_input_without_zstandard_exits_2(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import zstandard

    source = tmp_path / "a.jsonl.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "a"}\n'))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if the package were not installed
    assert cli(tokenize_command(source, tmp_path / "out", "--tokenizer", tokenizer_path)) == 2
    assert capsys.readouterr().err == (
        "guideloom tokenize: error: reading zstd-compressed input needs the zstandard package: "
        "pip install 'guideloom[tokenize]'\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_worker_that_dies_is_reported(tmp_path: Path, tokenizer_path: Path) -> None:
    """SIGKILL the first worker process as soon as it exists: the run says so; --skip-existing finishes it."""
    inputs = [write_jsonl(tmp_path / f"{name}.jsonl", DOCUMENTS * 50) for name in "ab"]
    killed: list[int] = []

    def kill_a_worker() -> None:
        while not killed:
            children = multiprocessing.active_children()
            if children:
                os.kill(children[0].pid or 0, signal.SIGKILL)
                killed.append(children[0].pid or 0)
            time.sleep(0.001)

    killer = threading.Thread(target=kill_a_worker)
    killer.start()
    try:
        with pytest.raises(TokenizeWorkerDied, match=r"a tokenize worker process died \(killed by SIGKILL\)"):
            tokenize_files(inputs, tmp_path / "out", tokenizer_path, workers=2, progress=False, shard_size=1000)
    finally:
        killed.append(0)
        killer.join()
    tokenize_files(
        inputs, tmp_path / "out", tokenizer_path, workers=2, progress=False, shard_size=1000, skip_existing=True
    )
    tokenize_files(inputs, tmp_path / "reference", tokenizer_path, workers=1, progress=False, shard_size=1000)
    assert committed_shard_ids(tmp_path / "out") == committed_shard_ids(tmp_path / "reference")
    assert read_back(tmp_path / "out", tokenizer_path) == read_back(tmp_path / "reference", tokenizer_path)
