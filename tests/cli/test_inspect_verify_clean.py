"""The ``guideloom`` command: inspect, verify, clean; exit statuses and messages."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path

import pytest

import guideloom
import guideloom.tokenize
from guideloom import DocumentPickleFormat, DocumentStorage, TokenStorage
from guideloom._cli import main

PUBLIC_ERRORS = [
    *(getattr(guideloom, name) for name in guideloom.__all__ if name.endswith("Error")),
    guideloom.tokenize.TokenizeInputError,
    guideloom.tokenize.TokenizeWorkerDied,
]


def token_storage(path: Path) -> Path:
    with TokenStorage(path, "uint16").sync_writer() as writer:
        writer.append(0, [1, 2, 3])
        writer.append(0, [])
        writer.append(5, list(range(1000)))
        writer.append(9, [4])
    return path


def document_storage(path: Path) -> Path:
    with DocumentStorage(path, DocumentPickleFormat()).sync_writer() as writer:
        writer.append(0, {"a": 1})
        writer.append(1, {"b": 2})
    return path


def flip_bit(path: Path, shard: int) -> None:
    file = path / "shards" / f"{shard:012d}.shard"
    data = bytearray(file.read_bytes())
    data[0] ^= 0x04  # the first data byte
    file.write_bytes(bytes(data))


def fields(output: str) -> dict[str, str]:
    """``key: value`` lines of the output."""
    found = {}
    for line in output.splitlines():
        key, separator, value = line.partition(":")
        if separator and not line.startswith(" "):
            found[key.strip()] = value.strip()
    return found


def shard_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in (path / "shards").iterdir())


def test_inspect_tokens(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_storage(storage_path)
    assert main(["inspect", str(storage_path)]) == 0
    shown = fields(capsys.readouterr().out)
    assert shown["kind"] == "tokens"
    assert shown["dtype"] == "uint16"
    assert shown["shards"] == "3"
    assert shown["documents"] == "4"
    assert shown["tokens"] == "1,004"
    assert shown["bytes"] == f"{shard_bytes(storage_path):,}"
    assert "format" not in shown


def test_inspect_documents(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document_storage(storage_path)
    assert main(["inspect", str(storage_path)]) == 0
    shown = fields(capsys.readouterr().out)
    assert shown["kind"] == "documents"
    assert shown["format"] == "pickle"
    assert shown["shards"] == "2"
    assert shown["records"] == "2"
    assert shown["bytes"] == f"{shard_bytes(storage_path):,}"
    assert "dtype" not in shown


def test_inspect_lists_shards_in_aligned_columns(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_storage(storage_path)
    assert main(["inspect", "--shards", str(storage_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:8] == [
        f"path:       {storage_path}",
        "kind:       tokens",
        "dtype:      uint16",
        "layout:     version 1",
        "shards:     3",
        "documents:  4",  # the same word as in the shard lines
        "tokens:     1,004",
        f"bytes:      {shard_bytes(storage_path):,}",
    ]
    assert lines[8:] == [
        "  shard  documents  tokens  data bytes",
        "      0          2       3           6",
        "      5          1   1,000       2,000",
        "      9          1       1           2",
    ]


def test_inspect_documents_says_records_everywhere(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document_storage(storage_path)
    assert main(["inspect", "--shards", str(storage_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "records:    2" in lines
    assert lines[-3][2:].split() == ["shard", "records", "data", "bytes"]
    assert not any("document" in line for line in lines if not line.startswith(("kind:", "path:")))


def test_inspect_mentions_leftovers(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_storage(storage_path)
    (storage_path / "incomplete" / "dead.partial").write_bytes(b"x" * 1234)
    assert main(["inspect", str(storage_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "incomplete: 1 file, 1,234 bytes left by writers that died or are still writing "
        f"('guideloom clean {storage_path}' removes the ones untouched for an hour)"
    )


def test_inspect_without_leftovers_says_nothing_of_them(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_storage(storage_path)
    assert main(["inspect", str(storage_path)]) == 0
    assert "incomplete" not in capsys.readouterr().out


def test_inspect_a_file_says_it_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a"}\n')
    assert main(["inspect", str(corpus)]) == 2
    assert capsys.readouterr().err == (
        f"guideloom inspect: error: no storage at {corpus}: it is a file, not a storage directory\n"
    )


def test_inspect_missing_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "no storage" in capsys.readouterr().err


def test_verify_good_storage_exits_0(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_storage(storage_path)
    assert main(["verify", str(storage_path)]) == 0
    assert capsys.readouterr().out.startswith("ok: 3 shards")


def test_verify_one_shard_says_one_shard(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with TokenStorage(storage_path, "uint16").sync_writer() as writer:
        writer.append(0, [1])
    assert main(["verify", str(storage_path)]) == 0
    assert capsys.readouterr().out == "ok: 1 shard, 2 data bytes verified\n"


def test_verify_flipped_bit_exits_1_naming_the_shard(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_storage(storage_path)
    flip_bit(storage_path, 5)
    assert main(["verify", str(storage_path)]) == 1
    captured = capsys.readouterr()
    assert "shard 5" in captured.out
    assert "shard 0" not in captured.out
    assert "1 of 3 shards failed" in captured.err


def test_verify_missing_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert main(["verify", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "no storage" in err
    assert str(missing) in err


def test_verify_damaged_header_exits_2(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_storage(storage_path)
    (storage_path / "guideloom.json").write_text("{not json")
    assert main(["verify", str(storage_path)]) == 2
    assert "guideloom.json" in capsys.readouterr().err


def test_clean_removes_only_old_leftovers(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document_storage(storage_path)
    old, fresh = storage_path / "incomplete" / "old.partial", storage_path / "incomplete" / "fresh.partial"
    old.write_bytes(b"x")
    fresh.write_bytes(b"y")
    an_hour_ago = time.time() - 7200
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert main(["clean", str(storage_path), "--older-than", "60"]) == 0
    assert capsys.readouterr().out == "removed 1 leftover file\n"
    assert sorted(os.listdir(storage_path / "incomplete")) == ["fresh.partial"]
    assert main(["verify", str(storage_path)]) == 0


def test_clean_default_age_keeps_fresh_files(storage_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document_storage(storage_path)
    (storage_path / "incomplete" / "live.partial").write_bytes(b"x")
    assert main(["clean", str(storage_path)]) == 0
    assert os.listdir(storage_path / "incomplete") == ["live.partial"]


@pytest.mark.parametrize("age", ["-5", "nan", "soon"])
def test_clean_refuses_an_age_that_is_not_seconds(
    storage_path: Path, capsys: pytest.CaptureFixture[str], age: str
) -> None:
    document_storage(storage_path)
    (storage_path / "incomplete" / "live.partial").write_bytes(b"x")
    with pytest.raises(SystemExit) as exit_info:
        main(["clean", str(storage_path), "--older-than", age])
    assert exit_info.value.code == 2
    expected = f"got {age}" if age != "soon" else "got 'soon'"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"guideloom clean: error: argument --older-than: must be a number of seconds{', 0 or more' * (age != 'soon')}, "
        + expected
    )
    assert os.listdir(storage_path / "incomplete") == ["live.partial"]


@pytest.mark.parametrize("error_class", PUBLIC_ERRORS)
def test_errors_are_named_by_their_public_module(error_class: type[Exception]) -> None:
    module = "guideloom.tokenize" if error_class.__name__.startswith("Tokenize") else "guideloom"
    error = error_class("what went wrong")
    shown = "".join(traceback.format_exception_only(error))
    assert shown == f"{module}.{error_class.__name__}: what went wrong\n"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is error_class and copy.args == ("what went wrong",)


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_python_dash_m_guideloom(storage_path: Path) -> None:
    token_storage(storage_path)
    flip_bit(storage_path, 9)
    completed = run([sys.executable, "-m", "guideloom", "verify", "--quiet", str(storage_path)])
    assert completed.returncode == 1, completed.stderr
    assert "shard 9" in completed.stdout


def test_console_script(storage_path: Path) -> None:
    script = Path(sysconfig.get_path("scripts")) / "guideloom"
    if not script.exists():
        pytest.skip("the guideloom console script is not installed in this environment")
    document_storage(storage_path)
    completed = run([str(script), "inspect", str(storage_path)])
    assert completed.returncode == 0, completed.stderr
    assert fields(completed.stdout)["format"] == "pickle"


def test_inspect_verify_and_clean_read_a_file_url_as_the_local_storage(
    storage_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{token_storage(storage_path)}"
    assert main(["inspect", url]) == 0
    assert fields(capsys.readouterr().out)["path"] == str(storage_path)
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out == "ok: 3 shards, 2,008 data bytes verified\n"
    assert main(["clean", url]) == 0
    assert capsys.readouterr().out == "removed 0 leftover files\n"


def test_an_empty_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", ""]) == 2
    assert capsys.readouterr().err == "guideloom inspect: error: path must not be empty\n"


def test_tokenize_writes_a_file_url_output_to_its_local_path(tmp_path: Path) -> None:
    tokenizer = guideloom.tokenize.train_tokenizer(["one two three", "four five"] * 20, 260, tmp_path / "tok.json")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one two\nthree four five\n")
    output = tmp_path / "tokens"
    assert main(["tokenize", str(corpus), f"file://{output}", "--tokenizer", str(tokenizer), "--quiet"]) == 0
    assert TokenStorage(output).committed_shards() == [0]


@pytest.mark.parametrize(
    ("blank", "message"),
    [
        (0, "inputs hold an empty path (it would mean the current directory)"),
        (1, "OUTPUT must not be empty"),
        (3, "--tokenizer must not be empty"),
    ],
)
def test_tokenize_refuses_an_empty_path_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], blank: int, message: str
) -> None:
    monkeypatch.chdir(tmp_path)  # an empty path must not stand for this folder and its files
    Path("corpus.txt").write_text("one two\n")
    tokenizer = guideloom.tokenize.train_tokenizer(["one two three", "four five"] * 20, 260, tmp_path / "tok.json")
    arguments = ["corpus.txt", "tokens", "--tokenizer", str(tokenizer)]
    arguments[blank] = ""
    assert main(["tokenize", *arguments]) == 2
    assert capsys.readouterr().err == f"guideloom tokenize: error: {message}\n"
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "tok.json"]


def test_tokenize_says_one_empty_input_file_in_the_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = guideloom.tokenize.train_tokenizer(["one two three", "four five"] * 20, 260, tmp_path / "tok.json")
    (tmp_path / "empty.txt").write_text("")
    assert main(["tokenize", str(tmp_path / "empty.txt"), str(tmp_path / "out"), "--tokenizer", str(tokenizer)]) == 2
    message = "the inputs hold no documents: the input file is empty"
    assert capsys.readouterr().err == f"guideloom tokenize: error: {message}\n"


def test_tokenize_names_storage_options_for_a_local_output_as_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = guideloom.tokenize.train_tokenizer(["one two three", "four five"] * 20, 260, tmp_path / "tok.json")
    (tmp_path / "corpus.txt").write_text("one two\n")
    output = tmp_path / "tokens"
    arguments = [str(tmp_path / "corpus.txt"), str(output), "--tokenizer", str(tokenizer)]
    assert main(["tokenize", *arguments, "--storage-options", '{"anon": true}']) == 2
    assert capsys.readouterr().err == (
        f"guideloom tokenize: error: --storage-options apply to URLs only, but the output {output} is a local path\n"
    )
