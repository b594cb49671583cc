"""A sealed store hands what it does not seal to its inner store, on both
backends: a forwarded name reads the inner store at each lookup (a method
set on it later is the one called), an attribute set through the wrapper is
the inner store's and reads back; and no contract method that carries a
run's values is forwarded unsealed (a pin for any change to how the wrapper
forwards, such as taking its ``__getattr__`` hook off the hot path)."""

from __future__ import annotations

import inspect
from typing import Any

import cairn
from cairn.store.contract import Store
from cairn.store.sealed import SealedStore
from tests.encryption.test_sealed_store import keyring

#: the record types that carry a run's values: a contract method taking or returning one is sealed
VALUE_TYPES = ("Payload", "HistoryEvent", "RunRecord", "NewRun", "Delivery", "Approval", "Claim",
               "MemoryItem", "MemoryWrite", "ThreadMessage")


def sealed(place: str) -> tuple[cairn.App, Any]:
    app = cairn.App(db=place, keyring=keyring())
    return app, app.store


def test_forwarded_names_read_the_inner_store_at_each_lookup(place: str) -> None:
    app, store = sealed(place)
    try:
        inner = store.inner
        assert store.run_counts() == inner.run_counts()  # a method of the inner store's class
        inner.run_counts = lambda: [("set", "later", "on", 1)]
        assert store.run_counts() == [("set", "later", "on", 1)]
        assert store.audit_digest == inner.audit_digest  # an attribute of the inner store itself
        store.bench_marker = 7  # a new name, set through the wrapper: the inner store's
        assert inner.bench_marker == 7
        assert store.bench_marker == 7
        assert "bench_marker" not in vars(store)
        inner.bench_marker = 8
        assert store.bench_marker == 8
        assert not hasattr(store, "no_such_attribute")
    finally:
        app.close()


def test_no_contract_method_carrying_run_values_is_forwarded(place: str) -> None:
    app, store = sealed(place)
    try:
        forwarded = []
        for name in dir(Store):
            if name.startswith("_") or any(name in vars(cls) for cls in SealedStore.__mro__[:-1]):
                continue
            forwarded.append(name)
            text = str(inspect.signature(getattr(Store, name)))
            carried = [kind for kind in VALUE_TYPES if kind in text]
            assert not carried, f"{name} carries {carried} but is forwarded to the inner store unsealed"
            assert callable(getattr(store, name))
        assert forwarded  # the check saw the forwarded methods (the contract's reads of counts, tokens, ...)
    finally:
        app.close()
