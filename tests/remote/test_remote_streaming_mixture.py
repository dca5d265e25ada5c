"""A windowed mixture of two remote storages: each machine downloads its share of each component about once.

Machines are separate cache directories (as separate disks); the server counts the shard downloads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._mixture.mixture import Mixture
from tests.remote.conftest import ServiceStorage
from tests.remote.test_remote_streaming import SEQUENCE, _downloads, _storage, _write_corpus

SHARDS = 20  # per component


@pytest.fixture
def components(service: ServiceStorage, tmp_path: Path) -> tuple[dict[str, str], int, int]:
    """The URLs of two token storages of 20 equal shards, their largest shard object, and a component's samples."""
    urls = {name: f"{service.url}-{name}" for name in ("a", "b")}
    for name, url in urls.items():
        storage = TokenStorage(url, storage_options=service.options, cache_dir=tmp_path / f"writer-{name}")
        _write_corpus(storage, SHARDS)
    storage = _storage(urls["a"], service, tmp_path / "counting", None)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=1, sequence_length=SEQUENCE) as loader:
        samples = loader.sample_count
    return urls, int(storage.snapshot().rows["size"].max()), samples


def test_each_machine_downloads_its_share_of_each_component_about_once(
    service: ServiceStorage, tmp_path: Path, components: tuple[dict[str, str], int, int]
) -> None:
    urls, largest, samples = components
    machines, cache_shards = 2, SHARDS // 2 // 2  # half a machine's share of a component
    window = cache_shards - 3  # the window, a shard prefetched, one downloading
    for machine in range(machines):
        before = len(service.reads(".shard"))
        cache = tmp_path / f"machine-{machine}"
        storages = {name: _storage(url, service, cache / name, cache_shards * largest) for name, url in urls.items()}
        # An epoch just short of one pass of each component on every machine.
        mixture = Mixture(storages, {"a": 1, "b": 1}, samples_per_epoch=2 * samples - 64, block_size=16)
        with StatefulDataLoader.from_storage(
            mixture,
            device="cpu",
            local_batch_size=4,
            sequence_length=SEQUENCE,
            shuffle=True,
            seed=7,
            rank=machine,
            world_size=machines,
            local_world_size=1,
            shuffle_window=window,
        ) as loader:
            read = sum(len(batch) for batch in loader)
        assert read >= samples - 40
        for name, url in urls.items():
            component = url.split("/")[-1]
            downloads = {path: size for path, size in _downloads(service, before).items() if path.startswith(component)}
            assert max(downloads.values()) <= largest, (
                f"machine {machine} downloaded a shard of {name} twice: {downloads}"
            )
            share = SHARDS / machines
            assert sum(downloads.values()) <= (1.1 * share + 1) * largest, f"machine {machine}, {name}: {downloads}"


def test_a_mixture_read_in_the_global_order_through_small_caches_warns_for_its_components(
    service: ServiceStorage, tmp_path: Path, components: tuple[dict[str, str], int, int]
) -> None:
    urls, largest, _ = components
    storages = {name: _storage(url, service, tmp_path / name, 8 * largest) for name, url in urls.items()}
    mixture = Mixture(storages, {"a": 1, "b": 1})
    options = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True}
    with pytest.warns(UserWarning, match=r"in one global order .*shuffle_window=4") as warned:
        StatefulDataLoader.from_storage(mixture, **options).close()
    assert [str(warning.message).split(" in one")[0][-8:] for warning in warned] == ["corpus-a", "corpus-b"]
