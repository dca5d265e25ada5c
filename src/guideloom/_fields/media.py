"""Media values as a record reads back: metadata recorded at write time, the encoded bytes (a read-only view into the
shard's mapping) and decoding on request.

A value knows where it was read from (shard, record, field), so every decode error names them. Pickled (to leave a
worker process undecoded) a value takes a copy of its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from guideloom._core.errors import MediaDecodeError
from guideloom._fields import decoders
from guideloom._fields.decoders import MediaProblem

if TYPE_CHECKING:
    import torch

# Where a value was read from: (shard, record, field); shard and record are None for a record being written.
Origin = tuple[int | None, int | None, str]

IMAGE_HEAD = struct.Struct("<IIBB")  # width, height, then the lengths of the mode and format names that follow
AUDIO_HEAD = struct.Struct("<IIQB")  # sample rate, channels, frames, length of the format name
VIDEO_HEAD = struct.Struct("<IIQdB")  # width, height, frames, frames per second, length of the format name


def where(origin: Origin) -> str:
    """``origin`` in words: "field 'image' of record 3 of shard 7"."""
    shard, record, field = origin
    if shard is None:
        return f"field {field!r}"
    return f"field {field!r} of record {record} of shard {shard}"


def decode_error(origin: Origin, problem: Exception) -> MediaDecodeError:
    return MediaDecodeError(f"cannot decode {where(origin)}: {problem}")


class MediaValue:
    """What media values share: the encoded bytes, their format, where they were read from."""

    __slots__ = ("data", "format", "origin")

    data: memoryview
    format: str
    origin: Origin

    @property
    def nbytes(self) -> int:
        """The size of the encoded bytes."""
        return self.data.nbytes

    def metadata(self) -> dict[str, Any]:
        """What was recorded of the medium at write time (sizes, rate, frames, format), by name."""
        raise NotImplementedError

    def __repr__(self) -> str:
        described = ", ".join(f"{name}={value!r}" for name, value in self.metadata().items())
        return f"{type(self).__name__}({described}, {self.nbytes} bytes)"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, MediaValue)
        return self.metadata() == other.metadata() and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt_value, (type(self), self.metadata(), bytes(self.data), self.origin))


def _rebuilt_value(kind: type[MediaValue], metadata: dict[str, Any], data: bytes, origin: Origin) -> MediaValue:
    """A media value unpickled (in the training process, from a worker): its metadata and a copy of its bytes."""
    value = kind.__new__(kind)
    for name, item in metadata.items():
        object.__setattr__(value, name, item)
    value.data, value.origin = memoryview(data).toreadonly(), origin
    return value


class ImageValue(MediaValue):
    """An image field as read: ``width``, ``height``, ``mode`` (Pillow's: "RGB", "L", ...), ``format`` ("jpeg",
    "png", "webp", ...), ``data`` (the encoded bytes); ``decode()`` and ``pil()`` decode it."""

    __slots__ = ("height", "mode", "width")

    width: int
    height: int
    mode: str

    def metadata(self) -> dict[str, Any]:
        return {"width": self.width, "height": self.height, "mode": self.mode, "format": self.format}

    def decode(
        self, max_pixels: int | None = -1, *, size: int | tuple[int, int] | None = None, mode: str | None = None
    ) -> torch.Tensor:
        """The pixels as a uint8 tensor (height, width, channels); images of more than ``max_pixels`` pixels (by
        default Pillow's ``PIL.Image.MAX_IMAGE_PIXELS``; None: no limit) are refused, before any decoding.

        ``size`` (height, width), or one number for a square, resizes while decoding (bilinear, antialiased, within
        1 of Pillow's ``BILINEAR``; a JPEG at least twice as large is decoded at a reduced scale first, which is
        several times faster);
        ``mode`` ("RGB", "L", "RGBA" or "LA") converts, so that images of a batch have the same channels."""
        wanted = _image_size(size)
        if mode is not None and mode not in decoders.UINT8_MODES:
            raise ValueError(f"decode: mode must be one of {', '.join(decoders.UINT8_MODES)}, got {mode!r}")
        try:
            return decoders.decode_image(self.data, self._limit(max_pixels), wanted, mode)
        except MediaProblem as problem:
            raise decode_error(self.origin, problem) from None

    def pil(self, max_pixels: int | None = -1) -> Any:
        """The decoded PIL image, as Pillow reads it (mode and bit depth kept); the same pixel limit as ``decode``."""
        try:
            return decoders.open_image(self.data, self._limit(max_pixels))
        except MediaProblem as problem:
            raise decode_error(self.origin, problem) from None

    def _limit(self, max_pixels: int | None) -> int | None:
        """The pixel limit asked (-1: Pillow's), checked against the recorded size before any byte is read."""
        limit = decoders.default_max_pixels() if max_pixels == -1 else max_pixels
        if limit is not None:
            decoders.check_pixels(self.width, self.height, limit)
        return limit


def _image_size(size: object) -> tuple[int, int] | None:
    """``decode``'s ``size`` as (height, width): one positive int for a square, or two."""
    if size is None:
        return None
    pair = (size, size) if isinstance(size, int) and not isinstance(size, bool) else size
    if (
        not isinstance(pair, tuple | list)
        or len(pair) != 2
        or not all(isinstance(side, int | np.integer) and not isinstance(side, bool) and side > 0 for side in pair)
    ):
        raise ValueError(f"decode: size must be a positive int or a (height, width) pair of them, got {size!r}")
    return int(pair[0]), int(pair[1])


class AudioValue(MediaValue):
    """An audio field as read: ``sample_rate``, ``channels``, ``frames``, ``format`` ("flac", "wav", "mp3",
    "ogg"), ``data``; ``decode()`` gives the samples."""

    __slots__ = ("channels", "frames", "sample_rate")

    sample_rate: int
    channels: int
    frames: int

    def metadata(self) -> dict[str, Any]:
        return {
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "frames": self.frames,
            "format": self.format,
        }

    @property
    def duration(self) -> float:
        """Seconds of sound."""
        return self.frames / self.sample_rate if self.sample_rate else 0.0

    def decode(self) -> torch.Tensor:
        """The samples as a float32 tensor (frames, channels)."""
        try:
            return decoders.audio_tensor(self.data)
        except MediaProblem as problem:
            raise decode_error(self.origin, problem) from None


class VideoValue(MediaValue):
    """A video field as read: ``width``, ``height``, ``frames``, ``fps``, ``format`` ("mp4", "webm", ...),
    ``data``; ``decode(frames=None, fps=None)`` decodes the frames asked."""

    __slots__ = ("fps", "frames", "height", "width")

    width: int
    height: int
    frames: int
    fps: float

    def metadata(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "height": self.height,
            "frames": self.frames,
            "fps": self.fps,
            "format": self.format,
        }

    def decode(self, frames: Sequence[int] | None = None, fps: float | None = None) -> torch.Tensor:
        """Frames as a uint8 tensor (time, height, width, 3): all of them, those at the indices ``frames``, or the
        clip sampled at ``fps`` frames per second. Decoding starts at the keyframe before the first frame asked and
        stops at the last one."""
        if frames is not None and fps is not None:
            raise ValueError("decode: give frames= or fps=, not both")
        try:
            if fps is not None:
                if isinstance(fps, bool) or not isinstance(fps, int | float) or not fps > 0:
                    raise ValueError(f"decode: fps must be a positive number, got {fps!r}")
                wanted = decoders.video_frames_at_rate(self.frames, self.fps, float(fps))
            elif frames is not None:
                wanted = [self._frame_index(index) for index in frames]
            else:
                wanted = list(range(self.frames))
            return decoders.decode_video(self.data, wanted)
        except MediaProblem as problem:
            raise decode_error(self.origin, problem) from None

    def _frame_index(self, index: object) -> int:
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(f"decode: frames must be frame indices (ints), got {type(index).__name__}")
        number = int(index)
        if not 0 <= number < self.frames:
            raise IndexError(f"decode: frame {number} is out of range for a video of {self.frames} frames")
        return number


# -- the metadata's bytes: a few fixed fields and short names before the encoded data --------------------------------


def _name_bytes(name: str) -> bytes:
    encoded = name.encode("ascii", "replace")[:255]
    return encoded


def image_head(width: int, height: int, mode: str, format: str) -> bytes:
    mode_bytes, format_bytes = _name_bytes(mode), _name_bytes(format)
    return IMAGE_HEAD.pack(width, height, len(mode_bytes), len(format_bytes)) + mode_bytes + format_bytes


def read_image_head(view: memoryview, offset: int) -> tuple[int, int, str, str, int]:
    """Width, height, mode, format of the image head at ``offset``, and where it ends."""
    width, height, mode_size, format_size = IMAGE_HEAD.unpack_from(view, offset)
    start = offset + IMAGE_HEAD.size
    mode = str(view[start : start + mode_size], "ascii")
    start += mode_size
    return width, height, mode, str(view[start : start + format_size], "ascii"), start + format_size


def image_value(view: memoryview, width: int, height: int, mode: str, format: str, origin: Origin) -> ImageValue:
    value = ImageValue.__new__(ImageValue)
    value.width, value.height, value.mode, value.format, value.data, value.origin = (
        width,
        height,
        mode,
        format,
        view,
        origin,
    )
    return value


def audio_head(sample_rate: int, channels: int, frames: int, format: str) -> bytes:
    format_bytes = _name_bytes(format)
    return AUDIO_HEAD.pack(sample_rate, channels, frames, len(format_bytes)) + format_bytes


def read_audio(view: memoryview, origin: Origin) -> AudioValue:
    sample_rate, channels, frames, format_size = AUDIO_HEAD.unpack_from(view)
    start = AUDIO_HEAD.size + format_size
    value = AudioValue.__new__(AudioValue)
    value.sample_rate, value.channels, value.frames = sample_rate, channels, frames
    value.format, value.data, value.origin = str(view[AUDIO_HEAD.size : start], "ascii"), view[start:], origin
    return value


def video_head(width: int, height: int, frames: int, fps: float, format: str) -> bytes:
    format_bytes = _name_bytes(format)
    return VIDEO_HEAD.pack(width, height, frames, fps, len(format_bytes)) + format_bytes


def read_video(view: memoryview, origin: Origin) -> VideoValue:
    width, height, frames, fps, format_size = VIDEO_HEAD.unpack_from(view)
    start = VIDEO_HEAD.size + format_size
    value = VideoValue.__new__(VideoValue)
    value.width, value.height, value.frames, value.fps = width, height, frames, fps
    value.format, value.data, value.origin = str(view[VIDEO_HEAD.size : start], "ascii"), view[start:], origin
    return value
