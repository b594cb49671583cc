"""Entries whose digest is not stored (SQLite without a keyring: the
verifier recomputes it from the plaintext beside it; docs/design.md, "Audit
chain"): a body removed behind the store's back cannot pass as expired or
erased, a digest taken off a sealed entry is named, and rows written the
previous way (every digest stored) still verify."""

from __future__ import annotations

from typing import Any

import pytest

from cairn.store import auditlinks, sqlite
from cairn.store.auditverify import verify_store
from cairn.store.retention import DataClass, expired_marker
from tests.audit.test_chain import a_step, first_problem, made
from tests.encryption.test_sealed_store import Raw, drive


def test_a_body_removed_from_an_entry_without_its_digest_is_tampering(place: str) -> None:
    """The body of an entry whose digest was not stored replaced by a
    retention marker by hand: nothing gives its digest any more, so it is
    named, never counted as expired (retention stores the digest first)."""
    app, runs = made(place, False)
    raw = Raw(place)
    seq = a_step(raw, runs["a1"])
    # (taken off here too, should the entry have been written with it stored)
    raw("UPDATE history SET digest = NULL, payload = :p WHERE run_id = :r AND seq = :s",
        p=expired_marker(DataClass.MODEL_BODIES, 1.0), r=runs["a1"], s=seq)
    chains = verify_store(app.store)
    assert chains.expired == 0
    assert chains.erased == 0
    assert str(chains.problems[0]) == (
        f"run {runs['a1']!r} entry {seq}: the entry's digest was not stored and its body cannot be read back "
        "to recompute it (removed or damaged)")
    app.close()


def test_a_digest_taken_off_a_sealed_entry_is_named(place: str) -> None:
    """A sealed entry's stored digest is keyed: the plain one recomputed from its ciphertext does not link."""
    app, runs = made(place, True)
    raw = Raw(place)
    seq = a_step(raw, runs["a1"])
    raw("UPDATE history SET digest = NULL WHERE run_id = :r AND seq = :s", r=runs["a1"], s=seq)
    problem = first_problem(app)
    assert f"run {runs['a1']!r} entry {seq}: the entry does not match its link: its payload or detail" \
        in problem
    app.close()


def test_entries_written_with_their_digest_stored_still_verify(tmp_path: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A SQLite database written before digests went unstored (the hot path
    as it was: digest and link both stored) verifies, alone and continued by
    the current code; an edit there is still named against the stored digest."""
    place = f"sqlite:///{tmp_path}/old.db"
    current = sqlite._audited

    def as_before(values: Any, event: Any, previous: Any, digester: Any) -> tuple[Any, bytes]:
        if previous is not None and digester is None:
            payload = event.payload
            return auditlinks.digest_and_link(previous, values, None if payload is None else payload.data,
                                              event.detail)
        return current(values, event, previous, digester)

    monkeypatch.setattr(sqlite, "_audited", as_before)
    app, runs = made(place, False)
    raw = Raw(place)
    assert raw("SELECT count(*) FROM history WHERE digest IS NULL") == [(0,)]
    monkeypatch.setattr(sqlite, "_audited", current)
    assert verify_store(app.store).problems == []
    later = app.start("canary", "after", tenant="a").run_id  # written the current way, beside them
    drive(app, later, "ok")
    assert raw("SELECT count(*) FROM history WHERE digest IS NULL AND run_id = :r", r=later)[0][0] > 0
    assert verify_store(app.store).problems == []
    seq = a_step(raw, runs["a1"])
    raw("UPDATE history SET payload = :p WHERE run_id = :r AND seq = :s", p=b'"forged"', r=runs["a1"], s=seq)
    problem = first_problem(app)
    assert f"run {runs['a1']!r} entry {seq}: the payload or detail differs from the digest" in problem
    app.close()
