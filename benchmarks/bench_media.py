"""Media with captions: decoded items per second through each loader's workers, against a bare loop; storage sizes.

Images: JPEGs (240 to 272 pixels a side, gradients under noise, quality 90) with captions, read for one shuffled
epoch in batches of ``--batch`` by ``--workers`` worker processes (2), each image decoded and resized to 224x224
RGB in the workers, the batch a uint8 tensor. Audio: FLAC clips (2 to 4 s, 16 kHz, mono) with captions, decoded
to float32 in the workers, the batch padded to its longest clip. Every reader runs once per round, rounds
interleaved (``--repeats``, 3), and the medians are given as ratios to the bare loop, of items per second and of
items per CPU-second (the CPU time of all of a reader's processes, its workers' included: on a machine shared with
other jobs the steadier figure, as the other jobs take wall time but not CPU time from it):

* bare loop: the encoded bytes in memory, shuffled, decoded by a ``multiprocessing`` pool of as many processes, a
  batch per task, with Pillow (``Image.open(...).convert("RGB").resize(...)``): the cost of the decode itself;
* bare loop, guideloom's decode: the same, each image decoded and resized as guideloom's built-in decode does it
  (torch's antialiased bilinear resize, about twice as fast as Pillow's): the loader's own cost, apart;
* guideloom decode=: a ``DocumentStorage`` of ``RecordSchema(caption=Text(), image=Image())`` read by
  ``from_storage(..., decode={"image": {"size": 224, "mode": "RGB"}})`` (audio: ``decode=True``) and
  ``guideloom.collate.pad()``: the built-in path;
* msgpack records: what a user wrote before ``guideloom.fields``: ``DocumentMsgpackFormat`` records of the caption
  and the encoded bytes, read by ``from_storage`` and decoded in their own collate;
* the peers of ``media_peers`` (HF datasets, LitData, Mosaic MDS, WebDataset in 1 tar and in 10, Megatron-Energon),
  each as its docs show, decoding with the same function as the bare loop.

Also: each storage's size on disk against the encoded media plus the captions' UTF-8 (the goal for guideloom:
within 2%), and whole records and captions alone read per second by a guideloom reader. Peers run where installed
(``benchmarks/install_peers.sh``: run this under ``.venv-bench``). Writes ``results/media.json`` and ``.md``.

    python -m benchmarks.bench_media            # 10,000 images and 2,000 clips, 3 rounds
    python -m benchmarks.bench_media --quick    # 2,000 images and 400 clips, 1 round
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness, media_peers
from benchmarks.media_peers import AUDIO, IMAGES, SIDE, Medium
from guideloom import DocumentMsgpackFormat, DocumentStorage, StatefulDataLoader
from guideloom._fields import decoders
from guideloom.collate import pad
from guideloom.fields import Audio, Image, RecordSchema, Text

OURS = "guideloom decode="
SCHEMAS = {"image": RecordSchema(caption=Text(), image=Image()), "audio": RecordSchema(caption=Text(), audio=Audio())}
DECODE: dict[str, Any] = {"image": {"image": {"size": SIDE, "mode": "RGB"}}, "audio": True}


def own_pixels(data: Any) -> np.ndarray:
    """What ``ImageValue.decode(size=SIDE, mode="RGB")`` does, on bare bytes."""
    return decoders.decode_image(data, None, (SIDE, SIDE), "RGB").numpy()


OWN_DECODE = Medium("image", "jpg", own_pixels, media_peers.stacked)


def jpegs(count: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEGs of 240 to 272 pixels a side: smooth gradients under noise, as photos compress."""
    from PIL import Image as PILImage

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


def flacs(count: int, seed: int = 0, rate: int = 16_000) -> list[bytes]:
    """``count`` FLAC clips of 2 to 4 seconds: a tone gliding under a little noise, as speech compresses."""
    import soundfile

    rng = np.random.default_rng(seed)
    made = []
    for _ in range(count):
        frames = int(rng.integers(2 * rate, 4 * rate))
        time_s = np.arange(frames) / rate
        tone = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 400) * time_s * (1 + 0.1 * time_s))
        clip = (tone + rng.normal(0, 0.01, frames)).astype(np.float32)
        out = io.BytesIO()
        soundfile.write(out, clip, rate, format="FLAC", subtype="PCM_16")
        made.append(out.getvalue())
    return made


def captioned(media: list[bytes], kind: str) -> list[tuple[bytes, str]]:
    return [(data, f"{kind} {number}: {len(data)} bytes, made by the benchmark") for number, data in enumerate(media)]


def given_bytes(items: list[tuple[bytes, str]]) -> int:
    return sum(len(data) + len(caption.encode()) for data, caption in items)


# ----------------------------------------------------------------------------- guideloom


class UserCollate:
    """A user's own collate over msgpack records: decode each record's bytes, then batch as everyone does."""

    def __init__(self, medium: Medium) -> None:
        self.medium = medium

    def __call__(self, records: list[dict[str, Any]]) -> Any:
        return self.medium.collate([self.medium.decode(record[self.medium.field]) for record in records])


def write_ours(root: Path, items: list[tuple[bytes, str]], medium: Medium, shards: int) -> tuple[Any, Any]:
    fields = DocumentStorage(root / "fields", SCHEMAS[medium.field])
    records = DocumentStorage(root / "msgpack", DocumentMsgpackFormat())
    with fields.sync_writer() as fields_writer, records.sync_writer() as records_writer:
        for number, (data, caption) in enumerate(items):
            fields_writer.append(number % shards, {"caption": caption, medium.field: data})
            records_writer.append(number % shards, {"caption": caption, medium.field: data})
    return fields, records


def loader_rate(storage: Any, collate: Any, batch: int, workers: int, **options: Any) -> float:
    with StatefulDataLoader.from_storage(
        storage, collate, device="cpu", local_batch_size=batch, shuffle=True, seed=0, num_workers=workers, **options
    ) as loader:
        return media_peers.rate(loader)


def read_rate(storage: DocumentStorage, fields: tuple[str, ...] | None = None) -> float:
    with storage.sync_reader() as reader:
        indices = np.arange(len(reader), dtype=np.int64)
        start = time.perf_counter()
        if fields is None:
            records = reader.read_many(indices)
        else:
            records = [reader.read(int(index), fields=fields) for index in indices]
        return len(records) / (time.perf_counter() - start)


# ----------------------------------------------------------------------------- one medium, every reader


def prepared(
    name: str, make: Callable[[], Callable[[], float]], runs: dict[str, Callable[[], float]], notes: dict[str, str]
) -> None:
    """Add ``name``'s measurement to ``runs`` when its storage can be written (else say why in ``notes``)."""
    try:
        runs[name] = make()
    except Exception as error:  # a peer that is missing or fails is reported, not fatal
        notes[name] = f"not measured: {type(error).__name__}: {str(error).strip().splitlines()[-1][:200]}"
        traceback.print_exc()


def measure(
    root: Path, items: list[tuple[bytes, str]], medium: Medium, arguments: Any
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, float], dict[str, str], dict[str, float]]:
    """Every reader's items per second and per CPU-second (each round), storage sizes over the bytes given, notes,
    read rates."""
    batch, workers, count = arguments.batch, arguments.workers, len(items)
    runs: dict[str, Callable[[], float]] = {}
    notes: dict[str, str] = {}
    sizes: dict[str, float] = {}
    given = given_bytes(items)
    fields, records = write_ours(root, items, medium, arguments.shards)
    sizes[OURS] = media_peers.directory_bytes(root / "fields") / given
    sizes["msgpack records"] = media_peers.directory_bytes(root / "msgpack") / given
    runs["bare loop"] = lambda: media_peers.bare_rate(items, medium, batch, workers)
    if medium is IMAGES:  # the same decode and resize as guideloom's built-in one, without a loader around it
        runs["bare loop, guideloom's decode"] = lambda: media_peers.bare_rate(items, OWN_DECODE, batch, workers)
    runs[OURS] = lambda: loader_rate(fields, pad(), batch, workers, decode=DECODE[medium.field])
    runs["msgpack records, own collate"] = lambda: loader_rate(records, UserCollate(medium), batch, workers)

    def hf() -> Callable[[], float]:
        place = media_peers.hf_write(root / "hf", items, medium)
        sizes["HF datasets"] = media_peers.directory_bytes(place) / given
        problem = None if medium is IMAGES else media_peers.hf_audio_problem()
        if problem is not None:
            raise RuntimeError(problem)
        return lambda: media_peers.hf_rate(place, medium, batch, workers)

    feature = "Image()" if medium is IMAGES else "Audio()"
    prepared(f"HF datasets {feature}", hf, runs, notes)
    files = media_peers.media_files(root / "files", items, medium)

    def litdata() -> Callable[[], float]:
        place = media_peers.litdata_write(root / "litdata", files, medium)
        sizes["LitData"] = media_peers.directory_bytes(place) / given
        return lambda: media_peers.litdata_rate(place, medium, batch, workers)

    def mds() -> Callable[[], float]:
        place = media_peers.mds_write(root / "mds", items)
        sizes["Mosaic MDS"] = media_peers.directory_bytes(place) / given
        return lambda: media_peers.mds_rate(place, medium, batch, workers)

    prepared("LitData", litdata, runs, notes)
    prepared("Mosaic MDS", mds, runs, notes)
    tars: dict[int, list[str]] = {}
    for shards in (1, 10):

        def wds(shards: int = shards) -> Callable[[], float]:
            tars[shards] = media_peers.wds_write(root / f"wds{shards}", items, medium, shards)
            if shards == 1:
                sizes["WebDataset tar"] = media_peers.directory_bytes(root / "wds1") / given
            return lambda: media_peers.wds_rate(tars[shards], medium, batch, workers)

        prepared(f"WebDataset, {shards} tar{'s' if shards > 1 else ''}", wds, runs, notes)
    if medium is IMAGES and 10 in tars:

        def energon() -> Callable[[], float]:
            place = media_peers.energon_prepare(root / "wds10")
            return lambda: media_peers.energon_rate(place, count, batch, workers)

        prepared("Megatron-Energon", energon, runs, notes)
    rounds, per_cpu = interleaved_safely(runs, count, arguments.repeats, notes)
    reads = {
        "guideloom, whole records": read_rate(fields),
        "guideloom, captions only (fields=)": read_rate(fields, ("caption",)),
        "msgpack, whole records": read_rate(records),
    }
    return rounds, per_cpu, sizes, notes, reads


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (workers, pools), user and system."""
    multiprocessing.active_children()  # reaps the children that have ended, so their time is counted
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def counted(run: Callable[[], float], count: int) -> tuple[float, float]:
    """``run``'s items per second, and its items per CPU-second (all its processes, started and ended within it)."""
    before = cpu_seconds()
    rate = run()
    gc.collect()  # loaders dropped: their workers stop
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return rate, count / (cpu_seconds() - before)


def interleaved_safely(
    runs: dict[str, Callable[[], float]], count: int, repeats: int, notes: dict[str, str]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each reader once per round, rounds interleaved: items per second and per CPU-second, round by round; a
    reader that fails is dropped with a note."""
    rounds: dict[str, list[float]] = {name: [] for name in runs}
    per_cpu: dict[str, list[float]] = {name: [] for name in runs}
    for number in range(repeats):
        for name, run in runs.items():
            if name in notes:
                continue
            try:
                rate, efficiency = counted(run, count)
                rounds[name].append(rate)
                per_cpu[name].append(efficiency)
            except Exception as error:
                notes[name] = f"failed: {type(error).__name__}: {str(error).strip().splitlines()[-1][:200]}"
                traceback.print_exc()
            print(f"round {number + 1}: {name}: {rounds[name][-1:]} per s, {per_cpu[name][-1:]} per CPU-s", flush=True)
    kept = [name for name, values in rounds.items() if values and name not in notes]
    return {name: rounds[name] for name in kept}, {name: per_cpu[name] for name in kept}


def table(
    title: str, rounds: dict[str, list[float]], per_cpu: dict[str, list[float]], notes: dict[str, str]
) -> list[str]:
    bare, bare_cpu = statistics.median(rounds["bare loop"]), statistics.median(per_cpu["bare loop"])
    lines = [
        f"| {title} | {title}/s (median) | ratio to the bare loop | rounds ({title}/s) "
        f"| {title} per CPU-second (median) | ratio to the bare loop |",
        "|---|---|---|---|---|---|",
    ]
    for name, values in rounds.items():
        rate, efficiency = statistics.median(values), statistics.median(per_cpu[name])
        lines.append(
            f"| {name} | {rate:,.0f} | {rate / bare:.2f}x | {', '.join(f'{v:,.0f}' for v in values)} "
            f"| {efficiency:,.0f} | {efficiency / bare_cpu:.2f}x |"
        )
    lines += [f"| {name} | {note} | | | | |" for name, note in notes.items()]
    return lines


def main() -> None:
    parser = harness.argument_parser(__doc__)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--clips", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=4, help="shards of the guideloom storages")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2,000 images, 400 clips, 1 round")
    parser.add_argument("--only", choices=("image", "audio"), help="one medium alone")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.images, arguments.clips, arguments.repeats = 2_000, 400, 1
    load_before = harness.machine()["load_average"]
    results: dict[str, Any] = {"batch": arguments.batch, "workers": arguments.workers, "repeats": arguments.repeats}
    markdown: list[str] = []
    media = [(IMAGES, arguments.images, jpegs), (AUDIO, arguments.clips, flacs)]
    for medium, count, make in media:
        if arguments.only not in (None, medium.field):
            continue
        items = captioned(make(count), medium.field)
        with tempfile.TemporaryDirectory() as directory:
            rounds, per_cpu, sizes, notes, reads = measure(Path(directory), items, medium, arguments)
        bare, bare_cpu = statistics.median(rounds["bare loop"]), statistics.median(per_cpu["bare loop"])
        results[medium.field] = {
            "items": count,
            "per_second": {
                name: {"median": statistics.median(values), "ratio_to_bare": statistics.median(values) / bare}
                for name, values in rounds.items()
            },
            "per_cpu_second": {
                name: {"median": statistics.median(values), "ratio_to_bare": statistics.median(values) / bare_cpu}
                for name, values in per_cpu.items()
            },
            "rounds": rounds,
            "rounds_per_cpu_second": per_cpu,
            "notes": notes,
            "size_over_given": sizes,
            "guideloom_reads_per_second": reads,
        }
        unit = "images" if medium is IMAGES else "clips"
        markdown += [f"{count:,} {unit}, batch {arguments.batch}, {arguments.workers} workers", ""]
        markdown += table(unit, rounds, per_cpu, notes)
        markdown += ["", "| storage | size over the encoded media and captions |", "|---|---|"]
        markdown += [f"| {name} | {size:.4f}x |" for name, size in sizes.items()]
        markdown += ["", "| guideloom reader | records/s |", "|---|---|"]
        markdown += [f"| {name} | {rate:,.0f} |" for name, rate in reads.items()]
        markdown += [""]
    results["machine"] = harness.machine()
    results["machine"]["load_average_before"] = load_before
    markdown.append(
        f"Machine: {results['machine']['cpus']} cores, load average {load_before[0]:.1f} before and "
        f"{results['machine']['load_average'][0]:.1f} after (other jobs were running)."
    )
    text = "\n".join(markdown)
    print(text)
    harness.write_results("media", results, text)


if __name__ == "__main__":
    main()
