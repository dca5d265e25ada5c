"""Shared fixtures: a fresh storage path and a runner for isolated Python subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.processes import ROOT, child_environment


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group the tests for pytest-xdist's ``--dist loadgroup`` (scripts/test.sh): a test file's tests run on one
    worker, so its module fixtures are built once, except that a remote test runs with the other tests of its file
    on the same service (the three services' runs of a file spread over the workers), and the tests on a Ray
    cluster share one worker (two 2-CPU clusters at once would only fight for a small machine). A test marked with
    its own ``xdist_group`` keeps it."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))
            continue
        group = item.path.relative_to(ROOT).as_posix() if item.path.is_relative_to(ROOT) else str(item.path)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "service" in callspec.params:
            group += f"[{callspec.params['service']}]"
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def storage_path(tmp_path: Path) -> Path:
    """A path where no storage exists yet (its parent directory exists)."""
    return tmp_path / "storage"


@pytest.fixture(scope="session")
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a Python snippet in a fresh interpreter; ``args`` become ``sys.argv[1:]``; ``tests.*`` imports there.

    Used where a failure could take the test process down (a segfault, a hang, a
    huge allocation) or where a clean process is needed (memory measurements).
    """

    def run(code: str, *args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=child_environment(),
        )

    return run


@pytest.fixture(autouse=True, scope="session")
def _packing_cache_in_a_temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Packings of pack_documents=True are cached here, never in the user's cache directory."""
    os.environ["GUIDELOOM_CACHE_DIR"] = str(tmp_path_factory.mktemp("guideloom-cache"))


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[str]:
    """A local 2-CPU Ray cluster shared by a test module (starting one is slow); yields its address.

    The module's functions and classes are shipped to Ray's workers by value (they cannot import it).
    """
    import ray
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(request.module)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
