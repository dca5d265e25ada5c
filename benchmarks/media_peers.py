"""The peers of ``bench_media``: each writes the same media with captions its own way and reads them back for one
shuffled epoch with worker processes, each medium decoded by the same function (``Medium.decode``) in the workers
and batched by the same collate, so what differs is the storage and the loader around the decode.

Each peer is used as its docs show for media, on its fastest straightforward path:

* HF datasets: an ``Image()`` feature (the encoded bytes kept), ``save_to_disk`` / ``load_from_disk``, a
  ``set_transform`` that resizes what ``Image()`` decodes, a torch ``DataLoader``;
* LitData: ``optimize`` over the media files (each item the file's bytes and its caption), a ``StreamingDataset``
  subclass decoding in ``__getitem__``, a ``StreamingDataLoader``;
* Mosaic MDS: ``MDSWriter`` with a ``bytes`` column (no re-encoding) and a ``str`` one, a ``StreamingDataset``
  subclass decoding in ``__getitem__``, a ``StreamingDataLoader``;
* WebDataset: tars written by ``TarWriter`` / ``ShardWriter`` (``jpg`` or ``flac`` and ``txt`` members), read by
  ``WebDataset(...).shuffle(1000).to_tuple(...).map_tuple(...).batched(...)`` through a ``WebLoader``;
* Megatron-Energon: the WebDataset shards prepared by ``energon prepare`` as ``CaptioningSample``s, read by
  ``get_train_dataset`` / ``get_loader`` with a task encoder whose decoder gives PIL images, resized in
  ``encode_sample`` (images only: Energon has no audio sample type).

Every peer module is imported when its peer runs: a missing one is reported, not fatal.
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image as PILImage

SIDE = 224
WDS_SHUFFLE = 1000  # WebDataset's shuffle buffer, as its examples use
ENERGON_SHUFFLE = 100  # Energon's shuffle buffer and samples per sequence, as its docs use


# ----------------------------------------------------------------------------- what every reader does per item


def resized_pixels(data: Any) -> np.ndarray:
    """Decode a JPEG and resize it to SIDE x SIDE RGB: the work every image reader does per image."""
    image = PILImage.open(io.BytesIO(data)).convert("RGB").resize((SIDE, SIDE), PILImage.Resampling.BILINEAR)
    return np.asarray(image)


def samples(data: Any) -> np.ndarray:
    """Decode a clip to float32 (frames, channels): the work every audio reader does per clip."""
    import soundfile

    decoded, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return decoded


def stacked(arrays: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(arrays))


def padded(arrays: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clips padded with 0 to the longest, their mask (int64, 1 on samples) and lengths: what
    ``guideloom.collate.pad`` makes of audio, so that every reader's batch holds the same."""
    lengths = np.fromiter((len(array) for array in arrays), np.int64, len(arrays))
    longest = int(lengths.max())
    out = np.zeros((len(arrays), longest, arrays[0].shape[1]), np.float32)
    for row, array in enumerate(arrays):
        out[row, : len(array)] = array
    mask = (np.arange(longest)[None, :] < lengths[:, None]).astype(np.int64)
    return torch.from_numpy(out), torch.from_numpy(mask), torch.from_numpy(lengths)


@dataclass(frozen=True)
class Medium:
    """A kind of media: the field's name, the file extension peers store it under, and the decode and collate that
    every reader runs."""

    field: str
    extension: str
    decode: Callable[[Any], np.ndarray]
    collate: Callable[[list[np.ndarray]], Any]


IMAGES = Medium("image", "jpg", resized_pixels, stacked)
AUDIO = Medium("audio", "flac", samples, padded)


def batch_size_of(batch: Any) -> int:
    """How many items a batch holds (a tensor, or a tuple / dict whose first tensor counts them)."""
    if isinstance(batch, dict):
        batch = next(value for value in batch.values() if isinstance(value, torch.Tensor))
    if isinstance(batch, tuple | list):
        batch = batch[0]
    return len(batch)


def rate(batches: Any, limit: int | None = None) -> float:
    """Items per second over ``batches`` (timing starts before the first batch: building workers counts);
    stops after ``limit`` items when given (for loaders that repeat for ever)."""
    start = time.perf_counter()
    count = 0
    for batch in batches:
        count += batch_size_of(batch)
        if limit is not None and count >= limit:
            break
    return count / (time.perf_counter() - start)


def directory_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


# ----------------------------------------------------------------------------- the bare loop


class _DecodeBatch:
    def __init__(self, medium: Medium) -> None:
        self.medium = medium

    def __call__(self, chunk: list[bytes]) -> Any:
        return self.medium.collate([self.medium.decode(data) for data in chunk])


def bare_rate(items: list[tuple[bytes, str]], medium: Medium, batch: int, workers: int) -> float:
    """The encoded bytes in memory, shuffled, decoded by a pool of ``workers`` processes a batch at a time."""
    order = np.random.default_rng(0).permutation(len(items))
    chunks = [[items[i][0] for i in order[start : start + batch]] for start in range(0, len(items), batch)]
    # One torch thread per process, as torch's DataLoader sets in its workers.
    with multiprocessing.get_context("fork").Pool(workers, torch.set_num_threads, (1,)) as pool:
        return rate(pool.imap(_DecodeBatch(medium), chunks))


# ----------------------------------------------------------------------------- HF datasets


class _HFTransform:
    def __init__(self, medium: Medium) -> None:
        self.medium = medium

    def __call__(self, rows: dict[str, list[Any]]) -> dict[str, list[Any]]:
        images = [
            np.asarray(image.convert("RGB").resize((SIDE, SIDE), PILImage.Resampling.BILINEAR))
            for image in rows["image"]
        ]
        return {"caption": rows["caption"], "image": images}


class _HFCollate:
    def __init__(self, medium: Medium) -> None:
        self.medium = medium

    def __call__(self, rows: list[dict[str, Any]]) -> Any:
        return self.medium.collate([row[self.medium.field] for row in rows])


def hf_write(root: Path, items: list[tuple[bytes, str]], medium: Medium) -> Path:
    import datasets

    feature = datasets.Image() if medium is IMAGES else datasets.Audio(decode=False)
    features = datasets.Features({"caption": datasets.Value("string"), medium.field: feature})
    rows = {
        "caption": [caption for _, caption in items],
        medium.field: [{"bytes": data, "path": None} for data, _ in items],
    }
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(root))
    return root


def hf_rate(root: Path, medium: Medium, batch: int, workers: int) -> float:
    import datasets

    dataset = datasets.load_from_disk(str(root))
    dataset.set_transform(_HFTransform(medium))
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        collate_fn=_HFCollate(medium),
        generator=torch.Generator().manual_seed(0),
    )
    return rate(loader)


def hf_audio_problem() -> str | None:
    """Why HF datasets' ``Audio()`` cannot decode here, or None when it can."""
    try:
        import torchcodec  # noqa: F401
    except ImportError:
        return "HF datasets decodes Audio() with torchcodec, which is not installed"
    return None


# ----------------------------------------------------------------------------- LitData


class _LitItem:
    """optimize()'s ``fn``: a media file's bytes and its caption (LitData's inputs are file names)."""

    def __init__(self, medium: Medium) -> None:
        self.medium = medium

    def __call__(self, path: str) -> dict[str, Any]:
        file = Path(path)
        return {"data": file.read_bytes(), "caption": file.with_suffix(".txt").read_text()}


def media_files(root: Path, items: list[tuple[bytes, str]], medium: Medium) -> list[str]:
    """The items as files (``NNNNNN.jpg`` and ``NNNNNN.txt``), as a user's corpus starts out."""
    root.mkdir(parents=True)
    paths = []
    for number, (data, caption) in enumerate(items):
        path = root / f"{number:06d}.{medium.extension}"
        path.write_bytes(data)
        path.with_suffix(".txt").write_text(caption)
        paths.append(str(path))
    return paths


def litdata_write(root: Path, files: list[str], medium: Medium) -> Path:
    from litdata import optimize

    start_method = multiprocessing.get_start_method(allow_none=True)
    try:  # optimize() sets the start method to spawn for the whole process: put it back
        optimize(
            fn=_LitItem(medium), inputs=files, output_dir=str(root), chunk_bytes="64MB", num_workers=2, verbose=False
        )
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    return root


def _lit_dataset(root: Path, medium: Medium) -> Any:
    from litdata import StreamingDataset

    class Decoded(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: Any) -> Any:
            return medium.decode(super().__getitem__(index)["data"])

    return Decoded(input_dir=str(root), shuffle=True, seed=0)


def litdata_rate(root: Path, medium: Medium, batch: int, workers: int) -> float:
    from litdata import StreamingDataLoader

    loader = StreamingDataLoader(
        _lit_dataset(root, medium), batch_size=batch, num_workers=workers, collate_fn=medium.collate
    )
    return rate(loader)


# ----------------------------------------------------------------------------- Mosaic MDS


def _mosaic() -> Any:
    stubs = str(Path(__file__).resolve().parent / "peers" / "_stubs")  # ``import streaming`` imports torchvision
    if stubs not in sys.path:
        sys.path.insert(0, stubs)
    import streaming

    return streaming


def mds_write(root: Path, items: list[tuple[bytes, str]]) -> Path:
    streaming = _mosaic()
    with streaming.MDSWriter(out=str(root), columns={"data": "bytes", "caption": "str"}) as writer:
        for data, caption in items:
            writer.write({"data": data, "caption": caption})
    return root


def mds_rate(root: Path, medium: Medium, batch: int, workers: int) -> float:
    streaming = _mosaic()

    class Decoded(streaming.StreamingDataset):  # type: ignore[misc,name-defined]
        def __getitem__(self, index: int) -> Any:
            return medium.decode(super().__getitem__(index)["data"])

    gc.collect()  # a StreamingDataset holds its directory in shared memory until it is collected
    dataset = Decoded(local=str(root), remote=None, shuffle=True, shuffle_seed=0, batch_size=batch)
    loader = streaming.StreamingDataLoader(dataset, batch_size=batch, num_workers=workers, collate_fn=medium.collate)
    try:
        return rate(loader)
    finally:
        del loader, dataset
        gc.collect()


# ----------------------------------------------------------------------------- WebDataset


def wds_write(root: Path, items: list[tuple[bytes, str]], medium: Medium, shards: int) -> list[str]:
    import webdataset as wds

    root.mkdir(parents=True)
    per_shard = -(-len(items) // shards)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as writer:
        for number, (data, caption) in enumerate(items):
            writer.write({"__key__": f"{number:06d}", medium.extension: data, "txt": caption})
    return sorted(str(path) for path in root.glob("*.tar"))


def _same(value: Any) -> Any:
    return value


class _WdsCollate:
    def __init__(self, medium: Medium) -> None:
        self.medium = medium

    def __call__(self, rows: list[tuple[Any, bytes]]) -> Any:
        return self.medium.collate([media for media, _ in rows])


def wds_rate(urls: list[str], medium: Medium, batch: int, workers: int) -> float:
    import webdataset as wds

    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls) if len(urls) > 1 else False, seed=0, empty_check=False)
        .shuffle(WDS_SHUFFLE)
        .to_tuple(medium.extension, "txt")
        .map_tuple(medium.decode, _same)
        .batched(batch, collation_fn=_WdsCollate(medium))
    )
    return rate(wds.WebLoader(dataset, batch_size=None, num_workers=workers))


# ----------------------------------------------------------------------------- Megatron-Energon


def energon_prepare(root: Path) -> Path:
    """``energon prepare`` on a folder of WebDataset shards: its index and a ``CaptioningSample`` dataset.yaml."""
    command = [
        str(Path(sys.executable).parent / "energon"),
        "prepare",
        str(root),
        "--non-interactive",
        "--split-ratio",
        "1,0,0",
        "--sample-type",
        "CaptioningSample",
        "--field-map",
        '{"image": "jpg", "caption": "txt"}',
        "--no-progress",
    ]
    subprocess.run(command, check=True, capture_output=True)
    return root


def _energon_encoder() -> Any:
    from megatron.energon import DefaultTaskEncoder, SampleDecoder

    class Resizing(DefaultTaskEncoder):  # type: ignore[misc]
        decoder = SampleDecoder(image_decode="pil")

        def encode_sample(self, sample: Any) -> Any:
            return np.asarray(sample.image.convert("RGB").resize((SIDE, SIDE), PILImage.Resampling.BILINEAR))

        def batch(self, samples: list[np.ndarray]) -> Any:
            return stacked(samples)

        def encode_batch(self, batch: Any) -> Any:
            return batch

    return Resizing()


def energon_rate(root: Path, count: int, batch: int, workers: int) -> float:
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    dataset = get_train_dataset(
        str(root),
        batch_size=batch,
        shuffle_buffer_size=ENERGON_SHUFFLE,
        max_samples_per_sequence=ENERGON_SHUFFLE,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=_energon_encoder(),
    )
    loader = get_loader(dataset)
    try:
        return rate(loader, limit=count)  # a train dataset repeats for ever: one epoch's worth is counted
    finally:
        del loader
        gc.collect()
