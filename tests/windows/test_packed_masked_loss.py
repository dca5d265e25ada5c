"""The loss of a packed, masked batch is the assistant-token loss of its conversations, one at a time.

A tiny Llama (random weights, float64) reads batches of ``pack_documents=True`` over a storage written by
``tokenize_files(chat=True)``, padding-free (``position_ids``, no attention mask). The summed cross-entropy
of a batch must equal the sum over its conversations of the loss on their assistant tokens, each run alone
and unpacked, with labels built from transformers' own assistant mask; with the mask ignored it must not.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from guideloom import StatefulDataLoader, TokenStorage
from guideloom.tokenize import tokenize_files
from tests.helpers.chat_tokenizers import GENERATION_TEMPLATE, PLAIN_TEMPLATE, conversation, make_chat_tokenizer

CONVERSATIONS = [conversation(number, turns=1 + number % 4, system=number % 3 != 0) for number in range(14)]
SEQUENCE_LENGTH = 192


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[TokenStorage, Any, list[tuple[list[int], list[int]]]]:
    """The masked storage (tokenized with a template without generation blocks), the model, the references."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("chat-loss")
    source = root / "chats.jsonl"
    source.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in CONVERSATIONS))
    plain = make_chat_tokenizer(root / "plain", PLAIN_TEMPLATE)
    tokenize_files([source], root / "storage", plain, chat=True, progress=False)
    generation = AutoTokenizer.from_pretrained(str(make_chat_tokenizer(root / "generation", GENERATION_TEMPLATE)))
    references = []
    for messages in CONVERSATIONS:
        out = generation.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        references.append((list(out["input_ids"]), list(out["assistant_masks"])))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(generation),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config).double().eval()
    return TokenStorage(root / "storage"), model, references


def summed_loss(model: Any, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None) -> float:
    """Cross-entropy summed over every labelled token (the model predicts token t + 1 at position t)."""
    with torch.no_grad():
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
    return float(
        torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum"
        )
    )


def one_at_a_time(model: Any, tokens: list[int], mask: list[int]) -> float:
    ids = torch.tensor([tokens])
    labels = torch.where(torch.tensor([mask]) == 1, ids, -100)
    return summed_loss(model, ids, labels, None)


def packed_batch(storage: TokenStorage, **mode: Any) -> dict[str, Any]:
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=64, sequence_length=SEQUENCE_LENGTH, pack_documents=True, **mode
    ) as loader:
        assert len(loader) == 1  # one batch holds every row
        return next(iter(loader))


def test_packed_masked_loss_is_the_sum_of_each_conversations_assistant_loss(setup: Any) -> None:
    storage, model, references = setup
    assert max(len(tokens) for tokens, _ in references) <= SEQUENCE_LENGTH  # nothing is cut
    batch = packed_batch(storage)
    assert len(batch["cu_seqlens"]) - 1 > len(batch["input_ids"])  # rows hold several conversations
    packed = summed_loss(model, batch["input_ids"], batch["labels"], batch["position_ids"])
    expected = sum(one_at_a_time(model, tokens, mask) for tokens, mask in references)
    assert packed == pytest.approx(expected, rel=1e-9)

    # the mask ignored: every token of a piece but its first is learned, and the sums part
    unmasked = torch.where(batch["position_ids"] != 0, batch["input_ids"], -100)
    ignored = summed_loss(model, batch["input_ids"], unmasked, batch["position_ids"])
    assert ignored != pytest.approx(expected, rel=1e-3)
    everything = sum(one_at_a_time(model, tokens, [1] * len(tokens)) for tokens, _ in references)
    assert ignored == pytest.approx(everything, rel=1e-9)


@pytest.mark.parametrize("long_documents", ["truncate", "drop"])
def test_long_conversations_truncated_or_dropped(setup: Any, long_documents: str) -> None:
    storage, model, references = setup
    cut = 96
    lengths = np.array([len(tokens) for tokens, _ in references])
    assert (lengths > cut).any() and (lengths <= cut).any()
    with StatefulDataLoader.from_storage(
        storage,
        device="cpu",
        local_batch_size=64,
        sequence_length=cut,
        pack_documents=True,
        long_documents=long_documents,
    ) as loader:
        [batch] = list(loader)
    packed = summed_loss(model, batch["input_ids"], batch["labels"], batch["position_ids"])
    kept = [(t[:cut], m[:cut]) for t, m in references if len(t) <= cut or long_documents == "truncate"]
    assert packed == pytest.approx(sum(one_at_a_time(model, t, m) for t, m in kept), rel=1e-9)
