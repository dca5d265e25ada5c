"""``guideloom tokenize --chat``: conversations rendered with a chat template into a masked token storage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import FormatMismatchError, TokenStorage
from guideloom._cli import main as cli
from guideloom.tokenize import TokenizeInputError, tokenize_files
from tests.helpers.chat_tokenizers import (
    GENERATION_TEMPLATE,
    LAST_MESSAGE_TEMPLATE,
    PLAIN_TEMPLATE,
    STRICT_TEMPLATE,
    conversation,
    make_chat_tokenizer,
)

CONVERSATIONS = [conversation(number, turns=1 + number % 3, system=number % 2 == 0) for number in range(12)]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tokenizer directories with the same vocabulary: one per template."""
    root = tmp_path_factory.mktemp("chat-tokenizers")
    templates = {
        "generation": GENERATION_TEMPLATE,
        "plain": PLAIN_TEMPLATE,
        "last": LAST_MESSAGE_TEMPLATE,
        "strict": STRICT_TEMPLATE,
    }
    return {name: make_chat_tokenizer(root / name, template) for name, template in templates.items()}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text(
        "".join(json.dumps({"messages": messages, "id": number}) + "\n" for number, messages in enumerate(rows))
    )
    return path


def write_parquet(path: Path, rows: list[Any]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"messages": rows}), path)
    return path


def stored(path: Path) -> list[tuple[list[int], list[int]]]:
    """Every document's tokens and mask, in storage order."""
    with TokenStorage(path).sync_reader() as reader:
        return [(reader.read(i).tolist(), reader.loss_mask(i).astype(int).tolist()) for i in range(len(reader))]


def reference(directory: Path, rows: list[Any]) -> list[tuple[list[int], list[int]]]:
    """What transformers' apply_chat_template gives each conversation: its tokens and its assistant mask."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    encoded = [
        tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        for messages in rows
    ]
    return [(list(out["input_ids"]), list(out["assistant_masks"])) for out in encoded]


def test_generation_blocks_give_transformers_assistant_mask(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    source = write_jsonl(tmp_path / "chats.jsonl", CONVERSATIONS)
    summary = tokenize_files([source], tmp_path / "out", tokenizers["generation"], chat=True, progress=False)
    assert summary.documents == len(CONVERSATIONS) and summary.eos_id is None
    assert stored(tmp_path / "out") == reference(tokenizers["generation"], CONVERSATIONS)


def test_growing_prefixes_mark_exactly_the_assistant_turns(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    source = write_jsonl(tmp_path / "chats.jsonl", CONVERSATIONS)
    tokenize_files([source], tmp_path / "out", tokenizers["plain"], chat=True, progress=False)
    documents = stored(tmp_path / "out")
    # the same text as the template with generation blocks: the same tokens and the same mask
    assert documents == reference(tokenizers["generation"], CONVERSATIONS)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizers["plain"]))
    for (tokens, mask), messages in zip(documents, CONVERSATIONS, strict=True):
        learned = tokenizer.decode([token for token, bit in zip(tokens, mask, strict=True) if bit])
        assert learned == "".join(m["content"] + "<|end|>" for m in messages if m["role"] == "assistant")


def test_jsonl_and_parquet_in_two_workers(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", CONVERSATIONS[:5])
    second = write_parquet(tmp_path / "b.parquet", CONVERSATIONS[5:])
    size = min(first.stat().st_size, second.stat().st_size)  # each file a group of its own
    summary = tokenize_files(
        [second, first], tmp_path / "out", tokenizers["plain"], chat=True, workers=2, progress=False, shard_size=size
    )
    assert summary.processes == 2 and summary.groups == 2
    assert {shard // 10**6 for shard in summary.shards} == {0, 1}  # group g writes shards g * 10**6 + k
    assert stored(tmp_path / "out") == reference(tokenizers["generation"], CONVERSATIONS)


def test_small_conversation_files_share_a_group(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    paths = [write_jsonl(tmp_path / f"{number:02}.jsonl", [row]) for number, row in enumerate(CONVERSATIONS)]
    summary = tokenize_files(paths, tmp_path / "out", tokenizers["plain"], chat=True, progress=False)
    assert summary.groups == 1 and summary.shards == (0,)  # default shard size: one group, one shard
    assert summary.documents == len(CONVERSATIONS)
    assert stored(tmp_path / "out") == reference(tokenizers["generation"], CONVERSATIONS)


def test_a_group_cut_into_shards_resumes_after_its_committed_conversations(
    tmp_path: Path, tokenizers: dict[str, Path]
) -> None:
    good = write_jsonl(tmp_path / "a.jsonl", CONVERSATIONS[:6])
    bad = write_jsonl(tmp_path / "b.jsonl", [*CONVERSATIONS[6:], "oops"])
    size = good.stat().st_size + 1  # both files in one group
    options: dict[str, Any] = {"chat": True, "progress": False, "shard_size": size, "dtype": "uint64"}
    tokens = [len(ids) for ids, _ in reference(tokenizers["generation"], CONVERSATIONS)]
    assert 8 * sum(tokens[:6]) >= size  # uint64 ids: a.jsonl alone fills a shard
    with pytest.raises(TokenizeInputError, match=r"b\.jsonl:7:"):
        tokenize_files([good, bad], tmp_path / "out", tokenizers["plain"], **options)
    committed = TokenStorage(tmp_path / "out").committed_shards()
    assert committed and committed == list(range(len(committed)))  # group 0: shards 0, 1, ...
    with TokenStorage(tmp_path / "out").sync_reader() as reader:
        written = len(reader)
    assert 0 < written < 6  # the group's shard in progress (a.jsonl's last conversations with it) was not committed
    write_jsonl(bad, CONVERSATIONS[6:])
    summary = tokenize_files([good, bad], tmp_path / "out", tokenizers["plain"], skip_existing=True, **options)
    assert summary.groups == 1 and summary.skipped_files == ()
    assert summary.shards and min(summary.shards) == len(committed) and max(summary.shards) < 10**6
    assert summary.documents == len(CONVERSATIONS) - written  # the committed conversations are not written again
    assert stored(tmp_path / "out") == reference(tokenizers["generation"], CONVERSATIONS)


def test_train_on_all_marks_every_token(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    source = write_jsonl(tmp_path / "chats.jsonl", CONVERSATIONS)
    tokenize_files([source], tmp_path / "out", tokenizers["last"], chat=True, train_on="all", progress=False)
    documents = stored(tmp_path / "out")
    assert [tokens for tokens, _ in documents] == [tokens for tokens, _ in reference(tokenizers["last"], CONVERSATIONS)]
    assert all(mask == [1] * len(tokens) for tokens, mask in documents)


def test_a_conversation_that_starts_with_the_assistant(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    rows = [[{"role": "assistant", "content": "Two plus two is four."}, {"role": "user", "content": "Thanks"}]]
    source = write_jsonl(tmp_path / "chats.jsonl", rows)
    tokenize_files([source], tmp_path / "out", tokenizers["plain"], chat=True, progress=False)
    [(tokens, mask)] = stored(tmp_path / "out")
    [(expected_tokens, generation_mask)] = reference(tokenizers["generation"], rows)
    assert tokens == expected_tokens
    header = generation_mask.index(1)  # "<|assistant|>\n": no generation prompt to tell it from the turn
    assert mask[:header] == [1] * header and mask[header:] == generation_mask[header:]


def test_a_template_that_cannot_be_split_names_the_row(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    source = tmp_path / "chats.jsonl"
    source.write_text("\n" + json.dumps({"messages": CONVERSATIONS[0]}) + "\n")  # line 2: a blank line comes first
    with pytest.raises(TokenizeInputError, match=r"chats\.jsonl:2: the conversation cannot be split into turns"):
        tokenize_files([source], tmp_path / "out", tokenizers["last"], chat=True, progress=False)
    assert not (tmp_path / "out" / "shards").exists() or not any((tmp_path / "out" / "shards").iterdir())


def test_a_template_error_names_the_parquet_row(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    twice = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hello?"}]
    source = write_parquet(tmp_path / "chats.parquet", [CONVERSATIONS[1], CONVERSATIONS[3], twice])
    with pytest.raises(TokenizeInputError, match=r"chats\.parquet: row 3: .*Conversation roles must alternate"):
        tokenize_files([source], tmp_path / "out", tokenizers["strict"], chat=True, progress=False)


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ("hello", "field 'messages' holds str, not a list of messages"),
        ([], "field 'messages' is an empty list: a conversation needs messages"),
        ([{"role": "user"}], "message 1 has no 'content', not a string"),
        ([{"role": "user", "content": "Hi"}, {"role": 3, "content": "x"}], "message 2 has a int 'role', not a string"),
        ([{"role": "user", "content": None}], "message 1 has a null 'content', not a string"),
        (["Hi"], "message 1 is str, not an object with 'role' and 'content'"),
        ([{"role": "", "content": "Hi"}], "message 1 has an empty 'role'"),
    ],
)
def test_malformed_messages_name_file_and_line(
    tmp_path: Path, tokenizers: dict[str, Path], messages: object, problem: str
) -> None:
    source = write_jsonl(tmp_path / "chats.jsonl", [CONVERSATIONS[0], CONVERSATIONS[1], messages])
    with pytest.raises(TokenizeInputError) as caught:
        tokenize_files([source], tmp_path / "out", tokenizers["plain"], chat=True, progress=False)
    assert str(caught.value) == f"{source}:3: {problem}"


def test_a_null_parquet_row_is_named(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    source = write_parquet(tmp_path / "chats.parquet", [CONVERSATIONS[0], None])
    with pytest.raises(TokenizeInputError, match=r"chats\.parquet: row 2: field 'messages' holds null"):
        tokenize_files([source], tmp_path / "out", tokenizers["plain"], chat=True, progress=False)


def test_a_failed_file_resumes_with_skip_existing(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    good = write_jsonl(tmp_path / "a.jsonl", CONVERSATIONS[:6])
    bad = write_jsonl(tmp_path / "b.jsonl", [*CONVERSATIONS[6:], "oops"])
    size = good.stat().st_size  # each file a group of its own
    with pytest.raises(TokenizeInputError, match=r"b\.jsonl:7:") as caught:
        tokenize_files([good, bad], tmp_path / "out", tokenizers["plain"], chat=True, progress=False, shard_size=size)
    assert "fix the input and rerun with skip_existing=True" in "".join(caught.value.__notes__)
    assert TokenStorage(tmp_path / "out").committed_shards() == [0]
    write_jsonl(bad, CONVERSATIONS[6:])
    summary = tokenize_files(
        [good, bad],
        tmp_path / "out",
        tokenizers["plain"],
        chat=True,
        skip_existing=True,
        progress=False,
        shard_size=size,
    )
    assert summary.skipped_files == (good,) and summary.shards == (10**6,)
    assert stored(tmp_path / "out") == reference(tokenizers["generation"], CONVERSATIONS)


def test_masked_and_unmasked_storages_are_not_mixed(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    chats = write_jsonl(tmp_path / "chats.jsonl", CONVERSATIONS)
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"text": "Two plus two is four."}) + "\n")
    tokenizer_json = tokenizers["plain"] / "tokenizer.json"
    tokenize_files([text], tmp_path / "text-out", tokenizer_json, progress=False)
    with pytest.raises(FormatMismatchError):
        tokenize_files([chats], tmp_path / "text-out", tokenizers["plain"], chat=True, progress=False)
    tokenize_files([chats], tmp_path / "chat-out", tokenizers["plain"], chat=True, progress=False)
    with pytest.raises(FormatMismatchError):
        tokenize_files([text], tmp_path / "chat-out", tokenizer_json, progress=False, skip_existing=True)


def test_options_that_do_not_apply(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    chats = write_jsonl(tmp_path / "chats.jsonl", CONVERSATIONS)
    with pytest.raises(ValueError, match=r"train_on must be one of assistant, all, got 'user'"):
        tokenize_files([chats], tmp_path / "out", tokenizers["plain"], chat=True, train_on="user", progress=False)
    with pytest.raises(ValueError, match=r"eos_token does not apply to conversations \(chat=True\)"):
        tokenize_files([chats], tmp_path / "out", tokenizers["plain"], chat=True, eos_token=None, progress=False)
    with pytest.raises(ValueError, match="is a file: conversations need a Hugging Face tokenizer directory"):
        tokenize_files([chats], tmp_path / "out", tokenizers["plain"] / "tokenizer.json", chat=True, progress=False)
    text = tmp_path / "notes.txt"
    text.write_text("not a conversation")
    with pytest.raises(TokenizeInputError, match=r"notes\.txt: conversations are read from the 'messages' field"):
        tokenize_files([text], tmp_path / "out", tokenizers["plain"], chat=True, progress=False)
    assert not (tmp_path / "out").exists()


def test_cli(tmp_path: Path, tokenizers: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    source = write_jsonl(tmp_path / "chats.jsonl", CONVERSATIONS)
    output = tmp_path / "out"
    arguments = ["tokenize", "--chat", str(source), str(output), "--tokenizer", str(tokenizers["plain"]), "--quiet"]
    assert cli(arguments) == 0
    out = capsys.readouterr().out
    assert f"{len(CONVERSATIONS)} documents" in out and "loss mask: the assistant's turns" in out
    assert stored(output) == reference(tokenizers["generation"], CONVERSATIONS)
    arguments[3] = str(tmp_path / "all")
    assert cli([*arguments, "--train-on", "all"]) == 0
    assert "loss mask: every token" in capsys.readouterr().out


def test_cli_mistakes_exit_2(tmp_path: Path, tokenizers: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    source = write_jsonl(tmp_path / "chats.jsonl", CONVERSATIONS)
    output = tmp_path / "out"
    directory = str(tokenizers["plain"])
    assert cli(["tokenize", str(source), str(output), "--tokenizer", directory, "--train-on", "all"]) == 2
    assert "--train-on applies to conversations only: add --chat" in capsys.readouterr().err
    assert cli(["tokenize", "--chat", str(source), str(output), "--tokenizer", directory, "--text-field", "x"]) == 2
    assert "--text-field does not apply to conversations (--chat)" in capsys.readouterr().err
    assert cli(["tokenize", str(source), str(output), "--tokenizer", directory]) == 2
    assert "a Hugging Face tokenizer directory is read for conversations: --chat" in capsys.readouterr().err
    assert not output.exists()


def test_storage_holds_one_document_per_conversation_of_the_right_dtype(
    tmp_path: Path, tokenizers: dict[str, Path]
) -> None:
    source = write_jsonl(tmp_path / "chats.jsonl", CONVERSATIONS)
    tokenize_files([source], tmp_path / "out", tokenizers["plain"], chat=True, progress=False)
    storage = TokenStorage(tmp_path / "out")
    assert storage.dtype == np.uint16  # a vocabulary of 320
    with storage.sync_reader() as reader:
        assert len(reader) == len(CONVERSATIONS)
        assert reader.loss_mask(0).dtype == np.bool_
