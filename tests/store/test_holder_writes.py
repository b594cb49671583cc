"""The registry of holder writes (``contract.HOLDER_WRITES``) is complete.

The fencing matrix of the contract suite is derived from the registry, so
a holder write missing from it would go untested. A holder write is fenced on
the epoch its caller holds, so it takes an ``epoch``: every public method of
the contract and of both SQL stores that does is in the registry, and every
name in it is a method of the contract.
"""

from __future__ import annotations

import inspect

import pytest

from cairn.store.contract import HOLDER_WRITES, Store
from cairn.store.postgres import PostgresStore
from cairn.store.sqlite import SQLiteStore
from tests.store.contract.helpers import HOLDER_CASES


def _takes_an_epoch(kind: type) -> set[str]:
    return {name for name, member in inspect.getmembers(kind, inspect.isfunction)
            if not name.startswith("_") and "epoch" in inspect.signature(member).parameters}


@pytest.mark.parametrize("kind", [Store, SQLiteStore, PostgresStore], ids=lambda k: k.__name__)
def test_every_method_that_takes_an_epoch_is_a_registered_holder_write(kind: type) -> None:
    missing = _takes_an_epoch(kind) - HOLDER_WRITES
    assert not missing, f"{kind.__name__} writes a held run through {sorted(missing)}: add it to " \
                        "contract.HOLDER_WRITES (and a case to the fencing matrix)"


def test_every_registered_holder_write_is_a_contract_method_with_a_fencing_case() -> None:
    assert _takes_an_epoch(Store) >= HOLDER_WRITES
    assert {method for method, _ in HOLDER_CASES.values()} == HOLDER_WRITES
