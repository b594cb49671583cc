"""Fixtures of the acceptance tier: a ``cluster`` of real worker processes,
on each backend (the root ``conftest.py``'s ``backend``: SQLite and
PostgreSQL), and a ``bank_cluster`` of workers moving money at the fake bank
on each backend (the fencing test)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairn.demo.bank import BankProcess
from tests.acceptance.harness import Cluster
from tests.backends import StoreBackend
from tests.distributed.cluster import DistCluster


@pytest.fixture
def cluster(tmp_path: Path, backend: StoreBackend, call_failed: Callable[[], bool]) -> Iterator[Cluster]:
    """Workers on the test's store, an effects file in ``tmp_path``; every
    worker process the test spawned is SIGKILLed and reaped when the test
    ends, pass or fail."""
    cluster = Cluster(tmp_path, backend)
    try:
        yield cluster
    finally:
        if call_failed():
            print(f"\nworker logs (in {tmp_path}):\n{cluster.describe_workers()}")
        cluster.cleanup()


@pytest.fixture
def bank_cluster(tmp_path: Path, backend: StoreBackend, bank: BankProcess,
                 call_failed: Callable[[], bool]) -> Iterator[DistCluster]:
    """Workers moving money at the fake bank (``tests.distributed.bank_app``)
    on the test's store; reaped like ``cluster``'s."""
    cluster = DistCluster(tmp_path, backend, bank)
    try:
        yield cluster
    finally:
        if call_failed():
            print(f"\nworker logs (in {tmp_path}):\n{cluster.describe_workers()}\n--- bank ---\n"
                  f"{bank.log_tail(10)}")
        cluster.cleanup()
