"""The loader with records of a RecordSchema: media decoded in worker processes before the collate, some fields read,
records that fail to decode named or skipped, and resumption exact as for any record."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch
from PIL import Image as PILImage

from guideloom import DocumentStorage, Mixture, StatefulDataLoader
from guideloom.collate import pad
from guideloom.fields import Audio, Image, ImageValue, RecordSchema, Text
from tests.fields.media_files import image_bytes, sound_bytes
from tests.helpers.batches import assert_resumes_exactly, comparable

SCHEMA = RecordSchema(caption=Text(), image=Image(), sound=Audio(optional=True))
COUNT = 24
DAMAGED = (1, 2)  # (shard, record): its PNG is cut short after its header


def originals() -> list[dict[str, Any]]:
    records = []
    for number in range(COUNT):
        format = ("JPEG", "PNG", "WEBP")[number % 3]
        record = {"caption": f"caption {number}", "image": image_bytes(16 + number, 12, format, seed=number)}
        if number % 4 == 0:
            record["sound"] = sound_bytes(100 + number, 2, seed=number)
        records.append(record)
    return records


def write(path: Path, damaged: bool = False) -> DocumentStorage:
    storage = DocumentStorage(path, SCHEMA)
    with storage.sync_writer() as writer:
        for number, record in enumerate(originals()):
            shard, index = divmod(number, COUNT // 2)
            if damaged and (shard, index) == DAMAGED:
                png = image_bytes(30, 20, "PNG")
                record = {**record, "image": png[: len(png) // 2]}
            writer.append(shard, record)
    return storage


def as_lists(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch of decoded records in plain values (the collate: what travels back from the workers)."""
    return comparable(records)  # type: ignore[no-any-return]


def expected_pixels(data: bytes) -> list[Any]:
    image = PILImage.open(io.BytesIO(data))
    return np.asarray(image.convert("RGB" if image.mode != "RGBA" else "RGBA")).tolist()


def test_decode_gives_the_collate_decoded_media_from_the_workers(storage_path: Path) -> None:
    storage = write(storage_path)
    batches: list[list[dict[str, Any]]] = []
    with StatefulDataLoader.from_storage(
        storage, as_lists, device="cpu", local_batch_size=5, num_workers=2, decode=True
    ) as loader:
        batches = list(loader)
    records = [record for batch in batches for record in batch]
    assert len(records) == COUNT
    for record, original in zip(records, originals(), strict=True):
        assert record["caption"] == original["caption"]
        assert record["image"] == expected_pixels(original["image"])
        if "sound" in original:
            samples, _ = soundfile.read(io.BytesIO(original["sound"]), dtype="float32", always_2d=True)
            assert record["sound"] == samples.tolist()
        else:
            assert record["sound"] is None


def image_size_and_process(value: ImageValue) -> tuple[int, int, int]:
    pixels = value.decode()
    return pixels.shape[0], pixels.shape[1], os.getpid()


def test_a_field_s_function_runs_on_its_value_in_the_workers(storage_path: Path) -> None:
    storage = write(storage_path)
    with StatefulDataLoader.from_storage(
        storage, list, device="cpu", local_batch_size=4, num_workers=2, decode={"image": image_size_and_process}
    ) as loader:
        records = [record for batch in loader for record in batch]
    assert [record["image"][:2] for record in records] == [(12, 16 + number) for number in range(COUNT)]
    assert {record["image"][2] for record in records} - {os.getpid()} == {record["image"][2] for record in records}
    assert all(record["sound"] is None or record["sound"].frames > 0 for record in records)  # left undecoded


def test_fields_reads_only_those_fields(storage_path: Path) -> None:
    storage = write(storage_path)
    with StatefulDataLoader.from_storage(
        storage, list, device="cpu", local_batch_size=6, num_workers=2, fields=("caption",), decode=True
    ) as loader:
        records = [record for batch in loader for record in batch]
    assert records == [{"caption": f"caption {number}"} for number in range(COUNT)]


def test_a_record_that_fails_to_decode_is_named(storage_path: Path) -> None:
    storage = write(storage_path, damaged=True)
    with (
        StatefulDataLoader.from_storage(
            storage, as_lists, device="cpu", local_batch_size=5, num_workers=2, decode=True
        ) as loader,
        pytest.raises(Exception, match="cannot decode field 'image' of record 2 of shard 1: Pillow cannot"),
    ):
        list(loader)


def test_skipping_leaves_the_same_records_out_on_every_run(storage_path: Path) -> None:
    storage = write(storage_path, damaged=True)

    skipped: list[int | float] = []

    def run(**decoding: Any) -> list[list[str]]:
        with StatefulDataLoader.from_storage(
            storage,
            lambda records: [record["caption"] for record in records],
            device="cpu",
            local_batch_size=5,
            num_workers=2,
            shuffle=True,
            seed=3,
            **decoding,
        ) as loader:
            batches = list(loader)
            skipped.append(loader.metrics()["skipped_records"])
            return batches

    batches = run(decode=True, on_decode_error="skip")
    damaged = f"caption {DAMAGED[0] * COUNT // 2 + DAMAGED[1]}"
    assert batches == [[caption for caption in batch if caption != damaged] for batch in run()]
    assert sum(map(len, batches)) == COUNT - 1
    assert run(decode=True, on_decode_error="skip") == batches
    assert skipped == [1, 0, 1]  # counted in loader.metrics(), from the worker that skipped it


def test_resuming_with_decoded_media_and_workers_is_exact(storage_path: Path) -> None:
    storage = write(storage_path)

    def open_loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, as_lists, device="cpu", local_batch_size=3, num_workers=2, shuffle=True, seed=11, decode=True
        )

    assert_resumes_exactly(open_loader, 12, [1, 5, 9])


def test_decode_needs_a_schema_and_known_fields(storage_path: Path, tmp_path: Path) -> None:
    storage = write(storage_path)
    with pytest.raises(ValueError, match="decode names field 'picture'"):
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, decode={"picture": torch.tensor})
    with pytest.raises(ValueError, match="on_decode_error must be 'raise' or 'skip'"):
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, decode=True, on_decode_error="x")
    with pytest.raises(ValueError, match="the schema has no field 'text'"):
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, fields=("text",))
    from guideloom import DocumentJsonFormat

    json_storage = DocumentStorage(tmp_path / "json", DocumentJsonFormat())
    with json_storage.sync_writer() as writer:
        writer.append(0, {"a": 1})
    with pytest.raises(ValueError, match=r"read records of a guideloom\.fields\.RecordSchema"):
        StatefulDataLoader.from_storage(json_storage, device="cpu", local_batch_size=2, decode=True)


def test_pad_stacks_lists_and_pads_decoded_media(storage_path: Path) -> None:
    storage = write(storage_path)
    same_size = RecordSchema(image=Image(), sound=Audio())
    with DocumentStorage(storage_path.parent / "same", same_size).sync_writer() as writer:
        for number in range(3):
            writer.append(
                0, {"image": image_bytes(8, 6, "PNG", seed=number), "sound": sound_bytes(50 + 10 * number, 2)}
            )
    with StatefulDataLoader.from_storage(
        DocumentStorage(storage_path.parent / "same", same_size), pad(), device="cpu", local_batch_size=3, decode=True
    ) as loader:
        (batch,) = list(loader)
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (3, 6, 8, 3)
    assert batch["sound"].shape == (3, 70, 2) and batch["sound_lengths"].tolist() == [50, 60, 70]
    assert batch["sound_attention_mask"].sum(dim=1).tolist() == [50, 60, 70]
    assert batch["sound"][0, 50:].abs().sum() == 0
    with StatefulDataLoader.from_storage(
        storage, pad(), device="cpu", local_batch_size=3, fields=("caption", "image"), decode=True
    ) as loader:
        batch = next(iter(loader))
    assert isinstance(batch["image"], list) and [image.shape for image in batch["image"]] == [
        (12, 16, 3),
        (12, 17, 3),
        (12, 18, 3),
    ]
    assert batch["image_sizes"].tolist() == [[12, 16], [12, 17], [12, 18]]
    assert batch["caption"] == ["caption 0", "caption 1", "caption 2"]


def test_a_mixture_of_schema_storages_reads_some_fields_and_decodes(storage_path: Path, tmp_path: Path) -> None:
    first, second = write(storage_path), write(tmp_path / "second")
    mixture = Mixture({"first": first, "second": second}, {"first": 1, "second": 1}, block_size=4)
    with StatefulDataLoader.from_storage(
        mixture, list, device="cpu", local_batch_size=4, fields=("image",), decode=True, num_workers=2
    ) as loader:
        records = [record for batch in loader for record in batch]
    assert records and all(set(record) == {"image"} for record in records)
    assert all(isinstance(record["image"], torch.Tensor) for record in records)


def test_an_elastic_resume_with_decoded_media_reads_every_record_once(storage_path: Path) -> None:
    """Two ranks read two steps each; one rank resumes from their state and reads the rest of the epoch."""
    storage = write(storage_path)

    def captions(records: list[dict[str, Any]]) -> list[str]:
        assert all(isinstance(record["image"], torch.Tensor) for record in records)
        return [record["caption"] for record in records]

    def open_loader(rank: int, world_size: int) -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage,
            captions,
            device="cpu",
            local_batch_size=3,
            shuffle=True,
            seed=4,
            rank=rank,
            world_size=world_size,
            num_workers=2,
            decode=True,
        )

    before, states = [], []
    for rank in range(2):
        with open_loader(rank, 2) as loader:
            batches = iter(loader)
            before += [caption for _ in range(2) for caption in next(batches)]
            states.append(loader.state_dict())
    assert states[0] == states[1]
    with open_loader(0, 1) as loader:
        loader.load_state_dict(states[0])
        after = [caption for batch in loader for caption in batch]
    assert sorted(before + after) == sorted(f"caption {number}" for number in range(COUNT))


def test_a_record_left_out_is_logged_with_why(storage_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = write(storage_path, damaged=True)
    with StatefulDataLoader.from_storage(
        storage, list, device="cpu", local_batch_size=COUNT, decode=True, on_decode_error="skip"
    ) as loader:
        (batch,) = list(loader)
    assert len(batch) == COUNT - 1
    (message,) = [record.getMessage() for record in caplog.records if record.name == "guideloom"]
    assert "left out a record: cannot decode field 'image' of record 2 of shard 1" in message
