"""The code samples of spec/documents.txt, pasted verbatim (only indented into test functions).

Keep them in sync with the page by hand: the page is user documentation and every sample on it
must run unchanged.
"""


def test_documents_sample_storage_part() -> None:
    """The storage half of "Store trusted Python records" (everything before the loader)."""
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from guideloom import DocumentPickleFormat, DocumentStorage

    with TemporaryDirectory() as directory:
        storage = DocumentStorage(Path(directory), DocumentPickleFormat())
        with storage.sync_writer() as writer:
            writer.append(0, {"document_id": "a", "tokens": [10, 11]})
            writer.append(1, {"document_id": "b", "tokens": [12, 13, 14]})

        with storage.sync_reader() as reader:
            assert reader.read(1)["document_id"] == "b"


# fmt: off
def test_documents_sample_store_trusted_python_records() -> None:
    """Sample 1 of spec/documents.txt, "Store trusted Python records", verbatim."""
    from pathlib import Path
    from tempfile import TemporaryDirectory

    import torch
    from torch.nn.utils.rnn import pad_sequence

    from guideloom import DocumentPickleFormat, DocumentStorage, StatefulDataLoader

    def collate(samples):
        lengths = torch.tensor([len(sample["tokens"]) for sample in samples])
        tokens = pad_sequence(
            [torch.tensor(sample["tokens"], dtype=torch.int64) for sample in samples],
            batch_first=True,
            padding_value=0,
        )
        return {"tokens": tokens, "lengths": lengths}

    with TemporaryDirectory() as directory:
        storage = DocumentStorage(Path(directory), DocumentPickleFormat())
        with storage.sync_writer() as writer:
            writer.append(0, {"document_id": "a", "tokens": [10, 11]})
            writer.append(1, {"document_id": "b", "tokens": [12, 13, 14]})

        with storage.sync_reader() as reader:
            assert reader.read(1)["document_id"] == "b"

        with StatefulDataLoader.from_storage(
            storage, collate, device=torch.device("cpu"), local_batch_size=2
        ) as loader:
            batches = list(loader)
            assert len(batches) == 1
            assert batches[0]["tokens"].tolist() == [[10, 11, 0], [12, 13, 14]]
            assert batches[0]["lengths"].tolist() == [2, 3]


def test_documents_sample_custom_document_format() -> None:
    """Sample 2 of spec/documents.txt, "Custom document format", verbatim."""
    import struct
    from pathlib import Path
    from tempfile import TemporaryDirectory
    from typing import TypedDict

    import numpy as np

    from guideloom import DocumentStorage
    from guideloom.types import DocumentStorageFormat

    # Typing is optional. These TypedDicts describe the shapes for a type checker.
    class TokenDocument(TypedDict):
        document_id: int
        tokens: list[int]

    class DecodedTokenDocument(TypedDict):
        document_id: int
        tokens: np.ndarray
        shard: int

    # The type parameters and method annotations below are optional.
    class TokenDocumentFormat(DocumentStorageFormat[TokenDocument, DecodedTokenDocument]):
        prefix = struct.Struct("<I")

        def pack(self, data: TokenDocument) -> bytes:
            return self.prefix.pack(data["document_id"]) + np.asarray(data["tokens"], dtype="<i4").tobytes()

        def unpack(self, encoded_data, shard: int) -> DecodedTokenDocument:
            (document_id,) = self.prefix.unpack_from(encoded_data)
            tokens = np.frombuffer(encoded_data, dtype="<i4", offset=self.prefix.size)
            return {"document_id": document_id, "tokens": tokens, "shard": shard}

    with TemporaryDirectory() as directory:
        storage = DocumentStorage(Path(directory), TokenDocumentFormat())
        with storage.sync_writer() as writer:
            writer.append(0, {"document_id": 7, "tokens": [10, 11, 12]})
        with storage.sync_reader() as reader:
            assert reader.read(0)["tokens"].tolist() == [10, 11, 12]
# fmt: on
