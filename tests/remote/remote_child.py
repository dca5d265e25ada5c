"""A process of the object-storage tests: writes or reads a storage on the test server, as told by argv.

``python remote_child.py STORAGE_OPTIONS_JSON COMMAND URL CACHE_DIR [ARGS]``; credentials come from the environment.
The commands that die uploading patch the S3 backend's upload: they run on S3 only.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np

import guideloom._remote.s3_backend
from guideloom import TokenStorage


def shard_tokens(shard: int, documents: int = 20, length: int = 500) -> list[np.ndarray]:
    """The documents a test writes into ``shard``: different for every shard, the same in every process."""
    generator = np.random.default_rng(shard)
    return [generator.integers(0, 2**31, length, dtype=np.uint32) for _ in range(documents)]


class _DyingFile(io.FileIO):
    """A shard file being uploaded that kills its process once half its bytes were sent a second time.

    botocore reads a body once for its checksum, then again to send it; dying in the second pass
    kills the writer while the object is on the wire.
    """

    dies_after = 1.5  # of the file's size, read in all

    def read(self, size: int = -1) -> bytes:
        chunk = super().read(size)
        self.consumed = getattr(self, "consumed", 0) + len(chunk)
        if self.consumed > os.fstat(self.fileno()).st_size * self.dies_after:
            print("dying", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return chunk


def main(options: str, command: str, url: str, cache_dir: str, *args: str) -> None:
    storage = TokenStorage(url, storage_options=json.loads(options), cache_dir=Path(cache_dir))
    if command == "write":  # shard ids, each committed by this process
        with storage.sync_writer() as writer:
            for shard in map(int, args):
                for tokens in shard_tokens(shard):
                    writer.append(shard, tokens)
        print("committed", flush=True)
    elif command in ("die-uploading", "die-in-parts"):
        opened: Any = _DyingFile
        if command == "die-in-parts":  # uploaded in 5 MiB parts: dies reading the second, the first sent
            guideloom._remote.s3_backend.MULTIPART_BYTES = guideloom._remote.s3_backend.PART_BYTES = 5 << 20
            _DyingFile.dies_after = 0.5
        guideloom._remote.s3_backend.open = opened  # type: ignore[attr-defined]
        with storage.sync_writer() as writer:  # a 4 MB shard, or 12 MB in parts
            for tokens in shard_tokens(int(args[0]), documents=200 if command == "die-uploading" else 600, length=5000):
                writer.append(int(args[0]), tokens)
        print("survived", flush=True)
    elif command == "read":  # every document; prints the sum of all tokens
        with storage.sync_reader() as reader:
            print(sum(int(reader.read(i).sum()) for i in range(len(reader))), flush=True)
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(*sys.argv[1:])
