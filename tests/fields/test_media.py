"""Media fields: stored as the encoded bytes given, their metadata recorded at write time, decoded on request."""

from __future__ import annotations

import io
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from PIL import Image as PILImage

from guideloom import DocumentStorage, RecordPackError
from guideloom.fields import Audio, AudioValue, Image, Images, ImageValue, MediaDecodeError, RecordSchema, Text, Video
from tests.fields.media_files import decoded_video, image_bytes, sound_bytes, video_bytes
from tests.fields.records import write

MEDIA = RecordSchema(caption=Text(), image=Image(optional=True), sound=Audio(optional=True), clip=Video(optional=True))


def read_all(storage: DocumentStorage) -> list[dict[str, object]]:
    with storage.sync_reader() as reader:
        return [reader.read(index) for index in range(len(reader))]


@pytest.mark.parametrize(("format", "mode"), [("JPEG", "RGB"), ("PNG", "RGBA"), ("PNG", "L"), ("WEBP", "RGB")])
def test_an_image_reads_back_its_bytes_metadata_and_pixels(storage_path: Path, format: str, mode: str) -> None:
    data = image_bytes(37, 21, format, mode)
    (record,) = read_all(write(storage_path, MEDIA, [{"caption": "a", "image": data}]))
    image = record["image"]
    assert isinstance(image, ImageValue)
    original = PILImage.open(io.BytesIO(data))
    assert (image.width, image.height, image.mode, image.format) == (*original.size, original.mode, format.lower())
    assert isinstance(image.data, memoryview) and image.data.readonly and bytes(image.data) == data
    pixels = np.asarray(original.convert(original.mode))
    expected = pixels[:, :, None] if pixels.ndim == 2 else pixels
    decoded = image.decode()
    assert decoded.dtype == torch.uint8 and np.array_equal(decoded.numpy(), expected)
    assert np.array_equal(np.asarray(image.pil()), pixels)


def _jpegs() -> list[bytes]:
    """JPEGs of each kind Pillow reads: grey, colour, CMYK, progressive, with EXIF and a comment, multi-picture."""
    picture = PILImage.fromarray(np.random.default_rng(0).integers(0, 255, (21, 37, 3), dtype=np.uint8))
    made = []
    for mode in ("L", "RGB", "CMYK"):
        for options in ({}, {"progressive": True, "exif": PILImage.Exif().tobytes(), "comment": b"a comment"}):
            encoded = io.BytesIO()
            picture.convert(mode).save(encoded, "JPEG", **options)
            made.append(encoded.getvalue())
    encoded = io.BytesIO()
    picture.save(encoded, "MPO", save_all=True, append_images=[picture])
    return [*made, encoded.getvalue()]


@pytest.mark.parametrize("data", _jpegs())
def test_a_jpeg_s_metadata_is_what_pillow_reads(storage_path: Path, data: bytes) -> None:
    (record,) = read_all(write(storage_path, MEDIA, [{"caption": "a", "image": data}]))
    image = record["image"]
    with PILImage.open(io.BytesIO(data)) as original:
        assert (image.width, image.height, image.mode, image.format) == (
            *original.size,
            original.mode,
            original.format.lower(),
        )


@pytest.mark.parametrize(("format", "channels"), [("FLAC", 1), ("WAV", 2), ("OGG", 2)])
def test_a_clip_reads_back_its_metadata_and_samples(storage_path: Path, format: str, channels: int) -> None:
    data = sound_bytes(3000, channels, 22050, format) if format != "OGG" else _ogg(3000, channels)
    (record,) = read_all(write(storage_path, MEDIA, [{"caption": "a", "sound": data}]))
    sound = record["sound"]
    info = soundfile.info(io.BytesIO(data))
    assert isinstance(sound, AudioValue)
    assert (sound.sample_rate, sound.channels, sound.frames) == (info.samplerate, info.channels, info.frames)
    assert sound.format == format.lower() and bytes(sound.data) == data
    expected, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    decoded = sound.decode()
    assert decoded.dtype == torch.float32 and np.array_equal(decoded.numpy(), expected)


def _ogg(frames: int, channels: int) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, np.zeros((frames, channels), np.float32), 16000, format="OGG", subtype="VORBIS")
    return out.getvalue()


@pytest.mark.parametrize("container", ["mp4", "webm"])
def test_a_video_reads_back_its_metadata_and_the_frames_asked(storage_path: Path, container: str) -> None:
    data = video_bytes(12, 64, 48, 10, container)
    (record,) = read_all(write(storage_path, MEDIA, [{"caption": "a", "clip": data}]))
    clip = record["clip"]
    assert (clip.width, clip.height, clip.frames, clip.fps, clip.format) == (64, 48, 12, 10.0, container)
    every = decoded_video(data)
    assert np.array_equal(clip.decode().numpy(), every)
    assert np.array_equal(clip.decode(frames=[5, 1, 5]).numpy(), every[[5, 1, 5]])
    assert np.array_equal(clip.decode(fps=5).numpy(), every[[0, 2, 4, 6, 8, 10]])
    assert clip.decode(frames=[]).shape == (0, 48, 64, 3)
    with pytest.raises(IndexError, match="frame 12 is out of range"):
        clip.decode(frames=[12])


def test_media_are_taken_from_paths_pil_images_and_arrays(storage_path: Path, tmp_path: Path) -> None:
    jpeg = image_bytes(30, 20, "JPEG")
    (tmp_path / "photo.jpg").write_bytes(jpeg)
    pixels = np.random.default_rng(1).integers(0, 256, (8, 9, 3), np.uint8)
    samples = np.random.default_rng(2).integers(-(2**15), 2**15, (500, 2), np.int16)
    schema = RecordSchema(
        image=Image(), jpeg=Image(encode="jpeg", quality=90, optional=True), sound=Audio(optional=True)
    )
    records = [
        {"image": tmp_path / "photo.jpg"},
        {"image": PILImage.fromarray(pixels), "jpeg": pixels},
        {"image": pixels, "sound": (samples, 8000)},
    ]
    from_path, from_pil, from_array = read_all(write(storage_path, schema, records))
    assert bytes(from_path["image"].data) == jpeg and from_path["image"].format == "jpeg"
    assert from_pil["image"].format == "png" and np.array_equal(from_pil["image"].decode().numpy(), pixels)
    assert from_pil["jpeg"].format == "jpeg" and from_pil["jpeg"].decode().shape == (8, 9, 3)
    assert np.array_equal(from_array["image"].decode().numpy(), pixels)
    sound = from_array["sound"]
    assert (sound.sample_rate, sound.channels, sound.frames, sound.format) == (8000, 2, 500, "wav")
    assert np.array_equal(sound.decode().numpy(), samples.astype(np.float32) / 2**15)


def test_an_images_field_reads_as_a_list_of_images(storage_path: Path) -> None:
    schema = RecordSchema(text=Text(), images=Images())
    pictures = [image_bytes(10, 12, "PNG"), image_bytes(5, 6, "JPEG", seed=3)]
    (record,) = read_all(write(storage_path, schema, [{"text": "a <image> b <image>", "images": pictures}]))
    assert [(image.width, image.height, image.format) for image in record["images"]] == [
        (10, 12, "png"),
        (5, 6, "jpeg"),
    ]
    assert [bytes(image.data) for image in record["images"]] == pictures


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"image": b"not an image"}, "field 'image': Pillow cannot read it"),
        ({"sound": b"RIFF nonsense"}, "field 'sound': soundfile cannot read it"),
        ({"clip": b"\x00\x00\x00\x18ftypmp42 broken"}, "field 'clip': PyAV cannot read it"),
        ({"image": "photo.jpg"}, "field 'image': got a str: give a medium's bytes, or its file as a pathlib.Path"),
        ({"image": Path("/nonexistent/photo.jpg")}, "field 'image': cannot read /nonexistent/photo.jpg"),
        ({"sound": (np.zeros(10, np.float32), 0)}, "field 'sound': expected a positive int sample rate"),
    ],
)
def test_an_unreadable_medium_is_named_when_written(
    storage_path: Path, record: dict[str, object], message: str
) -> None:
    storage = DocumentStorage(storage_path, MEDIA)
    with pytest.raises(RecordPackError, match="record 0 of shard 3") as raised, storage.sync_writer() as writer:
        writer.append(3, {"caption": "a", **record})
    assert raised.match(message)


def _damaged_storage(path: Path) -> DocumentStorage:
    """A storage whose second record holds a PNG cut short after its header (its metadata reads, its pixels not)."""
    png = image_bytes(40, 30, "PNG")
    storage = write(path, MEDIA, [{"caption": "a", "image": png}])
    with storage.sync_writer() as writer:
        record = {"caption": "b", "image": png[: len(png) // 2]}
        writer.append(1, record)
    return storage


def test_a_medium_that_fails_to_decode_is_named_by_shard_record_and_field(storage_path: Path) -> None:
    _, damaged = read_all(_damaged_storage(storage_path))
    assert damaged["image"].width == 40  # the header was whole
    with pytest.raises(MediaDecodeError, match="cannot decode field 'image' of record 0 of shard 1: Pillow cannot"):
        damaged["image"].decode()


def test_decompression_bombs_are_refused_by_the_pixel_limit(
    storage_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (record,) = read_all(write(storage_path, MEDIA, [{"caption": "a", "image": image_bytes(300, 200, "PNG")}]))
    with pytest.raises(MediaDecodeError, match="60000 pixels exceed the limit of 59999"):
        record["image"].decode(max_pixels=59_999)
    assert record["image"].decode(max_pixels=None).shape == (200, 300, 3)
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 50_000)
    with pytest.raises(MediaDecodeError, match="exceed the limit of 50000"):
        record["image"].decode()
    with pytest.raises(MediaDecodeError, match="exceed the limit of 50000"):
        record["image"].pil()


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` RGB pixels, its data one empty compressed stream."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_a_bomb_s_header_is_recorded_and_its_pixels_refused(storage_path: Path) -> None:
    (record,) = read_all(write(storage_path, MEDIA, [{"caption": "a", "image": _png_claiming(100_000, 50_000)}]))
    assert (record["image"].width, record["image"].height) == (100_000, 50_000)
    limit = PILImage.MAX_IMAGE_PIXELS
    with pytest.raises(
        MediaDecodeError, match=f"record 0 of shard 0: its .* 5000000000 pixels exceed the limit of {limit}"
    ):
        record["image"].decode()
    with pytest.raises(MediaDecodeError, match="5000000000 pixels exceed the limit of 1000000"):
        record["image"].decode(max_pixels=1_000_000)


def test_a_value_pickles_with_a_copy_of_its_bytes(storage_path: Path) -> None:
    (record,) = read_all(write(storage_path, MEDIA, [{"caption": "a", "image": image_bytes(9, 7, "PNG")}]))
    copy = pickle.loads(pickle.dumps(record["image"]))
    assert copy == record["image"] and copy.origin == (0, 0, "image")
    assert np.array_equal(copy.decode().numpy(), record["image"].decode().numpy())


@pytest.mark.parametrize("container", ["mp4", "webm"])
def test_frames_far_into_a_video_decode_as_decoding_it_all_does(storage_path: Path, container: str) -> None:
    """A clip of 60 frames with a keyframe every 8: the decode seeks to the one before the first frame asked."""
    data = video_bytes(60, 32, 24, 25, container, keyframes_every=8)
    (record,) = read_all(write(storage_path, MEDIA, [{"caption": "a", "clip": data}]))
    every = decoded_video(data)
    assert len(every) == record["clip"].frames == 60
    for frames in ([59], [41, 17, 41], [8, 9, 16], [1], [30, 0]):
        assert np.array_equal(record["clip"].decode(frames=frames).numpy(), every[frames]), frames
    assert np.array_equal(record["clip"].decode(fps=5).numpy(), every[::5])
