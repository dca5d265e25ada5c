"""Real media made by the tests: images by Pillow, sound by soundfile, video by PyAV (each encoded in memory)."""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile
from PIL import Image as PILImage


def image_bytes(width: int, height: int, format: str = "JPEG", mode: str = "RGB", seed: int = 0) -> bytes:
    """A ``width`` x ``height`` image of noise (so lossy codecs have something to lose) encoded as ``format``."""
    generator = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = generator.integers(0, 256, (height, width, channels), np.uint8)
    image = PILImage.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)
    out = io.BytesIO()
    image.save(out, format=format)
    return out.getvalue()


def sound_bytes(frames: int, channels: int = 1, rate: int = 16000, format: str = "FLAC", seed: int = 0) -> bytes:
    """A clip of ``frames`` frames of quiet noise encoded as ``format`` (16-bit PCM)."""
    samples = np.random.default_rng(seed).uniform(-0.5, 0.5, (frames, channels)).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=format, subtype="PCM_16")
    return out.getvalue()


def video_bytes(
    frames: int, width: int = 64, height: int = 48, fps: int = 10, container: str = "mp4", keyframes_every: int = 0
) -> bytes:
    """A clip of ``frames`` frames (each a different flat colour, so frames tell apart) encoded as H.264 in MP4,
    or VP9 in WebM; ``keyframes_every``: the distance between keyframes (0: the encoder's choice)."""
    out = io.BytesIO()
    codec = "libx264" if container == "mp4" else "libvpx-vp9"
    with av.open(out, mode="w", format=container) as output:
        stream = output.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if keyframes_every:
            stream.codec_context.gop_size = keyframes_every
        for number in range(frames):
            pixels = np.full((height, width, 3), (number * 20) % 256, np.uint8)
            pixels[:, : width // 2, 1] = 255 - pixels[:, : width // 2, 1]
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return out.getvalue()


def decoded_video(data: bytes) -> np.ndarray:
    """Every frame of ``data`` as PyAV decodes it: uint8 (time, height, width, 3)."""
    with av.open(io.BytesIO(data)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
