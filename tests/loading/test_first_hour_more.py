"""More of what a new user hits in the first hour: storage and loader mistakes that must name their cause."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guideloom import (
    DocumentStorage,
    Mixture,
    StatefulDataLoader,
    StateMismatchError,
    StorageNotFoundError,
    TokenStorage,
)
from guideloom.tokenize import tokenize_files, train_tokenizer
from guideloom.types import DocumentStorageFormat


def make_tokens(path: Path, shards: int) -> TokenStorage:
    storage = TokenStorage(path)
    with storage.sync_writer() as writer:
        for shard in range(shards):
            writer.append(shard, list(range(shard * 10, shard * 10 + 40)))
    return storage


def windows(storage: object, **overrides: object) -> StatefulDataLoader:
    arguments: dict[str, object] = {"device": "cpu", "local_batch_size": 2, "sequence_length": 8, **overrides}
    return StatefulDataLoader.from_storage(storage, **arguments)  # type: ignore[arg-type]


def test_a_file_is_not_called_a_missing_directory(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a"}\n')
    message = f"no storage at {corpus}: it is a file, not a storage directory"
    with pytest.raises(StorageNotFoundError) as reading:
        windows(TokenStorage(corpus))
    assert str(reading.value) == message
    with pytest.raises(StorageNotFoundError) as listing:
        TokenStorage(corpus).committed_shards()
    assert str(listing.value) == message


def test_a_missing_directory_is_still_called_missing(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFoundError) as error:
        windows(TokenStorage(tmp_path / "missing"))
    assert str(error.value) == f"no storage at {tmp_path / 'missing'}: the directory does not exist"


def test_writing_under_a_file_names_the_file(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("")
    with pytest.raises(NotADirectoryError) as error, TokenStorage(corpus / "tokens").sync_writer() as writer:
        writer.append(0, [1])
    assert str(error.value) == f"cannot create a storage at {corpus / 'tokens'}: {corpus} is a file"


@pytest.mark.parametrize("path", ["", "file://"])
def test_an_empty_path_is_refused_not_read_as_the_current_directory(path: str) -> None:
    with pytest.raises(ValueError) as error:
        TokenStorage(path)
    assert str(error.value) == "path must not be empty"


def test_a_file_url_is_the_local_storage(tmp_path: Path) -> None:
    make_tokens(tmp_path / "tokens", shards=2)
    assert TokenStorage(f"file://{tmp_path / 'tokens'}").committed_shards() == [0, 1]


def test_a_state_from_another_storage_with_fewer_shards_says_so(tmp_path: Path) -> None:
    with windows(make_tokens(tmp_path / "a", shards=3)) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with windows(make_tokens(tmp_path / "b", shards=2)) as other, pytest.raises(StateMismatchError) as error:
        other.load_state_dict(state)
    assert str(error.value) == (
        f"the state was taken from another storage: it read shards 0-2 of the storage at {tmp_path / 'a'}, "
        f"but the storage at {tmp_path / 'b'} has shards 0-1"
    )


def test_a_state_whose_source_has_no_kind_says_so(tmp_path: Path) -> None:
    with windows(make_tokens(tmp_path / "a", shards=1)) as loader:
        state = loader.state_dict()
        del state["source"]["kind"]
        with pytest.raises(StateMismatchError) as error:
            loader.load_state_dict(state)
    assert str(error.value) == "the state's source records no 'kind': it is not from state_dict()"


def test_a_path_given_as_storage_is_named_before_window_modes(tmp_path: Path) -> None:
    make_tokens(tmp_path / "a", shards=1)
    with pytest.raises(TypeError) as error:
        windows(str(tmp_path / "a"), document_boundaries=True)
    assert str(error.value) == "storage must be a DocumentStorage, TokenStorage or Mixture, got str"


@pytest.mark.parametrize(
    ("rank", "world_size", "said"), [("3", "2", "RANK=3 and WORLD_SIZE=2"), (None, "0", "WORLD_SIZE=0")]
)
def test_ranks_from_the_environment_are_named_as_its_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: str | None, world_size: str, said: str
) -> None:
    storage = make_tokens(tmp_path / "a", shards=1)
    monkeypatch.delenv("RANK", raising=False)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", world_size)
    with pytest.raises(ValueError) as error:
        windows(storage)
    assert str(error.value) == (
        f"the environment says {said}: WORLD_SIZE must be 1 or more and RANK from 0 to WORLD_SIZE - 1"
    )


def test_drop_last_that_would_drop_every_batch_is_refused(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path / "a", shards=1)  # 40 tokens: 5 windows of 8
    with pytest.raises(ValueError) as error:
        windows(storage, local_batch_size=3, rank=0, world_size=2, drop_last=True)
    assert str(error.value) == (
        f"drop_last=True would drop every batch: token windows of shards 0 of the storage at {tmp_path / 'a'} gives "
        "5 samples per epoch, fewer than one global batch of 6 (local_batch_size=3 × world_size=2)"
    )


def test_drop_last_with_one_full_global_batch_is_accepted(tmp_path: Path) -> None:
    with windows(make_tokens(tmp_path / "a", shards=1), local_batch_size=5, drop_last=True) as loader:
        assert len(loader) == 1


class NumberedFormat(DocumentStorageFormat[bytes, bytes]):
    name = 3  # type: ignore[assignment]  # the mistake under test

    def pack(self, data: bytes) -> bytes:
        return data

    def unpack(self, encoded_data: memoryview, shard: int) -> bytes:
        return bytes(encoded_data)


def test_a_format_name_that_is_not_a_str_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as error:
        DocumentStorage(tmp_path / "documents", NumberedFormat())
    assert str(error.value) == "NumberedFormat.name must be a str, got int"
    assert not (tmp_path / "documents").exists()


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


def test_a_mixture_component_too_short_for_a_window_is_named(tmp_path: Path) -> None:
    long, short = make_tokens(tmp_path / "long", shards=3), make_tokens(tmp_path / "short", shards=1)
    mixture = Mixture({"long": long, "short": short}, {"long": 1.0, "short": 1.0})
    with pytest.raises(ValueError) as error:
        windows(mixture, sequence_length=50)
    assert str(error.value) == (
        f"the mixture's component 'short': the storage at {tmp_path / 'short'} has no samples to load: "
        "sequence_length=50 is longer than its 40 tokens"
    )


def test_building_the_loader_like_torch_points_to_from_storage(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path / "a", shards=1)
    with pytest.raises(TypeError) as error:
        StatefulDataLoader(storage, batch_size=2)  # type: ignore[call-arg]
    assert str(error.value) == (
        "a loader over a TokenStorage is built with StatefulDataLoader.from_storage(storage, device=..., "
        "local_batch_size=..., ...), not StatefulDataLoader(storage, ...)"
    )


@pytest.mark.parametrize("url", ["s3://", "s3:///corpus"])
def test_a_url_without_a_bucket_says_so(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        TokenStorage(url)
    assert str(caught.value) == f"path {url!r} names no bucket: use s3://BUCKET/PREFIX"


def test_an_empty_cache_dir_is_refused_rather_than_the_current_directory() -> None:
    with pytest.raises(ValueError) as caught:
        TokenStorage("s3://bucket/corpus", cache_dir="")
    assert str(caught.value) == "cache_dir must not be empty"


def test_mixture_weights_given_as_a_plain_list_say_what_weights_are(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path / "a", shards=1)
    with pytest.raises(TypeError) as caught:
        Mixture({"a": storage, "b": storage}, weights=[0.5, 0.5])
    assert str(caught.value) == (
        "weights must be a dict of component name -> weight, or a schedule: a list of (start, weights) pairs; "
        "got [0.5, 0.5]"
    )


@pytest.mark.parametrize("weight", [float("nan"), float("inf")])
def test_a_mixture_weight_that_is_not_finite_says_so(tmp_path: Path, weight: float) -> None:
    storage = make_tokens(tmp_path / "a", shards=1)
    with pytest.raises(ValueError) as caught:
        Mixture({"a": storage, "b": storage}, weights={"a": 1.0, "b": weight})
    assert str(caught.value) == f"weights['b'] must be a finite number, got {weight}"
