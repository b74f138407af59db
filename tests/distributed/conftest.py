"""Fixtures of the dask executor's tests (see daskfarm.py); every test here is marked
``distributed`` (``pytest -m distributed`` selects them)."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from daskfarm import Cluster, start_cluster
from plugins.remote import Remote, S3Server

HERE = Path(__file__).resolve().parent
_FARMS = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "distributed: the dask executor and `optbuild worker` (loopback cluster)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.distributed)


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[Cluster]:
    """A scheduler and three nodes: ampere (compute capability 8.0), hopper (9.0), cpu, which
    store into one S3 bucket (``farm_remote``)."""
    pytest.importorskip("distributed")
    cluster = start_cluster(tmp_path_factory.mktemp("farm"), {"ampere": 2, "hopper": 2, "cpu": 2},
                            _bucket(s3_server))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def farm_remote(farm: Cluster) -> Remote:
    """The farm's remote cache, emptied: each test starts with nothing stored."""
    with contextlib.suppress(FileNotFoundError):
        farm.remote.fs.rm(farm.remote.root, recursive=True)
    return farm.remote


def _bucket(server: S3Server) -> Remote:
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=server.endpoint, skip_instance_cache=True, use_listings_cache=False)
    bucket = f"optbuild-farm-{os.getpid()}-{next(_FARMS)}"  # a farm per test module
    fs.mkdir(bucket)
    return Remote(f"s3://{bucket}/cache", fs, f"{bucket}/cache", server.endpoint)


