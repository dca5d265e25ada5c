"""The tokenizer of a tokenize run: loading a ``tokenizer.json``, training a small one, the end-of-text id."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from guideloom._core.errors import TokenizeInputError
from guideloom.tokenize._compression import INSTALL_HINT
from guideloom.tokenize._inputs import iter_documents

EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]")


def import_tokenizers() -> Any:
    """The ``tokenizers`` package; ImportError with the install hint when it is missing."""
    try:
        import tokenizers
    except ImportError as error:
        raise ImportError(f"tokenizing needs the tokenizers package: {INSTALL_HINT}") from error
    return tokenizers


def check_tokenizer_path(path: Path, name: str = "tokenizer file") -> None:
    """A missing file or a directory given as the tokenizer, said as such (``name``: how the caller calls it)."""
    if path.is_dir():
        hint = f"; did you mean {path / 'tokenizer.json'}?" if (path / "tokenizer.json").is_file() else ""
        if (path / "tokenizer_config.json").is_file():
            hint = " (a Hugging Face tokenizer directory is read for conversations: --chat, chat=True)"
        raise ValueError(f"{name} {path} is a directory, not a tokenizer.json file{hint}")
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json``; errors name the file."""
    tokenizers = import_tokenizers()
    path = Path(path)
    check_tokenizer_path(path)
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:
        raise TokenizeInputError(f"{path}: not a tokenizers tokenizer.json: {error}") from None


def find_eos_id(tokenizer: Any, eos_token: str | None = "auto", name: str = "eos_token") -> int | None:
    """The end-of-text id appended after each document: ``"auto"`` takes the first of ``EOS_CANDIDATES`` known.

    ``None`` or ``""`` appends nothing; any other string must be in the vocabulary (``name`` is how the
    caller calls the option, in the error).
    """
    if eos_token is None or eos_token == "":
        return None
    if not isinstance(eos_token, str):
        raise TypeError(f"{name} must be a str or None, got {type(eos_token).__name__}")
    if eos_token == "auto":
        for candidate in EOS_CANDIDATES:
            found = tokenizer.token_to_id(candidate)
            if found is not None:
                return int(found)
        return None
    found = tokenizer.token_to_id(eos_token)
    if found is None:
        raise ValueError(f"{name} {eos_token!r} is not in the tokenizer's vocabulary")
    return int(found)


def train_tokenizer(
    texts_or_files: Iterable[str | Path],
    vocab_size: int,
    out_path: str | os.PathLike[str],
    *,
    text_field: str = "text",
    special_tokens: Sequence[str] = ("<|endoftext|>",),
    min_frequency: int = 2,
) -> Path:
    """Train a byte-level BPE tokenizer (lossless on any text) and save it as ``out_path``.

    Items that are ``Path`` objects are read as inputs (any kind ``guideloom tokenize`` reads); ``str``
    items are the texts themselves. ``<|endoftext|>`` is added as a special token, so ``eos_token="auto"``
    finds it. The file is written atomically. Takes seconds for a few MB of text.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    minimum = 256 + len(special_tokens) + 1
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum} for a byte-level BPE, got {vocab_size}")
    tokenizers = import_tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts() -> Iterator[str]:
        for item in texts_or_files:
            if isinstance(item, Path):
                for text, _ in iter_documents(item, text_field):
                    yield text
            elif isinstance(item, str):
                yield item
            else:
                raise TypeError(f"texts_or_files must hold str texts or Path files, got {type(item).__name__}")

    tokenizer.train_from_iterator(texts(), trainer=trainer)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tokenizer.save(str(temporary))
    os.replace(temporary, out)
    return out


def encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """The ids of each text, without the tokenizer's own special tokens."""
    encode_batch = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    return [encoding.ids for encoding in encode_batch(texts, add_special_tokens=False)]
