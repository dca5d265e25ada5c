"""A run killed mid-epoch (SIGKILL: nothing closed) and resumed from its last checkpoint on the same cache downloads
at most 1.1x its machine's share over both runs: the resumed run finds in the cache what the killed one fetched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from guideloom import TokenStorage
from tests.remote.conftest import ServiceStorage

SHARDS = 128  # a machine's share of 64: a shard or two fetched at the kill or past the epoch are 1.5% each
SEQUENCE = 33
CHILD = """
import json, os, signal, sys
from pathlib import Path
from guideloom import StatefulDataLoader, TokenStorage

url, options, cache, limit, state_file, save_at, kill_at = sys.argv[1:]
storage = TokenStorage(url, storage_options=json.loads(options), cache_dir=cache, cache_limit_bytes=int(limit))
loader = StatefulDataLoader.from_storage(
    storage, device="cpu", local_batch_size=4, sequence_length=33, shuffle=True, seed=7, shuffle_window=12,
    rank=0, world_size=2, local_world_size=1,
)
state = Path(state_file)
if state.exists():
    loader.load_state_dict(json.loads(state.read_text()))
for step, _ in enumerate(loader, 1):
    if step == int(save_at):
        state.write_text(json.dumps(loader.state_dict()))
    if step == int(kill_at):
        os.kill(os.getpid(), signal.SIGKILL)
print("done", flush=True)
"""


def test_a_killed_run_resumed_on_its_cache_downloads_at_most_1_1x_its_share(
    service: ServiceStorage, tmp_path: Path
) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "writer")
    generator = np.random.default_rng(5)
    with storage.sync_writer() as writer:
        for shard in range(SHARDS):
            writer.append(shard, generator.integers(0, 50_000, 1000, dtype=np.uint32))
    sizes = storage.snapshot().rows["size"]
    share = int(sizes.sum()) / 2
    since = len(service.reads(".shard"))
    arguments = [
        service.url,
        json.dumps(service.options),
        str(tmp_path / "machine"),
        str(SHARDS // 4 * int(sizes.max())),
    ]
    arguments.append(str(tmp_path / "state.json"))
    run = [sys.executable, "-c", CHILD, *arguments]
    killed = subprocess.run([*run, "60", "70"], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    resumed = subprocess.run([*run, "0", "0"], capture_output=True, text=True, timeout=300)
    assert resumed.stdout == "done\n", resumed.stderr
    ratio = sum(size for _, _, _, size in service.reads(".shard")[since:]) / share
    print(f"{service.name}: {ratio:.4f}x the share over both runs")
    assert ratio <= 1.1, ratio
