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
from collections.abc import Callable, Sequence
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
        texts = _Texts()
        splits = [self._split(index, messages, texts) for index, messages in enumerate(conversations)]
        texts.tokenize(self._tokenize)
        for split in splits:  # where the generation prompt is of no use: the prefix without it, tokenized now
            for turn in split.turns:
                if turn.prompt is not None and not texts.usable_prompt(turn, split.full):
                    turn.prompt = None
                    turn.before = texts.add(turn.before_text)
        texts.tokenize(self._tokenize)
        return [texts.encoded(split) for split in splits]

    def _split(self, index: int, messages: Messages, texts: _Texts) -> _Split:
        """The renderings a conversation's turns are told apart by, registered with ``texts``."""
        try:
            full = self._render(messages)
            turns = []
            for k, message in enumerate(messages):
                if message["role"] != "assistant":
                    continue
                turn = _Turn(index, k, texts.add(self._render(messages[: k + 1])))
                if k:
                    turn.before_text = self._render(messages[:k])
                    prompted = self._render(messages[:k], add_generation_prompt=True)
                    if prompted != turn.before_text and prompted.startswith(turn.before_text):
                        turn.prompt = texts.add(prompted)
                    else:  # the template adds no generation prompt (or an odd one): the turn starts after m[:k]
                        turn.before = texts.add(turn.before_text)
                turns.append(turn)
        except Exception as error:
            raise TurnSplitError(index, f"the chat template fails on these messages: {error}") from None
        return _Split(index, texts.add(full), turns)


@dataclass
class _Turn:
    """One assistant turn: the ids in :class:`_Texts` of the renderings around it (-1: none)."""

    conversation: int
    message: int
    through: int  # messages[: message + 1]
    before: int = -1  # messages[:message], when it is needed
    prompt: int | None = None  # messages[:message] with the generation prompt, while it may serve
    before_text: str = ""


@dataclass
class _Split:
    conversation: int
    full: int
    turns: list[_Turn]


class _Texts:
    """The distinct renderings of a batch, tokenized together (a rendering met twice is tokenized once)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.tokens: list[list[int]] = []

    def add(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids))

    def tokenize(self, tokenize: Callable[[list[str]], list[list[int]]]) -> None:
        self.tokens.extend(tokenize(list(self.ids)[len(self.tokens) :]))

    def usable_prompt(self, turn: _Turn, full: int) -> bool:
        prompt = self.tokens[turn.prompt]  # type: ignore[index]
        return len(prompt) <= len(self.tokens[turn.through]) and _is_prefix(prompt, self.tokens[full])

    def encoded(self, split: _Split) -> EncodedConversation:
        """The conversation's tokens and its mask, or a TurnSplitError where a rendering is not a prefix."""
        ids = self.tokens[split.full]
        mask = np.zeros(len(ids), np.uint8)
        for turn in split.turns:
            for piece, what in (
                (turn.before, f"messages[:{turn.message}]"),
                (turn.through, f"messages[:{turn.message + 1}]"),
            ):
                if piece >= 0 and not _is_prefix(self.tokens[piece], ids):
                    raise TurnSplitError(
                        split.conversation,
                        f"the conversation cannot be split into turns: the template's rendering of {what} is not "
                        "a prefix of the whole conversation's (a template that renders earlier turns differently "
                        "once later ones follow); use a template with {% generation %} blocks, or train on every "
                        "token (--train-on all, train_on='all')",
                    )
            start = turn.before if turn.prompt is None else turn.prompt
            mask[0 if start < 0 else len(self.tokens[start]) : len(self.tokens[turn.through])] = 1
        return EncodedConversation(ids, mask)
