"""UntrustedFormatWarning: for pickle data from elsewhere, at the user's line, with an opt-out for trusted data."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from guideloom import DocumentPickleFormat, DocumentStorage, StatefulDataLoader, UntrustedFormatWarning
from tests.docs import test_spec_samples

pytestmark = pytest.mark.filterwarnings("error::guideloom.UntrustedFormatWarning")


def copied_pickle_storage(path: Path, records: list[Any]) -> Path:
    """A pickle storage this process did not write: written beside ``path``, then copied there."""
    source = path.with_name(f"{path.name}-source")
    with DocumentStorage(source, DocumentPickleFormat()).sync_writer() as writer:
        for record in records:
            writer.append(0, record)
    shutil.copytree(source, path)
    return path


def test_reading_pickle_data_from_elsewhere_warns_at_the_users_line(tmp_path: Path) -> None:
    storage = DocumentStorage(copied_pickle_storage(tmp_path / "copied", [{"a": 1}]), DocumentPickleFormat())
    with pytest.warns(UntrustedFormatWarning, match=r"pickle.*trusted=True") as caught:
        reader = storage.sync_reader()
    reader.close()
    assert [warning.filename for warning in caught] == [__file__]


def test_a_loader_over_pickle_data_from_elsewhere_warns_at_the_users_line(tmp_path: Path) -> None:
    storage = DocumentStorage(copied_pickle_storage(tmp_path / "copied", [1, 2, 3]), DocumentPickleFormat())
    with pytest.warns(UntrustedFormatWarning) as caught:
        loader = StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=3)
        with loader:
            assert [sorted(batch) for batch in loader] == [[1, 2, 3]]
    assert [warning.filename for warning in caught] == [__file__]


def test_trusted_true_silences_it(tmp_path: Path) -> None:
    path = copied_pickle_storage(tmp_path / "copied", [{"a": 1}])
    storage = DocumentStorage(path, DocumentPickleFormat(), trusted=True)
    with storage.sync_reader() as reader:
        assert reader.read(0) == {"a": 1}
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=1) as loader:
        assert list(loader) == [[{"a": 1}]]


def test_trusted_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="trusted"):
        DocumentStorage(tmp_path / "docs", DocumentPickleFormat(), trusted="yes")  # type: ignore[arg-type]


def test_shards_this_process_wrote_are_its_own_data_and_do_not_warn(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentPickleFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"a": 1})
    with storage.sync_reader() as reader:
        assert reader.read(0) == {"a": 1}
    with storage.sync_writer(shard_size=1) as rolling:
        rolling.append({"b": 2})
    with DocumentStorage(tmp_path / "docs", DocumentPickleFormat()).sync_reader() as reader:
        assert len(reader) == 2


def test_one_shard_from_elsewhere_among_ones_own_warns(tmp_path: Path) -> None:
    path = copied_pickle_storage(tmp_path / "mixed", [{"theirs": 1}])
    storage = DocumentStorage(path, DocumentPickleFormat())
    with storage.sync_writer() as writer:
        writer.append(1, {"mine": 2})
    with pytest.warns(UntrustedFormatWarning):
        storage.sync_reader().close()


def test_the_documents_pages_first_example_shows_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntrustedFormatWarning)
        test_spec_samples.test_documents_sample_store_trusted_python_records()  # the sample, verbatim
