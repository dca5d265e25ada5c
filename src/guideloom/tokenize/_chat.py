"""Conversations as the documents of a tokenize run (``--chat``): rows with a ``messages`` field.

A row of a JSONL or Parquet input holds one conversation in its ``messages`` field: a non-empty list of
``{"role": str, "content": str}`` messages (more keys are passed on to the template). Each becomes one
document of a masked token storage: the chat template's tokens, and a mask marking the assistant's turns
(see ``_chat_template``). A malformed conversation, or one the template fails on or cannot split into
turns, is a :class:`TokenizeInputError` naming the file and the row (1-based, as an editor numbers a
JSONL line; Parquet rows are counted the same way).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._core.errors import TokenizeInputError
from guideloom.tokenize._chat_template import ChatEncoder, Messages, TurnSplitError
from guideloom.tokenize._inputs import InputFile, describe_input, jsonl_values, parquet_values

MESSAGES_FIELD = "messages"


@dataclass(frozen=True)
class Conversation:
    """One row's checked messages and where the row is."""

    messages: Messages
    row: int


def where(file: InputFile, row: int) -> str:
    """A row as messages name it: ``path:line`` for JSONL, ``path: row N`` for Parquet."""
    return f"{file.path}:{row}" if file.kind == "jsonl" else f"{file.path}: row {row}"


def describe_chat_input(path: Path) -> InputFile:
    """Check one input of conversations before anything is written: a JSONL or Parquet file (with the column)."""
    file = describe_input(path, MESSAGES_FIELD)
    if file.kind == "text":
        raise TokenizeInputError(
            f"{path}: conversations are read from the {MESSAGES_FIELD!r} field of JSON Lines (.jsonl) or Parquet "
            "(.parquet) rows, not from text files"
        )
    return file


def _what(value: object) -> str:
    return "null" if value is None else type(value).__name__


def check_messages(value: object, place: str) -> Messages:
    """``value`` as a conversation: a non-empty list of messages with a string role and content."""
    if not isinstance(value, list | tuple):
        raise TokenizeInputError(f"{place}: field {MESSAGES_FIELD!r} holds {_what(value)}, not a list of messages")
    if not value:
        raise TokenizeInputError(f"{place}: field {MESSAGES_FIELD!r} is an empty list: a conversation needs messages")
    messages = []
    for number, message in enumerate(value, 1):
        if not isinstance(message, dict):
            raise TokenizeInputError(
                f"{place}: message {number} is {_what(message)}, not an object with 'role' and 'content'"
            )
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                found = "no" if key not in message else f"a {_what(message[key])}"
                raise TokenizeInputError(f"{place}: message {number} has {found} {key!r}, not a string")
        if not message["role"]:
            raise TokenizeInputError(f"{place}: message {number} has an empty 'role'")
        messages.append(message)
    return messages


def iter_conversations(file: InputFile) -> Iterator[tuple[Conversation, int, int]]:
    """``(conversation, characters of its contents, bytes read so far)`` for every row of one input."""
    values = jsonl_values(file, MESSAGES_FIELD) if file.kind == "jsonl" else parquet_values(file, MESSAGES_FIELD)
    for value, row, position in values:
        messages = check_messages(value, where(file, row))
        yield Conversation(messages, row), sum(len(message["content"]) for message in messages), position


class ChatDocuments:
    """What ``tokenize_group`` reads and writes for conversations: rows of messages, tokens with a loss mask."""

    def __init__(self, tokenizer: Any, train_on: str, dtype: np.dtype[Any]) -> None:
        self.encoder = ChatEncoder(tokenizer, train_on)
        self.dtype = dtype

    def documents(self, file: InputFile) -> Iterator[tuple[Conversation, int, int]]:
        return iter_conversations(file)

    def encode(self, file: InputFile, batch: list[Conversation]) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Each conversation's tokens (as stored) and loss mask; a failure names its file and row."""
        try:
            encoded = self.encoder.encode([conversation.messages for conversation in batch])
        except TurnSplitError as error:
            raise TokenizeInputError(f"{where(file, batch[error.index].row)}: {error}") from None
        for conversation in encoded:
            yield np.asarray(conversation.tokens, self.dtype), conversation.loss_mask
