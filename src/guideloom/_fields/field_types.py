"""The field types of a record schema: what each accepts when written, the bytes it stores, what it reads back.

Every type turns a value into bytes (``pack``, errors without the field's name: the schema adds it) and a view of
those bytes back into a value (``unpack``); ``identity`` is what the storage header records of it. Media types
record their metadata before the encoded bytes, so reading it never decodes anything.
"""

from __future__ import annotations

import json
import numbers
import struct
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._fields import decoders
from guideloom._fields.decoders import ENCODINGS, MediaProblem
from guideloom._fields.media import (
    AudioValue,
    ImageValue,
    Origin,
    VideoValue,
    audio_head,
    image_head,
    image_value,
    read_audio,
    read_image_head,
    read_video,
    video_head,
)

NUMBER_KINDS = "biuf"
MAX_NDIM = 32
_COUNT = struct.Struct("<I")
_SIZE = struct.Struct("<Q")


def _dtype(name: str, dtype: object, kinds: str) -> np.dtype[Any]:
    """``dtype`` as a little-endian NumPy dtype of one of ``kinds``, or an error naming the argument."""
    try:
        found = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{name}: dtype must be a NumPy dtype or its name, got {dtype!r}") from None
    if found.kind not in kinds:
        raise ValueError(f"{name}: dtype must be {_kinds(kinds)}, got {found}")
    little: np.dtype[Any] = found.newbyteorder("<") if found.byteorder in ("=", ">") else found
    return little


def _kinds(kinds: str) -> str:
    return {"iu": "an integer type", "biuf": "a number or bool type"}.get(kinds, kinds)


def _check_optional(optional: object) -> bool:
    if not isinstance(optional, bool):
        raise TypeError(f"optional must be a bool, got {type(optional).__name__}")
    return optional


class FieldType:
    """A field of a record schema; ``optional=True`` lets records leave it out (or give None), read back as None."""

    media = False  # whether the field holds media (decoded on request, stored after the record's other fields)
    kind = ""

    def __init__(self, *, optional: bool = False) -> None:
        self.optional = _check_optional(optional)

    def _options(self) -> dict[str, Any]:
        """What besides its kind and ``optional`` the storage records of this field (what decoding depends on)."""
        return {}

    def identity(self) -> dict[str, Any]:
        """The field as the storage header records it: a change here is a different storage."""
        return {"type": self.kind, **self._options(), **({"optional": True} if self.optional else {})}

    def __repr__(self) -> str:
        options = {**self._options(), **({"optional": True} if self.optional else {})}
        return f"{type(self).__name__}({', '.join(f'{name}={value!r}' for name, value in options.items())})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, FieldType) and other.identity() == self.identity()

    def __hash__(self) -> int:
        return hash(json.dumps(self.identity(), sort_keys=True))

    def pack(self, value: Any) -> bytes | memoryview:
        raise NotImplementedError

    def unpack(self, view: memoryview, origin: Origin) -> Any:
        raise NotImplementedError


class Tokens(FieldType):
    """A 1-D sequence of integers of ``dtype`` (a list, tuple or array); reads as a read-only NumPy array."""

    kind = "tokens"

    def __init__(self, dtype: object = "int32", *, optional: bool = False) -> None:
        super().__init__(optional=optional)
        self.dtype = _dtype("Tokens", dtype, "iu")

    def _options(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name}

    def pack(self, value: Any) -> bytes | memoryview:
        array = _numbers(value, "a sequence of integers")
        if array.ndim != 1:
            raise ValueError(f"expected a 1-D sequence of integers, got an array of shape {array.shape}")
        return _cast(array, self.dtype).data

    def unpack(self, view: memoryview, origin: Origin) -> Any:
        return np.frombuffer(view, self.dtype)


class Scalar(FieldType):
    """One number or bool of ``dtype``; reads as a NumPy scalar of that dtype."""

    kind = "scalar"

    def __init__(self, dtype: object = "int64", *, optional: bool = False) -> None:
        super().__init__(optional=optional)
        self.dtype = _dtype("Scalar", dtype, NUMBER_KINDS)

    def _options(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name}

    def pack(self, value: Any) -> bytes | memoryview:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if not isinstance(value, numbers.Number | np.generic) or isinstance(value, str | bytes):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        return _cast(np.asarray(value), self.dtype).reshape(1).data

    def unpack(self, view: memoryview, origin: Origin) -> Any:
        return np.frombuffer(view, self.dtype, 1)[0]


class Array(FieldType):
    """A NumPy array (or nested lists) of numbers of ``dtype``; ``shape`` fixes its shape (None for any size of
    that dimension; no ``shape``: any shape). Reads as a read-only NumPy array."""

    kind = "array"

    def __init__(
        self, dtype: object = "float32", shape: tuple[int | None, ...] | None = None, *, optional: bool = False
    ) -> None:
        super().__init__(optional=optional)
        self.dtype = _dtype("Array", dtype, NUMBER_KINDS)
        if shape is not None:
            if not isinstance(shape, tuple | list) or not all(
                size is None or (isinstance(size, int) and not isinstance(size, bool) and size >= 0) for size in shape
            ):
                raise TypeError(f"Array: shape must be a tuple of sizes (ints, or None for any), got {shape!r}")
            shape = tuple(shape)
            if len(shape) > MAX_NDIM:
                raise ValueError(f"Array: shape has more than {MAX_NDIM} dimensions")
        self.shape = shape
        self._fixed = shape is not None and None not in shape  # stored without its shape

    def _options(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name, **({} if self.shape is None else {"shape": list(self.shape)})}

    def pack(self, value: Any) -> bytes | memoryview:
        array = _numbers(value, "an array of numbers")
        if self.shape is not None:
            if array.ndim != len(self.shape) or any(
                want is not None and want != got for want, got in zip(self.shape, array.shape, strict=True)
            ):
                raise ValueError(f"expected an array of shape {self.shape}, got {array.shape}")
        elif array.ndim > MAX_NDIM:
            raise ValueError(f"an array of more than {MAX_NDIM} dimensions is not stored")
        data = _cast(array, self.dtype).tobytes()
        if self._fixed:
            return data
        return bytes([array.ndim]) + np.asarray(array.shape, "<u8").tobytes() + data

    def unpack(self, view: memoryview, origin: Origin) -> Any:
        if self._fixed:
            assert self.shape is not None
            return np.frombuffer(view, self.dtype).reshape(self.shape)
        ndim = view[0]
        shape = struct.unpack_from(f"<{ndim}Q", view, 1)
        return np.frombuffer(view[1 + 8 * ndim :], self.dtype).reshape(shape)


class Text(FieldType):
    """A str, stored as UTF-8; reads as a str."""

    kind = "text"

    def pack(self, value: Any) -> bytes | memoryview:
        if not isinstance(value, str):
            raise TypeError(f"expected a str, got {type(value).__name__}")
        return value.encode("utf-8")

    def unpack(self, view: memoryview, origin: Origin) -> Any:
        return str(view, "utf-8")


class Json(FieldType):
    """Any JSON value (dicts, lists, str, numbers, bools, None), stored as compact UTF-8 JSON; reads as parsed."""

    kind = "json"

    def pack(self, value: Any) -> bytes | memoryview:
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as error:
            raise TypeError(f"expected a JSON value: {error}") from None

    def unpack(self, view: memoryview, origin: Origin) -> Any:
        return json.loads(str(view, "utf-8"))


class Image(FieldType):
    """An image: encoded bytes (JPEG, PNG, WebP, ... stored as given), a ``pathlib.Path`` to such a file, or a PIL
    image or uint8 array encoded once as ``encode`` ("png", "jpeg" or "webp"; ``quality`` for JPEG and WebP).
    Reads as an ``ImageValue``."""

    kind = "image"
    media = True

    def __init__(self, encode: str = "png", quality: int | None = None, *, optional: bool = False) -> None:
        super().__init__(optional=optional)
        if encode not in ENCODINGS:
            raise ValueError(f"Image: encode must be one of {', '.join(map(repr, ENCODINGS))}, got {encode!r}")
        if quality is not None and (isinstance(quality, bool) or not isinstance(quality, int)):
            raise TypeError(f"Image: quality must be an int, got {type(quality).__name__}")
        if quality is not None and not 0 <= quality <= 100:
            raise ValueError(f"Image: quality must be from 0 to 100, got {quality}")
        self.encode, self.quality = encode, quality

    def __repr__(self) -> str:  # encode and quality say how to write, not how to read: no part of the identity
        options = [f"encode={self.encode!r}"] if self.encode != "png" else []
        options += [f"quality={self.quality}"] if self.quality is not None else []
        options += ["optional=True"] if self.optional else []
        return f"Image({', '.join(options)})"

    def encoded(self, value: Any) -> bytes | memoryview:
        """The encoded bytes of one image as given."""
        data = _given_bytes(value)
        if data is not None:
            return data
        if isinstance(value, np.ndarray) or decoders.is_pil_image(value):
            return decoders.encode_image(value, self.encode, self.quality)
        raise TypeError(
            "expected an image: encoded bytes, a pathlib.Path, a PIL image or a uint8 array, "
            f"got {type(value).__name__}"
        )

    def pack(self, value: Any) -> bytes | memoryview:
        data = self.encoded(value)
        return image_head(*decoders.probe_image(data)) + bytes(data)

    def unpack(self, view: memoryview, origin: Origin) -> ImageValue:
        width, height, mode, format, start = read_image_head(view, 0)
        return image_value(view[start:], width, height, mode, format, origin)


class Images(FieldType):
    """A list of images (for interleaved records), each as an ``Image`` field takes it; reads as a list of
    ``ImageValue``."""

    kind = "images"
    media = True

    def __init__(self, encode: str = "png", quality: int | None = None, *, optional: bool = False) -> None:
        super().__init__(optional=optional)
        self.image = Image(encode, quality)

    def __repr__(self) -> str:
        described = repr(self.image)[len("Image(") : -1]
        options = [option for option in (described, "optional=True" if self.optional else "") if option]
        return f"Images({', '.join(options)})"

    def pack(self, value: Any) -> bytes | memoryview:
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list of images, got {type(value).__name__}")
        heads, datas = [_COUNT.pack(len(value))], []
        for number, item in enumerate(value):
            try:
                data = self.image.encoded(item)
                heads.append(image_head(*decoders.probe_image(data)) + _SIZE.pack(len(data)))
            except (TypeError, ValueError, MediaProblem) as error:
                raise type(error)(f"image {number}: {error}") from None
            datas.append(bytes(data))
        return b"".join(heads + datas)

    def unpack(self, view: memoryview, origin: Origin) -> list[ImageValue]:
        (count,) = _COUNT.unpack_from(view)
        offset, heads = _COUNT.size, []
        for _ in range(count):
            width, height, mode, format, offset = read_image_head(view, offset)
            (size,) = _SIZE.unpack_from(view, offset)
            offset += _SIZE.size
            heads.append((width, height, mode, format, size))
        values = []
        for width, height, mode, format, size in heads:
            values.append(image_value(view[offset : offset + size], width, height, mode, format, origin))
            offset += size
        if offset != len(view):
            raise ValueError("its images' sizes do not add up to its bytes")
        return values


class Audio(FieldType):
    """A sound clip: encoded bytes (FLAC, WAV, MP3, OGG, stored as given), a ``pathlib.Path`` to such a file, or a
    ``(samples, sample_rate)`` pair (samples an int16, int32 or float array of shape (frames,) or (frames,
    channels)), stored once as WAV. Reads as an ``AudioValue``."""

    kind = "audio"
    media = True

    def pack(self, value: Any) -> bytes | memoryview:
        data = _given_bytes(value)
        if data is None:
            if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], np.ndarray)):
                raise TypeError(
                    "expected audio: encoded bytes, a pathlib.Path, or a (samples, sample_rate) pair, "
                    f"got {type(value).__name__}"
                )
            samples, rate = value
            if isinstance(rate, bool) or not isinstance(rate, int | np.integer) or not 0 < int(rate) < 2**32:
                raise ValueError(f"expected a positive int sample rate beside the samples, got {rate!r}")
            data = decoders.encode_audio(samples, int(rate))
        return audio_head(*decoders.probe_audio(data)) + bytes(data)

    def unpack(self, view: memoryview, origin: Origin) -> AudioValue:
        return read_audio(view, origin)


class Video(FieldType):
    """A video: encoded bytes (MP4, WebM, ... stored as given) or a ``pathlib.Path`` to such a file. Reads as a
    ``VideoValue``."""

    kind = "video"
    media = True

    def pack(self, value: Any) -> bytes | memoryview:
        data = _given_bytes(value)
        if data is None:
            raise TypeError(f"expected a video: encoded bytes or a pathlib.Path, got {type(value).__name__}")
        return video_head(*decoders.probe_video(data)) + bytes(data)

    def unpack(self, view: memoryview, origin: Origin) -> VideoValue:
        return read_video(view, origin)


def _given_bytes(value: Any) -> bytes | memoryview | None:
    """The bytes of a medium given encoded (bytes, or a file's by its path); None for anything else."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return memoryview(value)
    if isinstance(value, memoryview):
        return value.cast("B") if value.ndim == 1 else value
    if isinstance(value, Path):
        try:
            return value.read_bytes()
        except OSError as error:
            raise MediaProblem(f"cannot read {value}: {error.strerror or error}") from None
    if isinstance(value, str):
        raise TypeError("got a str: give a medium's bytes, or its file as a pathlib.Path")
    return None


def _numbers(value: Any, what: str) -> np.ndarray:
    """``value`` (a list, tuple or array) as an array of numbers; anything else a TypeError saying ``what``."""
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, list | tuple):
        try:
            array = np.asarray(value)
        except ValueError as error:  # ragged lists
            raise ValueError(f"expected {what}: {error}") from None
        if array.size == 0:
            array = array.astype(np.int64)
    else:
        if not hasattr(value, "__array__"):  # a tensor has one
            raise TypeError(f"expected {what}, got {type(value).__name__}")
        array = np.asarray(value)
    if array.dtype.kind not in NUMBER_KINDS:
        raise TypeError(f"expected {what}, got values of {array.dtype}")
    return array


def _cast(array: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``array`` as ``dtype`` (contiguous), refusing values that would change: integers out of its range, fractions
    into integers, numbers into bools."""
    if array.dtype == dtype:
        return np.ascontiguousarray(array)
    if dtype.kind in "iu" and array.size:
        if array.dtype.kind == "f":
            if not np.all(np.isfinite(array)) or not np.all(np.floor(array) == array):
                raise ValueError(f"values that are not integers cannot be stored as {dtype}")
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise ValueError(f"values from {low} to {high} do not fit {dtype} ({info.min} to {info.max})")
    elif dtype.kind == "b" and array.dtype.kind != "b":
        raise TypeError(f"expected bools for {dtype}, got values of {array.dtype}")
    return np.ascontiguousarray(array.astype(dtype))


cast_numbers = _cast  # for packing many records' numbers at once (``record_columns``)
