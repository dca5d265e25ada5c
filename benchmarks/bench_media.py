"""Images with captions: decoded images per second through the loader's workers, against a bare loop.

The same JPEGs (about 256x256, noise and gradients, quality 90) with captions, read for one shuffled
epoch in batches of ``--batch``, each image decoded to pixels and resized to 224x224 in the worker
processes (``--workers``, 2 by default), the batch stacked into a uint8 tensor:

* bare loop: the encoded bytes in memory, decoded and resized by a ``multiprocessing`` pool of the same
  number of processes, in chunks of a batch: the ceiling of the decode itself;
* guideloom fields: a ``DocumentStorage`` of ``RecordSchema(caption=Text(), image=Image())`` read by
  ``from_storage(..., decode={"image": resize})``;
* msgpack records: what a user wrote before ``guideloom.fields``: ``DocumentMsgpackFormat`` records of
  the caption and the JPEG's bytes, decoded and resized in their own collate;
* HF datasets (when ``datasets`` is installed): a dataset with an ``Image()`` feature saved to disk and
  loaded back, its transform resizing the images it decodes, read by a torch ``DataLoader`` with the
  same workers, batch and shuffling.

Also: the storage's size against the encoded images plus the captions (no re-encoding: the goal is within
2%), whole records read per second by ``reader.read_many`` (the record layout's cost), and a
caption-only pass (``fields=("caption",)``). Writes ``results/media.json``.

    python -m benchmarks.bench_media                 # 2,000 images
    python -m benchmarks.bench_media --images 10000 --repeats 3
"""

from __future__ import annotations

import io
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image as PILImage

from benchmarks import harness
from guideloom import DocumentMsgpackFormat, DocumentStorage, StatefulDataLoader
from guideloom.fields import Image, ImageValue, RecordSchema, Text

SIDE = 224
SCHEMA = RecordSchema(caption=Text(), image=Image())


def jpegs(count: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEGs of 240 to 272 pixels a side: smooth gradients under noise, as photos compress."""
    rng = np.random.default_rng(seed)
    made = []
    for _ in range(count):
        height, width = rng.integers(240, 273, 2).tolist()
        gradient = np.linspace(0, 255, width, dtype=np.float32)[None, :, None] * rng.uniform(0.3, 1, 3)
        pixels = np.clip(gradient + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        PILImage.fromarray(pixels).save(out, format="JPEG", quality=90)
        made.append(out.getvalue())
    return made


def resized_pixels(data: Any) -> np.ndarray:
    """Decode encoded bytes and resize to SIDE x SIDE RGB: what every reader below does per image."""
    image = PILImage.open(io.BytesIO(data)).convert("RGB").resize((SIDE, SIDE), PILImage.BILINEAR)
    return np.asarray(image)


def resize_value(value: ImageValue) -> torch.Tensor:
    return torch.from_numpy(np.array(value.pil().convert("RGB").resize((SIDE, SIDE), PILImage.BILINEAR)))


def stack_images(records: list[dict[str, Any]]) -> torch.Tensor:
    return torch.from_numpy(np.stack([record["image"].numpy() for record in records]))


def msgpack_collate(records: list[dict[str, Any]]) -> torch.Tensor:
    return torch.from_numpy(np.stack([resized_pixels(record["image"]) for record in records]))


def _decode_chunk(chunk: list[bytes]) -> np.ndarray:
    return np.stack([resized_pixels(data) for data in chunk])


def bare_loop(images: list[bytes], batch: int, workers: int) -> float:
    order = np.random.default_rng(0).permutation(len(images))
    chunks = [[images[i] for i in order[start : start + batch]] for start in range(0, len(images), batch)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        start = time.perf_counter()
        count = sum(len(stacked) for stacked in pool.imap(_decode_chunk, chunks))
        return count / (time.perf_counter() - start)


def loader_rate(storage: Any, collate: Any, batch: int, workers: int, **options: Any) -> float:
    with StatefulDataLoader.from_storage(
        storage, collate, device="cpu", local_batch_size=batch, shuffle=True, seed=0, num_workers=workers, **options
    ) as loader:
        start = time.perf_counter()
        count = sum(len(stacked) for stacked in loader)
        return count / (time.perf_counter() - start)


def _hf_transform(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    images = [np.asarray(image.convert("RGB").resize((SIDE, SIDE), PILImage.BILINEAR)) for image in batch["image"]]
    return {"caption": batch["caption"], "image": images}


def _hf_collate(samples: list[dict[str, Any]]) -> torch.Tensor:
    return torch.from_numpy(np.stack([sample["image"] for sample in samples]))


def hf_dataset(root: Path, images: list[bytes], captions: list[str]) -> Any:
    """The images as a Hugging Face dataset with an ``Image()`` feature, saved to disk and loaded back."""
    import datasets

    features = datasets.Features({"caption": datasets.Value("string"), "image": datasets.Image()})
    rows = {"caption": captions, "image": [{"bytes": data, "path": None} for data in images]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(root / "hf"))
    dataset = datasets.load_from_disk(str(root / "hf"))
    dataset.set_transform(_hf_transform)
    return dataset


def hf_rate(dataset: Any, batch: int, workers: int) -> float:
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=_hf_collate, generator=generator
    )
    start = time.perf_counter()
    count = sum(len(stacked) for stacked in loader)
    return count / (time.perf_counter() - start)


def captions_of(images: list[bytes]) -> list[str]:
    return [f"image {number}: a gradient under noise, {len(data)} bytes of JPEG" for number, data in enumerate(images)]


def write_storages(root: Path, images: list[bytes], shards: int) -> tuple[DocumentStorage, DocumentStorage, int]:
    fields = DocumentStorage(root / "fields", SCHEMA)
    records = DocumentStorage(root / "msgpack", DocumentMsgpackFormat())
    given = 0
    with fields.sync_writer() as fields_writer, records.sync_writer() as records_writer:
        for number, (data, caption) in enumerate(zip(images, captions_of(images), strict=True)):
            given += len(data) + len(caption.encode())
            fields_writer.append(number % shards, {"caption": caption, "image": data})
            records_writer.append(number % shards, {"caption": caption, "image": data})
    return fields, records, given


def shard_bytes(storage: DocumentStorage) -> int:
    return sum(storage.committed_shard_sizes())


def read_rate(storage: DocumentStorage, fields: tuple[str, ...] | None = None) -> float:
    with storage.sync_reader() as reader:
        indices = np.arange(len(reader), dtype=np.int64)
        start = time.perf_counter()
        if fields is None:
            records = reader.read_many(indices)
        else:
            records = [reader.read(int(index), fields=fields) for index in indices]
        return len(records) / (time.perf_counter() - start)


def main() -> None:
    parser = harness.argument_parser(__doc__)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    images = jpegs(arguments.images)
    batch, workers = arguments.batch, arguments.workers
    with tempfile.TemporaryDirectory() as directory:
        fields, records, given = write_storages(Path(directory), images, arguments.shards)
        measured = {
            "bare loop": lambda: bare_loop(images, batch, workers),
            "guideloom fields": lambda: loader_rate(
                fields, stack_images, batch, workers, decode={"image": resize_value}
            ),
            "msgpack records": lambda: loader_rate(records, msgpack_collate, batch, workers),
        }
        try:
            dataset = hf_dataset(Path(directory), images, captions_of(images))
            measured["HF datasets Image()"] = lambda: hf_rate(dataset, batch, workers)
        except ImportError:
            print("HF datasets is not installed: not measured")
        runs = harness.interleaved(measured, arguments.repeats)
        rates = {name: float(np.median(values)) for name, values in runs.items()}
        reads = {
            "fields, whole records": read_rate(fields),
            "msgpack, whole records": read_rate(records),
            "fields, caption only": read_rate(fields, ("caption",)),
        }
        sizes = {"fields": shard_bytes(fields) / given, "msgpack": shard_bytes(records) / given}
    bare = rates["bare loop"]
    results = {
        "machine": harness.machine(),
        "images": arguments.images,
        "batch": batch,
        "workers": workers,
        "images_per_second": {name: {"median": rate, "ratio_to_bare": rate / bare} for name, rate in rates.items()},
        "records_read_per_second": reads,
        "storage_size_over_given": sizes,
        "runs": runs,
    }
    lines = ["| reader | images/s (median) | ratio to the bare loop |", "|---|---|---|"]
    lines += [f"| {name} | {rate:,.0f} | {rate / bare:.2f}x |" for name, rate in rates.items()]
    lines += ["", "| read | records/s |", "|---|---|"]
    lines += [f"| {name} | {rate:,.0f} |" for name, rate in reads.items()]
    lines += [
        "",
        f"storage size over the JPEGs and captions given: fields {sizes['fields']:.4f}x, "
        f"msgpack {sizes['msgpack']:.4f}x",
    ]
    markdown = "\n".join(lines)
    print(markdown)
    harness.write_results("media", results, markdown)


if __name__ == "__main__":
    main()
