"""Every use of the media libraries (Pillow, soundfile, PyAV) in one place: metadata probed from headers at write
time, encoding PIL images and arrays once, and decoding to tensors on request.

Each library is imported when first needed, so ``guideloom.fields`` imports without the ``media`` extra; a
missing one is an ImportError naming the extra. Problems with the bytes themselves raise ``MediaProblem`` with
the decoder's message, which callers turn into errors naming the field, shard and record.
"""

from __future__ import annotations

import io
import threading
import warnings
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

IMAGE_FORMATS = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff"}
ENCODINGS = ("png", "jpeg", "webp")  # what an Image field encodes PIL images and arrays as
UINT8_MODES = ("L", "LA", "RGB", "RGBA")  # decoded as they are; others are converted (see ``decode_image``)


_PILLOW_LIMIT = threading.Lock()  # held while Pillow's own pixel limit is lifted to read a huge image's header


class MediaProblem(Exception):
    """The decoder cannot read these bytes (its message is kept), or an image exceeds the pixel limit."""


def _needs(module: str, package: str) -> Any:
    try:
        return __import__(module)
    except ImportError as error:
        raise ImportError(f"media fields need {package}: pip install 'guideloom[media]'") from error


def _pil() -> Any:
    _needs("PIL", "Pillow")
    from PIL import Image

    return Image


def _soundfile() -> Any:
    return _needs("soundfile", "soundfile")


def _av() -> Any:
    return _needs("av", "PyAV (av)")


def default_max_pixels() -> int | None:
    """The pixel limit of image decoding when none is given: Pillow's ``Image.MAX_IMAGE_PIXELS`` now."""
    limit = _pil().MAX_IMAGE_PIXELS
    return None if limit is None else int(limit)


# -- probing: metadata from the headers, nothing decoded ------------------------------------------------------------


def probe_image(data: bytes | memoryview) -> tuple[int, int, str, str]:
    """An image's width, height, mode and format (lower case), from its header alone."""
    plain_jpeg = _jpeg_frame(data)
    if plain_jpeg is not None:
        return (*plain_jpeg, "jpeg")
    image_module = _pil()
    try:
        try:
            width, height, mode, found = _image_header(image_module, data)
        except image_module.DecompressionBombError:  # Pillow refuses to open what it would refuse to decode
            with _PILLOW_LIMIT:  # nothing is decoded here: the limit applies when decoding (``open_image``)
                limit, image_module.MAX_IMAGE_PIXELS = image_module.MAX_IMAGE_PIXELS, None
                try:
                    width, height, mode, found = _image_header(image_module, data)
                finally:
                    image_module.MAX_IMAGE_PIXELS = limit
    except Exception as error:  # Pillow raises many kinds (UnidentifiedImageError, SyntaxError, OSError, ...)
        raise MediaProblem(f"Pillow cannot read it: {error}") from None
    if found is None:
        raise MediaProblem("Pillow cannot tell its format")
    return int(width), int(height), str(mode), IMAGE_FORMATS.get(found, str(found).lower())


_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}  # Pillow's mode by a JPEG's number of components
_JPEG_FRAMES = frozenset((0xC0, 0xC1, 0xC2))  # baseline, extended and progressive frames (Huffman-coded)


def _jpeg_frame(data: bytes | memoryview) -> tuple[int, int, str] | None:
    """A plain 8-bit JPEG's width, height and mode, read from its frame header as Pillow reads them (ten times
    faster than opening it with Pillow); None for anything else (another format, an unusual frame, a multi-picture
    file that Pillow opens as MPO), which Pillow then reads."""
    view = memoryview(data)
    size = len(view)
    if bytes(view[:2]) != b"\xff\xd8":
        return None
    position = 2
    while position + 4 <= size:
        if view[position] != 0xFF:
            return None
        marker = view[position + 1]
        if marker == 0xFF:  # a fill byte before a marker
            position += 1
            continue
        length = int.from_bytes(view[position + 2 : position + 4], "big")
        segment = view[position + 4 : position + 2 + length]
        if length < 2 or len(segment) != length - 2:
            return None
        if marker == 0xE2 and bytes(segment[:4]) == b"MPF\x00":
            return None
        if marker in _JPEG_FRAMES:
            if len(segment) < 6 or segment[0] != 8:
                return None
            height, width = int.from_bytes(segment[1:3], "big"), int.from_bytes(segment[3:5], "big")
            mode = _JPEG_MODES.get(segment[5])
            return None if mode is None or not width or not height else (width, height, mode)
        if not (
            0xE0 <= marker <= 0xEF or marker in (0xDB, 0xC4, 0xDD, 0xFE)
        ):  # APPn, tables, restart interval, comment
            return None
        position += 2 + length
    return None


def _image_header(image_module: Any, data: bytes | memoryview) -> tuple[int, int, str, str | None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", image_module.DecompressionBombWarning)
        with image_module.open(io.BytesIO(data)) as image:  # opening reads the header; nothing is decoded
            width, height = image.size
            return int(width), int(height), str(image.mode), image.format


def probe_audio(data: bytes | memoryview) -> tuple[int, int, int, str]:
    """A clip's sample rate, channels, frames and format (lower case), from its header alone."""
    soundfile = _soundfile()
    try:
        info = soundfile.info(io.BytesIO(data))
    except Exception as error:
        raise MediaProblem(f"soundfile cannot read it: {error}") from None
    frames = int(info.frames)
    if frames < 0 or frames >= 2**62:  # some MP3s report no frame count: count them by decoding once
        frames = len(decode_audio(data))
    return int(info.samplerate), int(info.channels), frames, str(info.format).lower()


def probe_video(data: bytes | memoryview) -> tuple[int, int, int, float, str]:
    """A video's width, height, frames, frames per second and container format: its packets are counted
    where the container does not say how many frames it holds, but no frame is decoded."""
    av = _av()
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaProblem("it holds no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            frames = int(stream.frames)
            if frames <= 0:
                frames = sum(1 for packet in container.demux(stream) if packet.size)
            width, height = int(stream.codec_context.width), int(stream.codec_context.height)
            names = str(container.format.name)
    except MediaProblem:
        raise
    except Exception as error:
        raise MediaProblem(f"PyAV cannot read it: {error}") from None
    return width, height, frames, float(rate) if rate else 0.0, _container_format(names, data)


def _container_format(names: str, data: bytes | memoryview) -> str:
    """``"mp4"``, ``"webm"``, ``"matroska"``, ... from the demuxer's names (``"mov,mp4,m4a,..."``)."""
    listed = names.split(",")
    if "mp4" in listed:
        return "mp4"
    if "webm" in listed:
        return "webm" if b"webm" in bytes(data[:64]) else "matroska"
    return listed[0]


# -- encoding once, at write time ------------------------------------------------------------------------------------


def is_pil_image(value: object) -> bool:
    """Whether ``value`` is a PIL image (False without Pillow installed, as nothing then is one)."""
    module = type(value).__module__
    if not module.startswith("PIL."):
        return False
    return isinstance(value, _pil().Image)


def encode_image(value: Any, encoding: str, quality: int | None) -> bytes:
    """A PIL image or a uint8 array ((height, width) or (height, width, 1 | 3 | 4)) encoded as ``encoding``."""
    image_module = _pil()
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (1, 3, 4)):
            raise ValueError(
                f"an image array must be uint8 of shape (height, width) or (height, width, 1, 3 or 4), "
                f"got {value.dtype} of shape {value.shape}"
            )
        array = value[:, :, 0] if value.ndim == 3 and value.shape[2] == 1 else value
        value = image_module.fromarray(np.ascontiguousarray(array))
    if encoding == "jpeg" and value.mode not in ("L", "RGB", "CMYK"):
        value = value.convert("RGB")
    options: dict[str, Any] = {} if quality is None else {"quality": quality}
    if encoding == "webp" and quality is None:
        options["lossless"] = True
    out = io.BytesIO()
    try:
        value.save(out, format=encoding.upper(), **options)
    except Exception as error:
        raise MediaProblem(f"Pillow cannot encode it as {encoding}: {error}") from None
    return out.getvalue()


def encode_audio(samples: np.ndarray, sample_rate: int) -> bytes:
    """An array of samples ((frames,) or (frames, channels)) as WAV: int16 and int32 as PCM of that width, floats
    as 32-bit float samples, so what decodes is what was given (float64 rounded to float32)."""
    soundfile = _soundfile()
    if samples.ndim not in (1, 2) or samples.dtype.kind not in "if":
        raise ValueError(
            f"audio samples must be an int16, int32 or float array of shape (frames,) or (frames, channels), "
            f"got {samples.dtype} of shape {samples.shape}"
        )
    subtypes = {np.dtype(np.int16): "PCM_16", np.dtype(np.int32): "PCM_32"}
    subtype = subtypes.get(samples.dtype, "FLOAT")
    if subtype == "FLOAT":
        if samples.dtype.kind != "f":
            raise ValueError(f"audio samples of {samples.dtype} are not stored: give int16, int32 or floats")
        samples = samples.astype(np.float32)
    out = io.BytesIO()
    try:
        soundfile.write(out, samples, sample_rate, format="WAV", subtype=subtype)
    except Exception as error:
        raise MediaProblem(f"soundfile cannot encode it: {error}") from None
    return out.getvalue()


# -- decoding on request ---------------------------------------------------------------------------------------------


def open_image(data: memoryview | bytes, max_pixels: int | None, draft: tuple[int, int] | None = None) -> Any:
    """The PIL image of ``data``, decoded (``load``), after its header showed at most ``max_pixels`` pixels.
    ``draft`` (width, height): a JPEG may be decoded at 1/2, 1/4 or 1/8 scale, still at least that large
    (Pillow's ``draft``, as its ``thumbnail`` does), which spares most of the decoding of a large image."""
    image_module = _pil()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", image_module.DecompressionBombWarning)  # the limit is checked below
            image = image_module.open(io.BytesIO(data))
    except image_module.DecompressionBombError as error:  # beyond twice Pillow's own limit
        raise MediaProblem(f"{error} (raise PIL.Image.MAX_IMAGE_PIXELS to decode it)") from None
    except Exception as error:
        raise MediaProblem(f"Pillow cannot read it: {error}") from None
    width, height = image.size
    if max_pixels is not None:
        try:
            check_pixels(width, height, max_pixels)
        except MediaProblem:
            image.close()
            raise
    try:
        if draft is not None and image.format == "JPEG" and width >= 2 * draft[0] and height >= 2 * draft[1]:
            image.draft(None, draft)
        image.load()
    except Exception as error:
        raise MediaProblem(f"Pillow cannot decode it: {error}") from None
    return image


def check_pixels(width: int, height: int, max_pixels: int) -> None:
    """Refuse an image of more than ``max_pixels`` pixels: a decompression bomb is never decoded."""
    if width * height > max_pixels:
        raise MediaProblem(
            f"its {width}x{height} = {width * height} pixels exceed the limit of {max_pixels} (a decompression bomb?); "
            "raise it with decode(max_pixels=...) or PIL.Image.MAX_IMAGE_PIXELS"
        )


def decode_image(
    data: memoryview | bytes, max_pixels: int | None, size: tuple[int, int] | None = None, mode: str | None = None
) -> torch.Tensor:
    """The image as a uint8 tensor (height, width, channels): L, LA, RGB and RGBA as they are, palette images as
    RGB (RGBA with transparency), 1-bit as L, others (CMYK, YCbCr, 16-bit, float) converted to RGB or L; in
    ``mode`` (one of those four) when given; resized to ``size`` (height, width) when given (``resized``), a JPEG
    decoded at a reduced scale first where it is at least twice that size."""
    import torch

    image = open_image(data, max_pixels, None if size is None else (size[1], size[0]))
    if mode is not None:
        if image.mode != mode:
            image = image.convert(mode)
    elif image.mode not in UINT8_MODES:
        if image.mode == "P":
            image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        elif image.mode in ("1", "I", "I;16", "I;16B", "I;16L", "F"):
            image = image.convert("L")
        else:
            image = image.convert("RGB")
    array = np.array(image)  # a writable copy: tensors over read-only memory warn
    if array.ndim == 2:
        array = array[:, :, None]
    pixels = torch.from_numpy(array)
    if size is not None and pixels.shape[:2] != size:
        pixels = resized(pixels, size)
    return pixels


def resized(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 pixels (height, width, channels) resized to ``size`` (height, width): bilinear, antialiased, within 1
    of Pillow's ``BILINEAR`` and about twice as fast (torch's vectorized kernel for uint8 images)."""
    import torch

    planes = pixels.permute(2, 0, 1)[None]  # channels last in memory, as that kernel takes them
    scaled = torch.nn.functional.interpolate(planes, size=size, mode="bilinear", antialias=True, align_corners=False)
    return scaled[0].permute(1, 2, 0).contiguous()


def decode_audio(data: memoryview | bytes) -> np.ndarray:
    """The clip's samples as float32 (frames, channels)."""
    soundfile = _soundfile()
    try:
        samples, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as error:
        raise MediaProblem(f"soundfile cannot decode it: {error}") from None
    return np.ascontiguousarray(samples)


def audio_tensor(data: memoryview | bytes) -> torch.Tensor:
    import torch

    return torch.from_numpy(decode_audio(data))


def video_frames_at_rate(frames: int, clip_fps: float, fps: float) -> list[int]:
    """The frame indices of a clip of ``frames`` at ``clip_fps`` sampled at ``fps``: the frame shown at each
    of the times 0, 1/fps, 2/fps, ... within the clip."""
    if clip_fps <= 0:
        raise MediaProblem("the video records no frame rate: pass frames= instead of fps=")
    step = Fraction(clip_fps).limit_denominator(1001) / Fraction(fps).limit_denominator(1001)
    count = int(frames / step) + (1 if frames % step else 0) if frames else 0
    return [int(k * step) for k in range(count) if int(k * step) < frames]


def decode_video(data: memoryview | bytes, wanted: list[int]) -> torch.Tensor:
    """The frames at indices ``wanted`` (in that order, repeats allowed) as a uint8 tensor (time, height, width,
    3). Decoding starts at the keyframe before the first frame wanted (a seek, when the stream's timing allows it),
    stops after the last one, and only the wanted frames are converted to arrays."""
    import torch

    av = _av()
    needed = set(wanted)
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            width, height = int(stream.codec_context.width), int(stream.codec_context.height)
            found = _frames_after_seek(container, stream, needed) if needed else {}
        if found is None:  # the stream's timing does not say where its frames are: from the start, in order
            with av.open(io.BytesIO(data), mode="r") as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                found = _frames_in_order(container.decode(stream), needed)
    except Exception as error:
        raise MediaProblem(f"PyAV cannot decode it: {error}") from None
    missing = sorted(needed - set(found))
    if missing:
        raise MediaProblem(f"it holds no frame {missing[0]} (frames decoded: {len(found)})")
    if not wanted:
        return torch.empty((0, height, width, 3), dtype=torch.uint8)
    return torch.from_numpy(np.stack([found[index] for index in wanted]))


def _frames_in_order(frames: Any, needed: set[int]) -> dict[int, np.ndarray]:
    """The ``needed`` frames of a stream decoded from its first frame, counted as they come."""
    last, found = max(needed), {}
    for index, frame in enumerate(frames):
        if index in needed:
            found[index] = frame.to_ndarray(format="rgb24")
        if index >= last:
            break
    return found


def _frames_after_seek(container: Any, stream: Any, needed: set[int]) -> dict[int, np.ndarray] | None:
    """The ``needed`` frames, decoded from the keyframe before the first of them, each frame's index from its
    time (constant frame rate); None where that cannot be trusted (no timing, or the seek landed past the
    first frame wanted), and the caller decodes from the start instead."""
    first, last = min(needed), max(needed)
    rate, time_base = stream.average_rate, stream.time_base
    if first == 0 or not rate or not time_base:
        return None
    start = stream.start_time or 0
    container.seek(start + int(Fraction(first) / Fraction(rate) / Fraction(time_base)), stream=stream, backward=True)
    found: dict[int, np.ndarray] = {}
    for frame in container.decode(stream):
        if frame.pts is None:
            return None
        index = round(float((frame.pts - start) * Fraction(time_base) * Fraction(rate)))
        if not found and index > first:
            return None
        if index in needed:
            found[index] = frame.to_ndarray(format="rgb24")
        if index >= last:
            break
    return found
