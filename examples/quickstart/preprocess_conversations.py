"""Quick-start, documents: store tokenized conversations as whole records in a DocumentStorage.

Each conversation stays one sample (never concatenated or padded on disk). The
script writes the same conversations twice, to compare the two ways of encoding
records:

* ``OUTPUT/msgpack``: ``DocumentMsgpackFormat``, records as plain dicts;
* ``OUTPUT/struct``: ``ConversationFormat`` from ``conversation_format.py``, a fixed
  binary layout decoded with ``np.frombuffer`` into zero-copy views. Training code
  imports the same module, so both sides agree on the layout.

Input: ``--input`` JSON Lines files in the usual chat layout,
``{"messages": [{"role": "user", "content": "..."}, ...]}`` (roles: system, user,
assistant), one shard per file. Without ``--input`` the conversations are made up
offline from the standard library's docstrings ("What does json.dumps do?" →
the docstring's first paragraph), one shard per module. The end-of-text id, if
the tokenizer has one, ends every message. The tokenizer is ``--tokenizer``
(default: the one ``preprocess.py`` saved), else a byte-level BPE trained here.

Finally the script reads both storages back, checks they agree, and runs a few
batches through ``StatefulDataLoader`` with the shared ``collate``, as training would.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from conversation_format import ROLES, Conversation, ConversationFormat, collate, from_msgpack
from preprocess import stdlib_files

from guideloom import DocumentMsgpackFormat, DocumentStorage, StatefulDataLoader
from guideloom.tokenize import find_eos_id, load_tokenizer, train_tokenizer

SYSTEM = "You answer questions about the Python standard library."
QUESTIONS_PER_CONVERSATION = 3

TextMessages = list[dict[str, str]]


def stdlib_conversations(files: list[Path]) -> Iterator[tuple[int, TextMessages]]:
    """(shard, messages) made from the docstrings of each module's public functions and classes."""
    for shard, path in enumerate(files):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue
        module = path.stem
        pairs = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                docstring = ast.get_docstring(node)
                if docstring:
                    answer = docstring.split("\n\n")[0].strip()
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    pairs.append((f"What does the {kind} {module}.{node.name} do?", answer))
        for start in range(0, len(pairs), QUESTIONS_PER_CONVERSATION):
            messages = [{"role": "system", "content": SYSTEM}]
            for question, answer in pairs[start : start + QUESTIONS_PER_CONVERSATION]:
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            yield shard, messages


def jsonl_conversations(files: list[Path]) -> Iterator[tuple[int, TextMessages]]:
    """(shard, messages) from chat-format JSON Lines files; errors name the file and line."""
    for shard, path in enumerate(sorted(files)):
        with open(path, encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                record = json.loads(line)
                messages = record.get("messages") if isinstance(record, dict) else None
                if not isinstance(messages, list) or not all(
                    isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
                    for m in messages
                ):
                    raise ValueError(
                        f"{path}:{number}: expected {{'messages': [{{'role': one of {ROLES}, 'content': str}}]}}"
                    )
                yield shard, messages


def tokenize(tokenizer: Any, eos_id: int | None, conversation_id: int, messages: TextMessages) -> Conversation:
    encodings = tokenizer.encode_batch([message["content"] for message in messages], add_special_tokens=False)
    end = [] if eos_id is None else [eos_id]
    return {
        "conversation_id": conversation_id,
        "messages": [
            {"role": message["role"], "tokens": encoding.ids + end}
            for message, encoding in zip(messages, encodings, strict=True)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("runs/quickstart/conversations"))
    parser.add_argument("--input", type=Path, nargs="+", help="chat-format .jsonl files (default: stdlib docstrings)")
    parser.add_argument("--max-files", type=int, default=100, help="stdlib modules to use (default input only)")
    parser.add_argument("--tokenizer", type=Path, default=Path("runs/quickstart/data/tokenizer.json"))
    parser.add_argument("--vocab-size", type=int, default=2048, help="if a tokenizer has to be trained")
    arguments = parser.parse_args(argv)

    if arguments.input:
        conversations = list(jsonl_conversations(arguments.input))
    else:
        conversations = list(stdlib_conversations(stdlib_files(arguments.max_files)))
    if not conversations:
        parser.error("no conversations found in the input")
    for storage_name in ("msgpack", "struct"):
        shutil.rmtree(arguments.output / storage_name, ignore_errors=True)
    arguments.output.mkdir(parents=True, exist_ok=True)

    tokenizer_path = arguments.tokenizer
    if not tokenizer_path.is_file():
        tokenizer_path = arguments.output / "tokenizer.json"
        texts = (message["content"] for _, messages in conversations for message in messages)
        train_tokenizer(texts, arguments.vocab_size, tokenizer_path)
        print(f"trained a tokenizer: {tokenizer_path}")
    tokenizer = load_tokenizer(tokenizer_path)
    eos_id = find_eos_id(tokenizer)

    as_msgpack = DocumentStorage(arguments.output / "msgpack", DocumentMsgpackFormat())
    as_struct = DocumentStorage(arguments.output / "struct", ConversationFormat())
    with as_msgpack.sync_writer() as msgpack_writer, as_struct.sync_writer() as struct_writer:
        for conversation_id, (shard, messages) in enumerate(conversations):
            record = tokenize(tokenizer, eos_id, conversation_id, messages)
            msgpack_writer.append(shard, record)
            struct_writer.append(shard, record)

    # Read back: both encodings hold the same conversations.
    with as_msgpack.sync_reader() as msgpack_reader, as_struct.sync_reader() as struct_reader:
        assert len(msgpack_reader) == len(struct_reader) == len(conversations)
        for index in range(len(struct_reader)):
            packed, decoded = from_msgpack(msgpack_reader.read(index)), struct_reader.read(index)
            assert packed["conversation_id"] == decoded["conversation_id"] == index
            for key in ("roles", "lengths", "tokens"):
                assert np.array_equal(packed[key], decoded[key]), (index, key)  # type: ignore[literal-required]
        tokens = sum(int(struct_reader.read(i)["lengths"].sum()) for i in range(len(struct_reader)))
    for name in ("msgpack", "struct"):
        size = sum(file.stat().st_size for file in (arguments.output / name / "shards").iterdir())
        print(f"{name:>8}: {len(conversations):,} conversations, {tokens:,} tokens, {size:,} bytes of shards")

    # The training side: whole conversations per sample, padded in collate, loss on assistant tokens only.
    with StatefulDataLoader.from_storage(
        as_struct,
        functools.partial(collate, max_tokens=256),
        device=torch.device("cpu"),
        local_batch_size=4,
        shuffle=True,
        seed=0,
    ) as loader:
        for number, batch in zip(range(2), loader, strict=False):
            learned = int((batch["labels"] != -100).sum())
            print(
                f"batch {number}: conversations {batch['conversation_ids'].tolist()}, input_ids "
                f"{tuple(batch['input_ids'].shape)}, {learned} assistant tokens to learn"
            )
        print(f"loader state after 2 of {len(loader)} batches: {json.dumps(loader.state_dict())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
