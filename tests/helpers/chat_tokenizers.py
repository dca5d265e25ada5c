"""Tiny Hugging Face tokenizer directories with chat templates, built offline for the conversation tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may reach the hub

SPECIAL_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

# Each message: its role's token, a newline, the content, <|end|>; the generation prompt is the assistant header.
GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}"
    "{% else %}"
    "{{ message['content'] }}<|end|>"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
PLAIN_TEMPLATE = GENERATION_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
# Marks the last message: an earlier rendering is never a prefix of a later one.
LAST_MESSAGE_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{% if loop.last %}<|end|>{% endif %}"
    "{% endfor %}"
)
# Refuses a conversation whose roles do not alternate, as many real templates do.
STRICT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.index0 > 0 and message['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate') }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>"
    "{% endfor %}"
)

TRAINING_TEXTS = (
    "You are a helpful assistant.",
    "What is two plus two?",
    "Two plus two is four.",
    "Name a colour of the sky.",
    "The sky is often blue, and red at sunset.",
    "How many legs does a spider have?",
    "A spider has eight legs.",
)


def conversation(number: int, turns: int = 2, system: bool = True) -> list[dict[str, str]]:
    """A made-up conversation of ``turns`` user/assistant exchanges, numbered so that every one differs."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}] if system else []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"What is {number} plus {turn}?"})
        messages.append({"role": "assistant", "content": f"{number} plus {turn} is {number + turn}." * (1 + turn)})
    return messages


def make_chat_tokenizer(directory: Path, chat_template: str = GENERATION_TEMPLATE) -> Path:
    """Train a byte-level BPE of about 300 tokens and save it with ``chat_template`` as a tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING_TEXTS * 4, trainer=trainer)
    wrapped: Any = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, chat_template=chat_template, eos_token="<|end|>", pad_token="<|end|>"
    )
    wrapped.save_pretrained(str(directory))
    return directory
