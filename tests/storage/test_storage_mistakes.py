"""Mistakes in opening or writing a storage name their cause: a file, an empty path, a URL, a dtype, a format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guideloom import DocumentStorage, StorageNotFoundError, TokenStorage
from tests.helpers.loaders import window_loader
from tests.helpers.storages import RawFormat, make_counted_tokens


def test_a_file_is_not_called_a_missing_directory(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a"}\n')
    message = f"no storage at {corpus}: it is a file, not a storage directory"
    with pytest.raises(StorageNotFoundError) as reading:
        window_loader(TokenStorage(corpus))
    assert str(reading.value) == message
    with pytest.raises(StorageNotFoundError) as listing:
        TokenStorage(corpus).committed_shards()
    assert str(listing.value) == message


def test_a_missing_directory_is_still_called_missing(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFoundError) as error:
        window_loader(TokenStorage(tmp_path / "missing"))
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
    make_counted_tokens(tmp_path / "tokens", shards=2)
    assert TokenStorage(f"file://{tmp_path / 'tokens'}").committed_shards() == [0, 1]


@pytest.mark.parametrize("url", ["s3://", "s3:///corpus"])
def test_a_url_without_a_bucket_says_so(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        TokenStorage(url)
    assert str(caught.value) == f"path {url!r} names no bucket: use s3://BUCKET/PREFIX"


def test_an_empty_cache_dir_is_refused_rather_than_the_current_directory() -> None:
    with pytest.raises(ValueError) as caught:
        TokenStorage("s3://bucket/corpus", cache_dir="")
    assert str(caught.value) == "cache_dir must not be empty"


def test_a_misspelt_dtype_lists_the_token_dtypes(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as caught:
        TokenStorage(tmp_path, dtype="unit16")
    assert (
        str(caught.value)
        == "dtype must be one of uint8, uint16, uint32, uint64, int8, int16, int32, int64, got 'unit16'"
    )


class NumberedFormat(RawFormat):
    name = 3  # type: ignore[assignment]  # the mistake under test


def test_a_format_name_that_is_not_a_str_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as error:
        DocumentStorage(tmp_path / "documents", NumberedFormat())
    assert str(error.value) == "NumberedFormat.name must be a str, got int"
    assert not (tmp_path / "documents").exists()


@pytest.mark.parametrize("kind", ["TokenStorage", "DocumentStorage"])
def test_a_misspelt_keyword_is_a_type_error_naming_it(tmp_path: Path, kind: str) -> None:
    arguments: tuple[Any, ...] = (tmp_path / "data",) if kind == "TokenStorage" else (tmp_path / "data", RawFormat())
    with pytest.raises(TypeError, match=rf"^{kind}\(\) got an unexpected keyword argument 'cache_limit'$"):
        {"TokenStorage": TokenStorage, "DocumentStorage": DocumentStorage}[kind](*arguments, cache_limit=2**20)
    assert not (tmp_path / "data").exists()
