"""Fixtures of the dask executor's tests (see daskfarm.py); every test here is marked
``distributed`` (``pytest -m distributed`` selects them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daskfarm import Cluster, start_cluster

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "distributed: the dask executor and `optbuild worker` (loopback cluster)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.distributed)


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory, s3_server) -> Iterator[Cluster]:
    """A scheduler and three nodes: ampere (compute capability 8.0), hopper (9.0), cpu."""
    pytest.importorskip("distributed")
    cluster = start_cluster(tmp_path_factory.mktemp("farm"), {"ampere": 2, "hopper": 2, "cpu": 2})
    try:
        yield cluster
    finally:
        cluster.stop()


