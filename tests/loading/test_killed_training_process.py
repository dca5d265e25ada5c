"""A training process killed with SIGKILL takes its loader's worker processes with it, even workers blocked handing
over batches that nobody reads any more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return [int(child) for task in tasks for child in (task / "children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_workers_die_with_a_training_process_killed_mid_epoch(tmp_path: Path) -> None:
    training = textwrap.dedent(
        f"""
        import time
        from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader
        storage = DocumentStorage({str(tmp_path / "records")!r}, DocumentJsonFormat())
        with storage.sync_writer() as writer:
            for index in range(4000):
                writer.append(index // 1000, {{"id": index, "text": "x" * 2000}})
        loader = StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=200, num_workers=2, prefetch_factor=4
        )
        next(iter(loader))
        print("reading", flush=True)
        time.sleep(600)  # the workers fill the pipe with batches nobody takes
        """
    )
    process = subprocess.Popen([sys.executable, "-c", training], stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        assert process.stdout is not None and process.stdout.readline() == "reading\n"
        time.sleep(2)
        workers = _children(process.pid)
        assert len(workers) >= 2
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(map(_alive, workers)):
            time.sleep(0.2)
        assert [worker for worker in workers if _alive(worker)] == []
    finally:
        process.kill()
        for worker in workers:
            if _alive(worker):
                os.kill(worker, signal.SIGKILL)
