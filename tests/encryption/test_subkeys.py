"""One derivation of a tenant's keys (``DataKeys.subkey``) and the audit
digest of an entry just sealed (``AuditKeys.sealed``), on both backends.

The per-tenant keys derived from a data key (the artifacts' synthetic-nonce
key, the audit digest key, the workspace object address key) keep the values
they had when each was derived by its own code: stored digests and addresses
stay valid. They are recomputed here from the data key unwrapped by the
keyring, independently of the store's code. An entry's digest taken from the
plaintext the store just sealed is the one its row, read back and opened,
gives; a row read back is never taken for the entry sealed in this process.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from cairn.security.envelope import SealError
from cairn.store.auditlinks import AuditKey
from cairn.store.auditverify import verify_store
from cairn.store.sealing import context
from tests.encryption.test_sealed_store import Raw, build, keyring, runs_of_one


def _hmac(key: bytes, label: bytes) -> bytes:
    return hmac.new(key, label, hashlib.sha256).digest()


def test_the_tenant_keys_keep_the_values_they_were_derived_with(place: str) -> None:
    app = build(place, keyring())
    runs_of_one(app)
    store: Any = app.store
    (row,) = [r for r in store.inner.data_keys("default") if r.version == 1]
    data_key = store.keys.keyring.unwrap(row.kek_id, row.wrapped, context("default", 1))
    nonce = _hmac(data_key, b"cairn synthetic nonce")
    assert store.keys.nonce_key("default", 1) == nonce
    assert store._workspace.address_key("default") == _hmac(nonce, b"cairn workspace object address")
    assert store.artifacts.address_key("default") == _hmac(nonce, b"cairn artifact address")
    audit = AuditKey(_hmac(data_key, b"cairn audit digest\x00default"))
    assert store.audit_keys.key("default").digest(b"x", {"k": 1}) == audit.digest(b"x", {"k": 1})
    # none of them is the data key, and each purpose has its own
    assert len({data_key, nonce, store._workspace.address_key("default"),
                store.artifacts.address_key("default")}) == 4
    with pytest.raises(SealError, match="data key 7 of tenant 'default' is not stored"):
        store.keys.subkey("default", b"any purpose", version=7)
    app.close()


def test_a_just_sealed_entry_is_digested_as_its_row_opens(place: str) -> None:
    app = build(place, keyring())
    run_id = runs_of_one(app)
    store: Any = app.store
    assert store.audit_keys.known == {}  # every entry sealed was digested as it was written
    raw = Raw(place)
    rows = raw("SELECT seq, digest FROM history WHERE run_id = :r AND payload IS NOT NULL ORDER BY seq",
               r=run_id)
    assert len(rows) >= 4
    for event in store.inner.history_at(run_id, [seq for seq, _ in rows]):  # as stored: sealed
        assert store.audit_keys.digest(event, "default") == bytes(dict(rows)[event.seq]), event.seq
    assert verify_store(store).problems == []
    app.close()


def test_a_payload_moved_within_a_run_by_the_process_that_sealed_it_is_named(place: str) -> None:
    """The rows were sealed (and their plaintexts known) by this very process:
    what it verifies is still what the database holds, opened at its place."""
    app = build(place, keyring())
    run_id = runs_of_one(app)
    raw = Raw(place)
    (first, second) = raw("SELECT seq, payload FROM history WHERE run_id = :r AND payload IS NOT NULL "
                          "ORDER BY seq LIMIT 2", r=run_id)
    raw("UPDATE history SET payload = :p WHERE run_id = :r AND seq = :s", p=first[1], r=run_id, s=second[0])
    problems = verify_store(app.store).problems
    assert any(p.seq == second[0] and "does not open" in p.what for p in problems), problems
    app.close()


def test_threads_sealing_a_tenants_first_values_make_one_data_key(place: str) -> None:
    """Two threads sealing the first values of a tenant that has no data key
    yet (a LangGraph saver's put and put_writes do) create exactly one:
    the check for a key and the making of the first are one step under the
    keys' lock. The lock is made to yield after each release, so that the
    other thread runs whenever the lock is let go between those two."""
    import threading
    import time

    app = build(place, keyring())
    store: Any = app.store
    keys = store.keys

    class Yielding:
        """A lock whose holder lets the other thread run once it lets go."""

        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __enter__(self) -> None:
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()
            time.sleep(0.1)

    keys._lock = Yielding()
    start = threading.Barrier(2)
    got: list[int] = []

    def seal_first() -> None:
        start.wait()
        got.append(keys.writer("fresh")[0])

    threads = [threading.Thread(target=seal_first) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == [1, 1]
    assert [r.version for r in store.inner.data_keys("fresh")] == [1]
