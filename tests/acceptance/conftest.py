"""Fixtures of the acceptance tier: a ``cluster`` of real worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.harness import Cluster


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A database and effects file in ``tmp_path``; every worker process the
    test spawned is SIGKILLed and reaped when the test ends, pass or fail."""
    cluster = Cluster(tmp_path)
    try:
        yield cluster
    finally:
        if request.node.stash.get(_FAILED, False):
            print(f"\nworker logs (in {tmp_path}):\n{cluster.describe_workers()}")
        cluster.cleanup()
