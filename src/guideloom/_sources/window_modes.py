"""Window modes: how a loader cuts samples from a storage, each mode one value.

A mode is chosen by ``from_storage``'s mode arguments (`window_mode` turns them into one value, once).
It checks its arguments and the storage it applies to, builds its sample source, says what of it a
state records besides the source's kind (`WindowMode.recorded`), and is found again from that record
(`recorded_mode`), which is how a loader is reopened from a state alone. Adding a mode is adding a
class here (and its source), listed in `MODES`, and its arguments to ``from_storage``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import numpy as np

from guideloom._core.checks import check_bool, check_choice, check_int, check_sequence_length
from guideloom._core.errors import StateMismatchError
from guideloom._shards.shard_table import ShardTable
from guideloom._sources.boundary_windows import BoundaryWindowSource
from guideloom._sources.documents import DocumentSource
from guideloom._sources.labeled_windows import LabeledWindowSource
from guideloom._sources.packed_records import RECORD_LONG_DOCUMENTS, PackedRecordSource
from guideloom._sources.packed_windows import PackedRowSource
from guideloom._sources.token_windows import TokenSource, TokenWindowSource
from guideloom._storage.storages import DocumentStorage, TokenStorage
from guideloom._windows.packing import LONG_DOCUMENTS

__all__ = [
    "MODES",
    "BoundaryWindows",
    "PackedDocuments",
    "PlainWindows",
    "StorageSource",
    "WindowMode",
    "recorded_mode",
    "window_mode",
]


@dataclass(frozen=True)
class WindowMode(ABC):
    """How samples are cut from a token storage; a mode's fields are its settings (its own arguments)."""

    keyword: ClassVar[str] = ""  # the from_storage argument that chooses the mode (=True); "" for the default
    kinds: ClassVar[tuple[str, ...]] = ()  # the source kinds a state records of this mode

    @classmethod
    def check_arguments(cls, arguments: Mapping[str, Any]) -> None:
        """TypeError or ValueError for a bad value of this mode's own arguments, chosen or not."""
        return None  # (a mode without settings has nothing to check)

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> Self:
        """This mode with the settings ``arguments`` give it (checked by `check_arguments`)."""
        return cls()

    @classmethod
    def refuse_settings(cls, arguments: Mapping[str, Any]) -> None:
        """ValueError if ``arguments`` set one of this mode's settings although another mode is chosen."""
        return None  # (a mode without settings has nothing to check)

    def arguments(self) -> dict[str, Any]:
        """The from_storage arguments that choose this mode with these settings."""
        return {self.keyword: True} if self.keyword else {}

    def check_storage(self, storage: object) -> None:
        """ValueError if this mode does not apply to ``storage`` (document storages are cut in whole records)."""
        if self.keyword and not isinstance(storage, TokenStorage):
            raise ValueError(
                f"{self.keyword}=True applies to a TokenStorage or a mixture of them, not to a "
                f"{type(storage).__name__}: documents are whole samples already"
            )

    def source(
        self,
        storage: TokenStorage,
        snapshot: ShardTable,
        sequence_length: int,
        window_dtype: np.dtype[Any],
        labels: bool,
    ) -> TokenSource[Any]:
        """The source over ``snapshot`` of ``storage``; ``labels``: give batches labels (a mixture with a masked
        component gives them to every component)."""
        self.check_window_dtype(window_dtype)
        return self.source_class(storage, labels)(storage, snapshot, sequence_length, window_dtype, self)

    def document_source(
        self, storage: DocumentStorage[Any, Any], snapshot: ShardTable, sequence_length: int | None
    ) -> DocumentSource | PackedRecordSource:
        """The source over ``snapshot`` of a document storage (a mode for token storages only refuses one in
        `check_storage`)."""
        if sequence_length is not None:
            raise ValueError(
                "sequence_length must be omitted for a DocumentStorage: each record is one sample (with "
                "pack_documents=True it is the length of a row of packed records)"
            )
        return DocumentSource(storage, snapshot)

    @abstractmethod
    def source_class(self, storage: TokenStorage, labels: bool) -> type[TokenSource[Any]]:
        """The class of this mode's sources (for ``storage``, with or without ``labels``)."""

    def check_window_dtype(self, window_dtype: np.dtype[Any]) -> None:
        """ValueError if a setting of this mode does not fit batches of ``window_dtype``."""
        return None  # (a mode without settings has nothing to check)

    def recorded(self) -> dict[str, Any]:
        """What a state records of this mode's settings, besides the source's kind (JSON values)."""
        return {}

    @classmethod
    def from_recorded(cls, identity: Mapping[str, Any]) -> Self:
        """The mode a state's source identity records (its settings, as `recorded` wrote them)."""
        return cls()


@dataclass(frozen=True)
class PlainWindows(WindowMode):
    """The default: sample ``k`` is ``stream[k*S:(k+1)*S]`` (with labels from a masked storage), and a document
    storage's records as they are."""

    kinds = (TokenWindowSource.kind, LabeledWindowSource.kind, DocumentSource.kind)

    def source_class(self, storage: TokenStorage, labels: bool) -> type[TokenSource[Any]]:
        return LabeledWindowSource if labels or storage.loss_mask else TokenWindowSource


@dataclass(frozen=True)
class BoundaryWindows(WindowMode):
    """``document_boundaries=True``: the plain windows, with where their documents start."""

    keyword = "document_boundaries"
    kinds = (BoundaryWindowSource.kind,)

    def source_class(self, storage: TokenStorage, labels: bool) -> type[TokenSource[Any]]:
        return BoundaryWindowSource  # (with labels always)


@dataclass(frozen=True)
class PackedDocuments(WindowMode):
    """``pack_documents=True``: whole documents packed into rows, padded with ``pad_id``; ``long_documents`` says
    what becomes of a document longer than a row. On a document storage: rows of whole records, never cut
    (``"drop"`` leaves a longer record out; by default it is an error) and never padded."""

    pad_id: int = 0
    long_documents: str = "split"
    # Whether "split" was passed rather than left to the default: packed records refuse it, as they cut nothing.
    split_chosen: bool = field(default=False, compare=False, repr=False)

    keyword = "pack_documents"
    kinds = (PackedRowSource.kind, PackedRecordSource.kind)

    @classmethod
    def check_arguments(cls, arguments: Mapping[str, Any]) -> None:
        check_int("pad_id", arguments["pad_id"])
        if arguments["long_documents"] is not None:
            check_choice("long_documents", arguments["long_documents"], LONG_DOCUMENTS)

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> Self:
        chosen = arguments["long_documents"]
        return cls(arguments["pad_id"], chosen or "split", split_chosen=chosen == "split")

    @classmethod
    def refuse_settings(cls, arguments: Mapping[str, Any]) -> None:
        if arguments["long_documents"] is not None:
            raise ValueError(
                "long_documents applies only with pack_documents=True (other windows are cut from the stream and "
                "never cut documents)"
            )
        if arguments["pad_id"] != 0:
            raise ValueError("pad_id applies only with pack_documents=True (other windows have no padding)")

    def arguments(self) -> dict[str, Any]:
        chosen = self.long_documents if self.long_documents != "split" or self.split_chosen else None
        return {**super().arguments(), "pad_id": self.pad_id, "long_documents": chosen}

    def check_storage(self, storage: object) -> None:
        if not isinstance(storage, DocumentStorage):
            super().check_storage(storage)
            return
        if self.split_chosen:
            raise ValueError(
                'long_documents="split" cannot apply to packed records (pack_documents=True on a DocumentStorage), '
                'which are never cut: pass "drop" to leave records longer than a row out, or omit it (such a record '
                "is then an error)"
            )
        if self.long_documents not in ("split", *RECORD_LONG_DOCUMENTS):  # ("split" here: the default, none chosen)
            raise ValueError(
                f"long_documents={self.long_documents!r} cannot apply to packed records, which are never cut: pass "
                '"drop" to leave records longer than a row out, or omit it (such a record is then an error)'
            )
        if self.pad_id != 0:
            raise ValueError("pad_id applies to packed token rows: packed records are lists of records, not padded")

    def document_source(
        self, storage: DocumentStorage[Any, Any], snapshot: ShardTable, sequence_length: int | None
    ) -> DocumentSource | PackedRecordSource:
        if sequence_length is None:
            raise ValueError("pack_documents=True on a DocumentStorage needs sequence_length: the length of a row")
        drop = self.long_documents in RECORD_LONG_DOCUMENTS
        return PackedRecordSource(storage, snapshot, check_sequence_length(sequence_length), drop)

    def source_class(self, storage: TokenStorage, labels: bool) -> type[TokenSource[Any]]:
        return PackedRowSource  # (with labels always)

    def check_window_dtype(self, window_dtype: np.dtype[Any]) -> None:
        limit = int(np.iinfo(window_dtype).max)
        if not 0 <= self.pad_id <= limit:
            raise ValueError(f"pad_id must be in [0, {limit}] for {window_dtype} batches, got {self.pad_id}")

    def recorded(self) -> dict[str, Any]:
        chosen = {} if self.long_documents == "split" else {"long_documents": self.long_documents}  # as 0.2 states
        return {"pad_id": self.pad_id, **chosen}

    @classmethod
    def from_recorded(cls, identity: Mapping[str, Any]) -> Self:
        return cls(identity.get("pad_id", 0), identity.get("long_documents", "split"))


StorageSource = DocumentSource | PackedRecordSource | TokenSource[Any]  # the source over one storage, whatever its mode
PLAIN_WINDOWS = PlainWindows()
MODES: tuple[type[WindowMode], ...] = (PlainWindows, BoundaryWindows, PackedDocuments)


def window_mode(arguments: Mapping[str, Any]) -> WindowMode:
    """The mode that ``from_storage``'s mode arguments choose (plain windows when none does), checked.

    ``arguments`` holds every mode's arguments: each mode's ``keyword`` and settings, as ``from_storage`` got them.
    """
    chosen = [mode for mode in MODES if mode.keyword and check_bool(mode.keyword, arguments[mode.keyword])]
    for mode in MODES:
        mode.check_arguments(arguments)
    for mode in MODES:
        if mode not in chosen:
            mode.refuse_settings(arguments)
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join(mode.keyword for mode in chosen)} are exclusive: pick one window mode")
    return chosen[0].from_arguments(arguments) if chosen else PLAIN_WINDOWS


def recorded_mode(identity: Mapping[str, Any]) -> WindowMode:
    """The mode of a source a state recorded; StateMismatchError for a kind no mode makes."""
    kind = identity.get("kind")
    for mode in MODES:
        if kind in mode.kinds:
            return mode.from_recorded(identity)
    raise StateMismatchError(f"the state's source kind {kind!r} is not one guideloom reads")
