"""tokenize_files refuses an argument of the wrong type before it writes anything, naming the argument."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guideloom.tokenize import tokenize_files, train_tokenizer


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("eos_token", 5, "eos_token must be a str or None, got int"),
        ("skip_existing", "yes", "skip_existing must be a bool, got str"),
        ("progress", "no", "progress must be a bool, got str"),
        ("text_field", None, "text_field must be a str, got NoneType"),
    ],
)
def test_tokenize_files_names_an_argument_of_the_wrong_type(
    tmp_path: Path, argument: str, value: object, message: str
) -> None:
    tokenizer = train_tokenizer(["one two three", "four five"] * 20, 260, tmp_path / "tokenizer.json")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one two\n")
    arguments: dict[str, Any] = {"progress": False, argument: value}
    with pytest.raises(TypeError) as error:
        tokenize_files([corpus], tmp_path / "tokens", tokenizer, **arguments)
    assert str(error.value) == message
    assert not (tmp_path / "tokens").exists()
