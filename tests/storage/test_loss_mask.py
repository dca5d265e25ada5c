"""Masked token storages: a loss mask per token, stored beside the tokens, checked, recorded in the header."""

from __future__ import annotations

import asyncio
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from guideloom import CorruptStorageError, DocumentJsonFormat, DocumentStorage, FormatMismatchError, TokenStorage
from guideloom._cli import main
from guideloom._shards.layout import FOOTER
from tests.helpers.shard_files import FOOTER_FIELDS, footer_fields, rewrite_footer, shard_file

DOCUMENTS = [[5, 6, 7], [], [8, 9, 10, 11, 12, 13, 14, 15, 16], [17]]
MASKS = [[0, 1, 1], [], [True, False, True, True, False, False, True, True, True], [1]]


def write_masked(path: Path, shards: tuple[int, ...] = (0,), dtype: str = "uint16") -> TokenStorage:
    """The documents above in each of ``shards``, with their masks."""
    storage = TokenStorage(path, dtype, loss_mask=True)
    with storage.sync_writer() as writer:
        for shard in shards:
            for tokens, mask in zip(DOCUMENTS, MASKS, strict=True):
                writer.append(shard, tokens, loss_mask=mask)
    return storage


def test_masks_read_back_as_written(tmp_path: Path) -> None:
    storage = write_masked(tmp_path / "sft", shards=(0, 3))
    with storage.sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == DOCUMENTS * 2
        masks = [reader.loss_mask(i) for i in range(len(reader))]
    assert all(mask.dtype == np.bool_ for mask in masks)
    assert [mask.tolist() for mask in masks] == [[bool(value) for value in mask] for mask in MASKS] * 2


@pytest.mark.parametrize("length", [1, 7, 8, 9, 63, 64, 65, 1000])
def test_masks_of_every_length_and_bit_offset_round_trip(tmp_path: Path, length: int) -> None:
    rng = np.random.default_rng(length)
    documents = [rng.integers(0, 1000, int(rng.integers(0, length + 1))) for _ in range(12)]
    masks = [rng.random(len(tokens)) < 0.5 for tokens in documents]
    storage = TokenStorage(tmp_path / "sft", loss_mask=True)
    with storage.sync_writer() as writer:
        for tokens, mask in zip(documents, masks, strict=True):
            writer.append(0, tokens, loss_mask=mask)
    with storage.sync_reader() as reader:
        assert [reader.loss_mask(i).tolist() for i in range(len(reader))] == [mask.tolist() for mask in masks]


@pytest.mark.parametrize(
    "mask",
    [
        [True, False, True],
        [1, 0, 1],
        np.array([1, 0, 1], np.uint8),
        np.array([True, False, True]),
        torch.tensor([1, 0, 1]),
        torch.tensor([True, False, True]),
    ],
    ids=["bools", "ints", "uint8", "numpy-bool", "tensor-int", "tensor-bool"],
)
def test_masks_take_bools_or_zero_one_integers(tmp_path: Path, mask: object) -> None:
    storage = TokenStorage(tmp_path / "sft", loss_mask=True)
    with storage.sync_writer() as writer:
        writer.append(0, [1, 2, 3], loss_mask=mask)
    with storage.sync_reader() as reader:
        assert reader.loss_mask(0).tolist() == [True, False, True]


def test_the_header_records_the_mask_and_none_opens_as_recorded(tmp_path: Path) -> None:
    write_masked(tmp_path / "sft")
    assert json.loads((tmp_path / "sft" / "guideloom.json").read_text())["loss_mask"] is True
    reopened = TokenStorage(tmp_path / "sft")
    assert reopened.loss_mask is True
    with reopened.sync_reader() as reader:
        assert reader.loss_mask(0).tolist() == [False, True, True]


def test_a_new_storage_is_unmasked_by_default(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "plain")
    with storage.sync_writer() as writer:
        writer.append(0, [1, 2])
    assert storage.loss_mask is False
    assert "loss_mask" not in json.loads((tmp_path / "plain" / "guideloom.json").read_text())


@pytest.mark.parametrize("masked, asked", [(True, False), (False, True)])
def test_a_contradicting_loss_mask_is_a_format_mismatch(tmp_path: Path, masked: bool, asked: bool) -> None:
    storage = TokenStorage(tmp_path / "tokens", loss_mask=masked)
    with storage.sync_writer() as writer:
        writer.append(0, [1, 2], **({"loss_mask": [1, 1]} if masked else {}))
    with pytest.raises(FormatMismatchError, match="loss mask"):
        TokenStorage(tmp_path / "tokens", loss_mask=asked)


def test_loss_mask_must_be_a_bool_or_none(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="loss_mask"):
        TokenStorage(tmp_path / "tokens", loss_mask=1)  # type: ignore[arg-type]


def test_a_mask_of_the_wrong_length_is_refused_and_nothing_is_appended(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "sft", loss_mask=True)
    with storage.sync_writer() as writer:
        writer.append(0, [1, 2, 3], loss_mask=[1, 1, 1])
        with pytest.raises(ValueError, match=r"loss_mask has 2 values.*3 tokens"):
            writer.append(0, [4, 5, 6], loss_mask=[1, 0])
    with storage.sync_reader() as reader:
        assert len(reader) == 1
        assert reader.loss_mask(0).tolist() == [True, True, True]


def test_a_masked_storage_requires_a_mask(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "sft", loss_mask=True)
    with storage.sync_writer() as writer, pytest.raises(ValueError, match="loss_mask"):
        writer.append(0, [1, 2, 3])


@pytest.mark.parametrize("kind", ["tokens", "documents"])
def test_an_unmasked_storage_refuses_a_mask(tmp_path: Path, kind: str) -> None:
    documents = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    storage = TokenStorage(tmp_path / "plain") if kind == "tokens" else documents
    data = [1, 2, 3] if kind == "tokens" else {"a": 1}
    with storage.sync_writer() as writer, pytest.raises(ValueError, match="loss_mask"):
        writer.append(0, data, loss_mask=[1, 1, 1])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "mask, error",
    [([0, 2, 1], ValueError), ([-1, 0, 1], ValueError), ([0.0, 1.0, 1.0], TypeError), ("101", TypeError)],
)
def test_a_mask_that_is_not_bools_or_zero_one_is_refused(tmp_path: Path, mask: object, error: type) -> None:
    storage = TokenStorage(tmp_path / "sft", loss_mask=True)
    with storage.sync_writer() as writer, pytest.raises(error, match="loss_mask"):
        writer.append(0, [1, 2, 3], loss_mask=mask)


def test_reading_the_mask_of_an_unmasked_storage_is_an_error(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "plain")
    with storage.sync_writer() as writer:
        writer.append(0, [1, 2])
    with storage.sync_reader() as reader, pytest.raises(ValueError, match="loss_mask"):
        reader.loss_mask(0)


def test_reading_a_mask_out_of_range_is_an_index_error(tmp_path: Path) -> None:
    storage = write_masked(tmp_path / "sft")
    with storage.sync_reader() as reader, pytest.raises(IndexError):
        reader.loss_mask(len(reader))


def test_verify_names_the_shard_whose_mask_bit_flipped(tmp_path: Path) -> None:
    storage = write_masked(tmp_path / "sft", shards=(0, 1))
    assert storage.verify() == []
    file = shard_file(tmp_path / "sft", 1)
    data = bytearray(file.read_bytes())
    fields = footer_fields(file)
    records = fields[FOOTER_FIELDS.index("record_count")]
    data_size = fields[FOOTER_FIELDS.index("data_size")]
    mask_start = (data_size + 7) // 8 * 8 + 8 * (records + 1)
    data[mask_start] ^= 0b100  # token 2 of the shard: its mask bit
    file.write_bytes(bytes(data))
    problems = storage.verify()
    assert len(problems) == 1 and "shard 1" in problems[0]
    with TokenStorage(tmp_path / "sft").sync_reader() as reader:
        assert reader.loss_mask(len(DOCUMENTS)).tolist() != [False, True, True]  # read as stored: verify tells


def test_a_masked_shard_cut_short_is_corrupt(tmp_path: Path) -> None:
    write_masked(tmp_path / "sft")
    file = shard_file(tmp_path / "sft", 0)
    raw = file.read_bytes()
    mask_bytes = 8  # 13 tokens: 2 bytes of mask, padded to 8
    file.write_bytes(raw[: -FOOTER.size - mask_bytes] + raw[-FOOTER.size :])
    with TokenStorage(tmp_path / "sft").sync_reader() as reader, pytest.raises(CorruptStorageError, match="shard 0"):
        reader.read(0)  # opening reads the listing and the index; the shard is checked when first read


def test_a_shard_without_a_mask_in_a_masked_storage_is_refused(tmp_path: Path) -> None:
    """A shard's footer says whether it holds a mask: one that contradicts the header is never read."""
    write_masked(tmp_path / "sft")
    rewrite_footer(shard_file(tmp_path / "sft", 0), flags=0)
    storage = TokenStorage(tmp_path / "sft")
    with storage.sync_reader() as reader, pytest.raises(FormatMismatchError, match="shard 0 holds no loss mask"):
        reader.read(0)  # the shard is checked when first read


def write_the_0_2_way(path: Path, documents: list[list[int]]) -> None:
    """A token storage byte for byte as guideloom 0.2 wrote it: header without ``loss_mask``, footer flags 0."""
    header = json.dumps({"dtype": "uint16", "kind": "tokens", "layout_version": 1}, sort_keys=True).encode() + b"\n"
    (path / "shards").mkdir(parents=True)
    (path / "guideloom.json").write_bytes(header)
    data = np.concatenate([np.asarray(tokens, "<u2") for tokens in documents]).tobytes()
    offsets = np.concatenate([[0], np.cumsum([len(tokens) for tokens in documents])]).astype("<u8").tobytes()
    fields = [b"GLOOMSH1", 1, 0, 0, len(documents), len(data), zlib.crc32(data), zlib.crc32(offsets)]
    body = FOOTER.pack(*fields, zlib.crc32(header), 0)[: FOOTER.size - 12]
    padding = bytes((len(data) + 7) // 8 * 8 - len(data))
    footer = body + struct.pack("<I", zlib.crc32(body)) + bytes(8)
    shard_file(path, 0).write_bytes(data + padding + offsets + footer)


def test_a_storage_written_by_0_2_opens_unchanged(tmp_path: Path) -> None:
    write_the_0_2_way(tmp_path / "old", [[1, 2, 3], [4, 5]])
    header = (tmp_path / "old" / "guideloom.json").read_bytes()
    storage = TokenStorage(tmp_path / "old")
    assert storage.loss_mask is False and storage.verify() == []
    with storage.sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == [[1, 2, 3], [4, 5]]
    with storage.sync_writer() as writer:  # and it grows the 0.2 way
        writer.append(1, [6])
    assert (tmp_path / "old" / "guideloom.json").read_bytes() == header
    assert footer_fields(shard_file(tmp_path / "old", 1))[2] == 0


def test_a_mask_change_changes_the_fingerprint(tmp_path: Path) -> None:
    """A state taken over one mask is refused over another: the mask is part of the contents."""
    fingerprints = []
    for name, mask in (("a", [1, 0]), ("b", [1, 1])):
        storage = TokenStorage(tmp_path / name, loss_mask=True)
        with storage.sync_writer() as writer:
            writer.append(0, [1, 2], loss_mask=mask)
        with storage.sync_reader() as reader:
            fingerprints.append(reader.fingerprint.split("-")[0])
    assert fingerprints[0] != fingerprints[1]


def test_masks_are_eight_times_smaller_than_bytes(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "sft", "uint16", loss_mask=True)
    plain = TokenStorage(tmp_path / "plain", "uint16")
    tokens = np.arange(80_000) % 60_000
    with storage.sync_writer() as writer, plain.sync_writer() as plain_writer:
        writer.append(0, tokens, loss_mask=tokens % 3 == 0)
        plain_writer.append(0, tokens)
    sizes = [shard_file(tmp_path / name, 0).stat().st_size for name in ("sft", "plain")]
    assert sizes[0] - sizes[1] == 80_000 // 8


def test_the_async_writer_and_reader_carry_masks(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "sft", loss_mask=True)

    async def roundtrip() -> list[list[bool]]:
        async with storage.async_writer() as writer:
            await writer.append(0, [1, 2, 3], loss_mask=[0, 1, 0])
            await writer.append(0, [4], loss_mask=[1])
        async with storage.async_reader() as reader:
            return [(await reader.loss_mask(i)).tolist() for i in range(len(reader))]

    assert asyncio.run(roundtrip()) == [[False, True, False], [True]]


def test_a_writer_left_by_an_exception_commits_no_mask(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "sft", loss_mask=True)
    with pytest.raises(RuntimeError), storage.sync_writer() as writer:
        writer.append(0, [1, 2], loss_mask=[1, 0])
        raise RuntimeError("preprocessing failed")
    assert storage.committed_shards() == []


def test_inspect_shows_the_share_of_counted_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_masked(tmp_path / "sft", shards=(0, 1))
    assert main(["inspect", str(tmp_path / "sft")]) == 0
    assert "loss mask:  yes, 18 of 26 tokens count toward the loss (69.2%)" in capsys.readouterr().out


def test_inspect_of_an_unmasked_storage_says_nothing_of_masks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = TokenStorage(tmp_path / "plain")
    with storage.sync_writer() as writer:
        writer.append(0, [1, 2])
    assert main(["inspect", str(tmp_path / "plain")]) == 0
    assert "loss mask" not in capsys.readouterr().out


def test_the_verify_command_fails_on_a_flipped_mask_bit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_masked(tmp_path / "sft")
    file = shard_file(tmp_path / "sft", 0)
    data = bytearray(file.read_bytes())
    data[32 + 8 * 5] ^= 1  # 13 uint16 tokens padded to 32 bytes, 5 offsets, then the mask
    file.write_bytes(bytes(data))
    assert main(["verify", str(tmp_path / "sft")]) == 1
    assert "CORRUPT shard 0: data or loss mask checksum mismatch" in capsys.readouterr().out
