"""Conversations into tokens and a loss mask, through a Hugging Face tokenizer's chat template.

A conversation is rendered with the template and tokenized exactly as ``apply_chat_template`` does
(no special tokens added, nothing appended). Its mask marks the assistant's turns:

* a template with ``{% generation %}`` blocks: the tokens transformers' ``return_assistant_tokens_mask``
  marks (every token overlapping a block);
* any other template: the conversation is split into turns by rendering growing prefixes of it. The
  tokens of assistant turn ``k`` are those of ``messages[: k + 1]`` beyond those of ``messages[:k]``
  (beyond ``messages[:k]`` with the generation prompt, when that rendering is a prefix too: the
  assistant header is then not learned). Renderings that are not token prefixes of the whole
  conversation's mean the template cannot be split into turns: a :class:`TurnSplitError`.

``train_on="all"`` marks every token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._core.errors import TokenizeInputError

TRAIN_ON = ("assistant", "all")
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
INSTALL_HINT = "pip install 'guideloom[chat]'"

Messages = list[dict[str, Any]]


class TurnSplitError(Exception):
    """A conversation that cannot be rendered, or split into turns: ``index`` is its place in the batch."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def import_transformers() -> Any:
    """The ``transformers`` package; ImportError with the install hint when it is missing."""
    try:
        import transformers
    except ImportError as error:
        raise ImportError(f"tokenizing conversations needs the transformers package: {INSTALL_HINT}") from error
    return transformers


def load_chat_tokenizer(directory: str | os.PathLike[str], name: str = "tokenizer") -> Any:
    """The Hugging Face tokenizer saved in ``directory``, which must have a chat template and a fast tokenizer."""
    path = Path(directory)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    if not path.is_dir():
        raise ValueError(
            f"{name} {path} is a file: conversations need a Hugging Face tokenizer directory "
            "(tokenizer_config.json, tokenizer.json and a chat template, as save_pretrained writes them)"
        )
    if not (path / "tokenizer_config.json").is_file():
        raise TokenizeInputError(f"{path} holds no tokenizer_config.json: not a Hugging Face tokenizer directory")
    transformers = import_transformers()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as error:
        raise TokenizeInputError(f"{path}: the tokenizer cannot be loaded: {error}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise TokenizeInputError(f"{path}: a fast tokenizer (tokenizer.json) is needed, got {type(tokenizer).__name__}")
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizeInputError(f"{path}: no chat template (in chat_template.jinja or tokenizer_config.json)")
    return tokenizer


def _template_text(tokenizer: Any) -> str:
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the one apply_chat_template uses
        template = template.get("default") or next(iter(template.values()))
    return str(template)


@dataclass(frozen=True)
class EncodedConversation:
    """One conversation's tokens and loss mask (``uint8``, 1: the loss counts there)."""

    tokens: list[int]
    loss_mask: np.ndarray


def _is_prefix(prefix: list[int], tokens: list[int]) -> bool:
    return len(prefix) <= len(tokens) and tokens[: len(prefix)] == prefix


class ChatEncoder:
    """Renders and tokenizes batches of conversations with one tokenizer's chat template."""

    def __init__(self, tokenizer: Any, train_on: str = "assistant") -> None:
        self.tokenizer = tokenizer
        self.train_on = train_on
        self.generation_blocks = GENERATION_BLOCK.search(_template_text(tokenizer)) is not None

    def encode(self, conversations: Sequence[Messages]) -> list[EncodedConversation]:
        """Every conversation's tokens and mask; a :class:`TurnSplitError` names the first that fails."""
        if self.train_on == "all":
            tokens = self._tokenize(self._render_each(conversations))
            return [EncodedConversation(ids, np.ones(len(ids), np.uint8)) for ids in tokens]
        if self.generation_blocks:
            return self._generation_masks(conversations)
        return self._prefix_masks(conversations)

    def _render(self, messages: Messages, add_generation_prompt: bool = False) -> str:
        return str(
            self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        )

    def _render_each(self, conversations: Sequence[Messages]) -> list[str]:
        rendered = []
        for index, messages in enumerate(conversations):
            try:
                rendered.append(self._render(messages))
            except Exception as error:
                raise TurnSplitError(index, f"the chat template fails on these messages: {error}") from None
        return rendered

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def _generation_masks(self, conversations: Sequence[Messages]) -> list[EncodedConversation]:
        try:
            out = self.tokenizer.apply_chat_template(
                list(conversations), return_dict=True, return_assistant_tokens_mask=True
            )
        except Exception:
            self._render_each(conversations)  # names the conversation the template fails on
            raise
        return [
            EncodedConversation(list(ids), np.asarray(mask, np.uint8))
            for ids, mask in zip(out["input_ids"], out["assistant_masks"], strict=True)
        ]

    def _prefix_masks(self, conversations: Sequence[Messages]) -> list[EncodedConversation]:
        """Split each conversation into turns by tokenizing the renderings of its growing prefixes."""
        texts: list[str] = []
        # per conversation: (its full rendering, [(assistant k, before k, before k with the prompt, through k)])
        layout: list[tuple[int, list[tuple[int, int, int | None, int]]]] = []
        for index, messages in enumerate(conversations):
            try:
                full = len(texts)
                texts.append(self._render(messages))
                turns = []
                for k, message in enumerate(messages):
                    if message["role"] != "assistant":
                        continue
                    before = prompt = None
                    if k:
                        before = len(texts)
                        texts.append(self._render(messages[:k]))
                        prompt = len(texts)
                        texts.append(self._render(messages[:k], add_generation_prompt=True))
                    through = len(texts)
                    texts.append(self._render(messages[: k + 1]))
                    turns.append((k, -1 if before is None else before, prompt, through))
            except Exception as error:
                raise TurnSplitError(index, f"the chat template fails on these messages: {error}") from None
            layout.append((full, turns))
        tokens = self._tokenize(texts)
        encoded = []
        for index, (full, turns) in enumerate(layout):
            ids = tokens[full]
            mask = np.zeros(len(ids), np.uint8)
            for k, before, prompt, through in turns:
                start = 0 if before < 0 else len(tokens[before])
                end = len(tokens[through])
                for piece, what in ((before, f"messages[:{k}]"), (through, f"messages[:{k + 1}]")):
                    if piece >= 0 and not _is_prefix(tokens[piece], ids):
                        raise TurnSplitError(
                            index,
                            f"the conversation cannot be split into turns: the template's rendering of {what} "
                            "is not a prefix of the whole conversation's (a template that renders earlier turns "
                            "differently once later ones follow); use a template with {% generation %} blocks, "
                            "or train on every token (--train-on all, train_on='all')",
                        )
                if prompt is not None and start <= len(tokens[prompt]) <= end and _is_prefix(tokens[prompt], ids):
                    start = len(tokens[prompt])  # the assistant header, added by the generation prompt, is not learned
                mask[start:end] = 1
            encoded.append(EncodedConversation(ids, mask))
        return encoded
