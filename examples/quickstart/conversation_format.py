"""A conversation record format, shared by preprocessing and training (import it from both).

A conversation is a list of messages, each with a role and the token ids of its
text. ``preprocess_conversations.py`` stores conversations twice: with guideloom's
built-in ``DocumentMsgpackFormat`` (records as plain dicts, nothing to write) and
with ``ConversationFormat`` below, a fixed binary layout read back with ``struct``
and ``np.frombuffer`` without copying or pickle::

    header   <QI      conversation id, message count n
    roles    n x u1   index into ROLES, padded with zeros to a multiple of 4 bytes
    lengths  n x <u4  tokens per message
    tokens   <u4      all messages' tokens, back to back

``unpack`` returns NumPy views into the storage's memory map (zero-copy). The
format's ``name`` is recorded in the storage, so the class can move between
modules; the layout itself is this module's responsibility: change it, change
the name (``-v2``).

To train on token ids alone, ``guideloom tokenize --chat`` writes a masked token storage
instead (the chat template's tokens, a loss mask marking the assistant's turns), which packs
into padding-free batches with no format and no collate: see docs/conversations.md.
"""

from __future__ import annotations

import struct
from typing import Any, TypedDict

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from guideloom.types import DocumentStorageFormat

ROLES = ("system", "user", "assistant")
IGNORE_INDEX = -100  # cross_entropy's default ignore_index: no loss on these positions


class Message(TypedDict):
    role: str
    tokens: list[int]


class Conversation(TypedDict):
    conversation_id: int
    messages: list[Message]


class DecodedConversation(TypedDict):
    conversation_id: int
    roles: np.ndarray  # uint8, one per message, index into ROLES
    lengths: np.ndarray  # uint32, tokens per message
    tokens: np.ndarray  # uint32, every message's tokens back to back
    shard: int


class ConversationFormat(DocumentStorageFormat[Conversation, DecodedConversation]):
    """Conversations in a fixed binary layout (see the module docstring)."""

    name = "quickstart-conversation-v1"
    header = struct.Struct("<QI")

    def pack(self, data: Conversation) -> bytes:
        messages = data["messages"]
        try:
            roles = np.array([ROLES.index(message["role"]) for message in messages], dtype="u1")
        except ValueError:
            known = ", ".join(ROLES)
            raise ValueError(f"conversation {data['conversation_id']}: a role is not one of {known}") from None
        lengths = np.array([len(message["tokens"]) for message in messages], dtype="<u4")
        tokens = [np.asarray(message["tokens"], dtype=np.int64) for message in messages]
        joined = np.concatenate(tokens) if tokens else np.empty(0, np.int64)
        if joined.size and (joined.min() < 0 or joined.max() >= 2**32):
            raise ValueError(f"conversation {data['conversation_id']}: token ids must fit uint32")
        padding = bytes(-len(roles) % 4)
        return b"".join(
            (
                self.header.pack(data["conversation_id"], len(messages)),
                roles.tobytes(),
                padding,
                lengths.tobytes(),
                joined.astype("<u4").tobytes(),
            )
        )

    def unpack(self, encoded_data: memoryview, shard: int) -> DecodedConversation:
        conversation_id, count = self.header.unpack_from(encoded_data)
        offset = self.header.size
        roles = np.frombuffer(encoded_data, dtype="u1", count=count, offset=offset)
        offset += count + (-count % 4)
        lengths = np.frombuffer(encoded_data, dtype="<u4", count=count, offset=offset)
        offset += 4 * count
        tokens = np.frombuffer(encoded_data, dtype="<u4", offset=offset)
        return {
            "conversation_id": conversation_id,
            "roles": roles,
            "lengths": lengths,
            "tokens": tokens,
            "shard": shard,
        }


def from_msgpack(record: dict[str, Any], shard: int = -1) -> DecodedConversation:
    """A ``DocumentMsgpackFormat`` record (a plain ``Conversation`` dict) in the decoded shape above."""
    messages = record["messages"]
    tokens = [np.asarray(message["tokens"], dtype=np.uint32) for message in messages]
    return {
        "conversation_id": record["conversation_id"],
        "roles": np.array([ROLES.index(message["role"]) for message in messages], dtype=np.uint8),
        "lengths": np.array([len(t) for t in tokens], dtype=np.uint32),
        "tokens": np.concatenate(tokens) if tokens else np.empty(0, np.uint32),
        "shard": shard,
    }


def training_example(conversation: DecodedConversation, max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and next-token labels; only assistant tokens are learned, the rest is IGNORE_INDEX."""
    tokens = torch.from_numpy(conversation["tokens"][: max_tokens + 1].astype(np.int64))
    owner = np.repeat(conversation["roles"], conversation["lengths"])[: max_tokens + 1]
    labels = tokens.clone()
    labels[torch.from_numpy(owner != ROLES.index("assistant"))] = IGNORE_INDEX
    return tokens[:-1], labels[1:]


def collate(samples: list[DecodedConversation], max_tokens: int = 512, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """A padded batch: ``input_ids``, ``labels`` (IGNORE_INDEX on padding and non-assistant tokens), ``lengths``."""
    examples = [training_example(sample, max_tokens) for sample in samples]
    return {
        "input_ids": pad_sequence([ids for ids, _ in examples], batch_first=True, padding_value=pad_id),
        "labels": pad_sequence([labels for _, labels in examples], batch_first=True, padding_value=IGNORE_INDEX),
        "lengths": torch.tensor([len(ids) for ids, _ in examples]),
        "conversation_ids": torch.tensor([sample["conversation_id"] for sample in samples]),
    }
