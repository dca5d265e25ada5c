"""What sources can do beyond the protocol is declared by type: each source over one storage is cut shard by shard,
records know their lengths, and a mixture is read in machine shares of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from guideloom import Mixture
from guideloom._loading.make_source import make_source
from guideloom._sources.capabilities import InMachineShares, MeasuredSamples, ShardwiseSamples
from guideloom._sources.window_modes import MODES, PackedDocuments, PlainWindows, WindowMode
from tests.helpers.storages import make_document_storage, make_token_storage


@pytest.mark.parametrize("mode", [mode() for mode in MODES], ids=lambda mode: type(mode).__name__)
def test_every_window_mode_s_source_is_cut_shard_by_shard_and_has_no_lengths(tmp_path: Path, mode: WindowMode) -> None:
    source = make_source(make_token_storage(tmp_path / "tokens"), mode, sequence_length=8)
    try:
        assert isinstance(source, ShardwiseSamples) and int(source.shard_sample_counts().sum()) == source.sample_count
        assert not isinstance(source, MeasuredSamples) and not isinstance(source, InMachineShares)
    finally:
        source.close()


@pytest.mark.parametrize("mode", [PlainWindows(), PackedDocuments(0, "drop")], ids=["records", "packed records"])
def test_a_document_storage_s_sources_are_cut_shard_by_shard_with_no_sample_across_shards(
    tmp_path: Path, mode: WindowMode
) -> None:
    length = None if isinstance(mode, PlainWindows) else 64
    source = make_source(make_document_storage(tmp_path / "documents"), mode, sequence_length=length)
    try:
        assert isinstance(source, ShardwiseSamples) and source.clean_cuts() is None
        assert int(source.shard_sample_counts().sum()) == source.sample_count
    finally:
        source.close()


def test_records_know_their_lengths(tmp_path: Path) -> None:
    source = make_source(make_document_storage(tmp_path / "documents"), sequence_length=None)
    try:
        assert isinstance(source, MeasuredSamples) and source.measures_samples
    finally:
        source.close()


def test_a_mixture_is_read_in_machine_shares_of_its_own_and_measured_when_its_components_are(tmp_path: Path) -> None:
    weights = {"a": 0.5, "b": 0.5}
    tokens = Mixture({"a": make_token_storage(tmp_path / "a"), "b": make_token_storage(tmp_path / "b")}, weights)
    documents = Mixture(
        {"a": make_document_storage(tmp_path / "c"), "b": make_document_storage(tmp_path / "d")}, weights
    )
    of_tokens, of_documents = make_source(tokens, sequence_length=8), make_source(documents, sequence_length=None)
    try:
        for source in (of_tokens, of_documents):
            assert isinstance(source, InMachineShares) and not isinstance(source, ShardwiseSamples)
            assert isinstance(source, MeasuredSamples)
        assert isinstance(of_documents, MeasuredSamples) and of_documents.measures_samples
        assert isinstance(of_tokens, MeasuredSamples) and not of_tokens.measures_samples
    finally:
        of_tokens.close()
        of_documents.close()
