"""Images resized and converted while they decode (``decode(size=, mode=)``), and those options given to the loader
(``decode={"image": {"size": ..., "mode": ...}}``), which decodes in its workers."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from guideloom import StatefulDataLoader
from guideloom.collate import pad
from guideloom.fields import Image, Images, RecordSchema, Text
from tests.fields.media_files import image_bytes
from tests.fields.test_schema import write


def photo(width: int, height: int, seed: int = 0) -> bytes:
    """A JPEG of a gradient under a little noise: smooth, as photos are, so scaled versions of it agree."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None] * rng.uniform(0.3, 1, 3)
    pixels = np.clip(ramp + rng.normal(0, 4, (height, width, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    PILImage.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


def test_size_resizes_as_pillow_s_bilinear_does_to_within_one(tmp_path: Path) -> None:
    data = image_bytes(90, 60, "PNG", seed=3)
    storage = write(tmp_path / "s", RecordSchema(image=Image()), [{"image": data}])
    with storage.sync_reader() as reader:
        pixels = reader.read(0)["image"].decode(size=(40, 50)).numpy()
    expected = np.asarray(PILImage.open(io.BytesIO(data)).resize((50, 40), PILImage.Resampling.BILINEAR))
    assert pixels.shape == (40, 50, 3) and pixels.flags.writeable
    assert np.abs(pixels.astype(int) - expected).max() <= 1


def test_a_large_jpeg_decoded_at_a_reduced_scale_looks_as_the_full_decode_resized(tmp_path: Path) -> None:
    data = photo(400, 300)
    storage = write(tmp_path / "s", RecordSchema(image=Image()), [{"image": data}])
    with storage.sync_reader() as reader:
        image = reader.read(0)["image"]
        scaled = image.decode(size=64).numpy().astype(int)
        full = image.decode().numpy()
    expected = np.asarray(PILImage.fromarray(full).resize((64, 64), PILImage.Resampling.BILINEAR)).astype(int)
    assert scaled.shape == (64, 64, 3)
    assert np.abs(scaled - expected).mean() < 2


def test_mode_converts_and_a_size_that_fits_is_kept(tmp_path: Path) -> None:
    gray, color = image_bytes(20, 10, "PNG", mode="L"), image_bytes(20, 10, "PNG", mode="RGBA")
    storage = write(tmp_path / "s", RecordSchema(image=Image()), [{"image": gray}, {"image": color}])
    with storage.sync_reader() as reader:
        as_rgb = reader.read(0)["image"].decode(mode="RGB", size=(10, 20)).numpy()
        as_gray = reader.read(1)["image"].decode(mode="L").numpy()
    expected_gray = np.asarray(PILImage.open(io.BytesIO(gray)))
    assert as_rgb.shape == (10, 20, 3) and all(np.array_equal(as_rgb[:, :, k], expected_gray) for k in range(3))
    assert np.array_equal(as_gray[:, :, 0], np.asarray(PILImage.open(io.BytesIO(color)).convert("L")))


@pytest.mark.parametrize(
    ("options", "error"),
    [({"size": 0}, "size must be"), ({"size": (3, 4, 5)}, "size must be"), ({"mode": "P"}, "mode")],
)
def test_bad_options_are_named(tmp_path: Path, options: dict[str, object], error: str) -> None:
    storage = write(tmp_path / "s", RecordSchema(image=Image()), [{"image": image_bytes(8, 8, "PNG")}])
    with storage.sync_reader() as reader, pytest.raises(ValueError, match=error):
        reader.read(0)["image"].decode(**options)  # type: ignore[arg-type]


def test_the_loader_decodes_with_the_options_given_in_its_workers(tmp_path: Path) -> None:
    schema = RecordSchema(caption=Text(), image=Image(), pages=Images())
    records = [
        {
            "caption": f"record {number}",
            "image": image_bytes(10 + 7 * number, 9 + number, ("JPEG", "PNG")[number % 2], ("RGB", "L")[number % 2]),
            "pages": [image_bytes(5 + number, 6, "PNG", "L"), photo(30, 20 + number, seed=number)],
        }
        for number in range(6)
    ]
    storage = write(tmp_path / "s", schema, records)
    decode = {"image": {"size": 12, "mode": "RGB"}, "pages": {"size": (8, 6)}}
    with StatefulDataLoader.from_storage(
        storage, pad(), device="cpu", local_batch_size=3, num_workers=2, decode=decode
    ) as loader:
        batches = list(loader)
    assert [batch["image"].shape for batch in batches] == [(3, 12, 12, 3)] * 2
    assert [[tuple(page.shape) for page in pages] for batch in batches for pages in batch["pages"]] == [
        [(8, 6, 1), (8, 6, 3)]
    ] * 6


def test_options_are_checked_where_the_loader_is_made(tmp_path: Path) -> None:
    storage = write(
        tmp_path / "s", RecordSchema(caption=Text(), image=Image()), [{"caption": "a", "image": image_bytes(8, 8)}]
    )
    with pytest.raises(TypeError, match=r"decode\['image'\]: ImageValue.decode\(\) .*'sise'"):
        StatefulDataLoader.from_storage(storage, pad(), device="cpu", decode={"image": {"sise": 8}})
    with pytest.raises(ValueError, match="field 'caption' is not a media field"):
        StatefulDataLoader.from_storage(storage, pad(), device="cpu", decode={"caption": {"size": 8}})
