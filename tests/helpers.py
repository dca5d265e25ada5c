"""What many tests share: a raw-bytes format, storage factories, shard files, running test modules as scripts."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from guideloom import DocumentJsonFormat, DocumentStorage, TokenStorage
from guideloom._shards.layout import FOOTER
from guideloom._storage.storages import AnyFormatStorage
from guideloom.types import DocumentStorageFormat

ROOT = Path(__file__).resolve().parent.parent  # the repository: ``tests`` imports as a package from here

FOOTER_FIELDS = (
    "magic",
    "version",
    "flags",
    "shard",
    "record_count",
    "data_size",
    "data_crc",
    "index_crc",
    "header_crc",
)

# Names that are not exactly 12 ASCII digits + ".shard": a storage never reads such a file, even a valid shard.
CRAFTED_SHARD_NAMES = (
    "000000000001.shard.evil",
    "000000000001.shard\n",
    "000000000001.shard\r",
    "00000000000\u0661.shard",  # ARABIC-INDIC DIGIT ONE: a digit to \d, not to a file system
    "00000000000\uff11.shard",  # FULLWIDTH DIGIT ONE
    "0000000000001.shard",
    "00000000001.shard",
    "1.shard",
    "-00000000001.shard",
    " 00000000001.shard",
    "000000000001.SHARD",
    ".000000000001.shard",
    "000000000001.shard~",
    "000000000001.shard.tmp",
    "..000000000001.shard",
)


class RawFormat(DocumentStorageFormat[bytes, bytes]):
    """Records are their own bytes: decoding never fails and empty records are possible, so only storage is tested."""

    name = "raw-bytes"

    def pack(self, data: bytes) -> bytes:
        return bytes(data)

    def unpack(self, encoded_data: memoryview, shard: int) -> bytes:
        return bytes(encoded_data)


# ----------------------------------------------------------------------------- storages


def make_token_storage(
    path: Path,
    documents_per_shard: tuple[int, ...] = (7, 5, 9),
    *,
    dtype: str = "uint32",
    longest: int = 40,
    seed: int = 0,
) -> TokenStorage:
    """Shard k holds ``documents_per_shard[k]`` random documents of 1 to ``longest - 1`` tokens below 50,000."""
    rng = np.random.default_rng(seed)
    storage = TokenStorage(path, dtype)
    with storage.sync_writer() as writer:
        for shard, documents in enumerate(documents_per_shard):
            for _ in range(documents):
                writer.append(shard, rng.integers(0, 50_000, int(rng.integers(1, longest))))
    return storage


def make_document_storage(
    path: Path, count: int = 23, shards: int = 3, record: Callable[[int], dict[str, Any]] | None = None
) -> DocumentStorage[Any, Any]:
    """``count`` JSON records (``{"id": i}`` or ``record(i)``), spread in order over shards 0 to ``shards - 1``."""
    storage = DocumentStorage(path, DocumentJsonFormat())
    with storage.sync_writer() as writer:
        for index in range(count):
            writer.append(index * shards // count, record(index) if record else {"id": index})
    return storage


def open_storage(path: Path, kind: str) -> Any:
    """A storage of raw-bytes documents (``kind="documents"``) or uint16 tokens (``kind="tokens"``)."""
    return TokenStorage(path, "uint16") if kind == "tokens" else DocumentStorage(path, RawFormat())


def committed_shards(path: Path) -> list[int]:
    """The shards committed at ``path`` as readers see them (every shard file under its name in ``shards/``)."""
    return AnyFormatStorage(path).committed_shards()


def comparable(record: Any) -> Any:
    """A read record in a form that compares by value (token arrays as lists)."""
    return record.tolist() if hasattr(record, "tolist") else record


# ----------------------------------------------------------------------------- shard files


def shard_file(path: Path, shard: int = 1) -> Path:
    """The committed file of ``shard`` in the storage at ``path``."""
    return path / "shards" / f"{shard:012d}.shard"


def footer_fields(file: Path) -> list[Any]:
    """The shard file's footer, field by field (in the order of :data:`FOOTER_FIELDS`)."""
    return list(FOOTER.unpack(file.read_bytes()[-FOOTER.size :]))


def with_footer(data: bytes, fields: list[Any]) -> bytes:
    """Shard bytes with another footer whose own checksum is recomputed, as a buggy writer would leave them."""
    body = FOOTER.pack(*fields)[: FOOTER.size - 12]
    return data[: -FOOTER.size] + body + struct.pack("<I", zlib.crc32(body)) + bytes(8)


def rewrite_footer(file: Path, **changes: Any) -> None:
    """Change footer fields of a shard file (by name) and recompute the footer's own checksum."""
    fields = footer_fields(file)
    for key, value in changes.items():
        fields[FOOTER_FIELDS.index(key)] = value
    file.write_bytes(with_footer(file.read_bytes(), fields))


def set_offset(file: Path, position: int, value: int) -> None:
    """Overwrite entry ``position`` of a shard file's record index (the 8-byte offsets after the padded data)."""
    data = bytearray(file.read_bytes())
    data_size = FOOTER.unpack(bytes(data[-FOOTER.size :]))[FOOTER_FIELDS.index("data_size")]
    struct.pack_into("<Q", data, (data_size + 7) // 8 * 8 + 8 * position, value)
    file.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- child processes


def module_command(module: str, *arguments: object) -> list[str]:
    """Run a module of the test tree as a script in a fresh interpreter (give it :func:`child_environment`)."""
    return [sys.executable, "-m", module, *map(str, arguments)]


def run_harness(
    module: str, *arguments: object, timeout: float | None = None
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """Run a campaign's harness module; the finished process and its JSON lines (one a case, the summary last)."""
    completed = subprocess.run(
        module_command(module, *arguments), capture_output=True, text=True, timeout=timeout, env=child_environment()
    )
    return completed, [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]


def child_environment() -> dict[str, str]:
    """This process's environment with the repository first on ``PYTHONPATH``: a child imports ``tests.*``."""
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *([inherited] if inherited else [])])}


def gather_to_file(result: Any, out: str | Path) -> None:
    """Every rank's ``result``, gathered over the initialised process group and written as JSON by rank 0."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(gathered))


def take(loader: Any, count: int, convert: Callable[[Any], Any] = lambda batch: batch) -> list[Any]:
    """The loader's next ``count`` batches, each through ``convert``, crossing epochs as a training loop does."""
    batches: list[Any] = []
    while len(batches) < count:
        for batch in loader:
            batches.append(convert(batch))
            if len(batches) == count:
                break
    return batches


def assert_resumes_exactly(
    open_loader: Callable[[], Any], total: int, checkpoints: list[int], convert: Callable[[Any], Any]
) -> None:
    """After each checkpoint step k, a fresh loader given the state yields exactly what an unbroken run yields."""
    with open_loader() as loader:
        expected = take(loader, total, convert)
    for k in checkpoints:
        with open_loader() as loader:
            before = take(loader, k, convert)
            state = json.loads(json.dumps(loader.state_dict()))
        with open_loader() as resumed:
            resumed.load_state_dict(state)
            after = take(resumed, total - k, convert)
        assert before + after == expected, f"resume after step {k} diverged"
