"""The keyed digest and erasure (issue 26, audit2): with encryption on, an
entry's stored digest is keyed under the tenant's audit key (keyed BLAKE2b;
HMAC-SHA-256 in entries written before, still verified), so a guessed
plaintext cannot be confirmed from it; a rotation and re-encryption keep it;
an entry whose data key was destroyed is reported erased, its link still
checked, while an edited ciphertext under a live key stays tampered."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main as cli
from cairn.security.keyring import LocalKeyring, new_kek_line
from cairn.store.auditkeys import AuditKeys
from cairn.store.auditlinks import DIGEST_PERSON, AuditKey, body, digest, link, link_version
from cairn.store.auditverify import verify_store
from tests.audit.test_chain import a_step, made
from tests.encryption.test_sealed_store import Raw, build, drive, execute_once, keyring, runs_of


def reopened(app: cairn.App, place: str) -> cairn.App:
    """The app in a new process (a ``cairn audit verify`` after the erasure): no key cached."""
    ring = app.store.keys.keyring  # type: ignore[attr-defined]
    app.close()
    return build(place, ring)


def sealed_entries(raw: Raw) -> list[tuple[str, int]]:
    """The entries that hold a sealed value: a payload, a sealed detail, an operator's sealed reason."""
    rows = raw("SELECT run_id, seq, payload, detail FROM history ORDER BY run_id, seq")
    return [(r[0], r[1]) for r in rows
            if r[2] is not None or (r[3] is not None and ('"sealed"' in r[3] or "cairn-sealed:" in r[3]))]


def stored_digest(raw: Raw, run_id: str, seq: int) -> bytes:
    return bytes(raw("SELECT digest FROM history WHERE run_id = :r AND seq = :s", r=run_id, s=seq)[0][0])


def plain_digest(app: Any, run_id: str, seq: int) -> bytes:
    """What the unkeyed SHA-256 of the entry's plaintext would be (the store opens it)."""
    (event,) = app.store.history_at(run_id, [seq])
    return digest(None if event.payload is None else event.payload.data, event.detail)


def test_a_sealed_entry_digest_does_not_confirm_its_plaintext(place: str) -> None:
    app, runs = made(place, True)
    raw = Raw(place)
    seq = a_step(raw, runs["a1"])
    stored = stored_digest(raw, runs["a1"], seq)
    assert stored != plain_digest(app, runs["a1"], seq)
    # every entry holding a sealed value (a payload, a sealed detail, an operator's reason), every run
    sealed = sealed_entries(raw)
    assert len(sealed) > 20
    for run_id, seq in sealed:
        assert stored_digest(raw, run_id, seq) != plain_digest(app, run_id, seq), (run_id, seq)
    # an entry stored in the clear (a lifecycle entry's detail) keeps a plain digest: nothing to hide
    clear = raw("SELECT detail, digest FROM history WHERE run_id = :r AND seq = 1", r=runs["a1"])[0]
    assert "sealed" not in clear[0]
    assert bytes(clear[1]) == plain_digest(app, runs["a1"], 1)
    assert verify_store(app.store).problems == []
    app.close()


def test_each_tenant_has_its_own_audit_key_and_it_is_not_a_data_key(place: str) -> None:
    """One plaintext in two tenants: two digests (a key per tenant, not one for the database)."""
    app, _ = made(place, True)
    keys = app.store.audit_keys  # type: ignore[attr-defined]
    a, b = keys.key("a").digest(b"same", {"k": 1}), keys.key("b").digest(b"same", {"k": 1})
    assert a != b != digest(b"same", {"k": 1})
    assert a == keys.key("a").digest(b"same", {"k": 1})  # deterministic, or no digest would verify
    app.close()


def test_the_audit_digest_is_keyed_blake2b_and_its_first_version_rfc_2104_hmac_sha256() -> None:
    """``AuditKey.digest`` (version 2) is BLAKE2b-256 keyed with the audit key
    and personalized; ``digest_v1``'s precomputed pads give what the standard
    library's HMAC gives; the two never agree."""
    key = bytes(range(32))
    body = msgspec.msgpack.Encoder(order="sorted").encode((b"x", {"b": 1, "a": 2}))
    v2 = hashlib.blake2b(body, key=key, digest_size=32, person=b"cairn audit 2").digest()
    assert DIGEST_PERSON == b"cairn audit 2"
    assert AuditKey(key).digest(b"x", {"a": 2, "b": 1}) == v2
    assert AuditKey(key).digest_v1(b"x", {"a": 2, "b": 1}) == hmac.digest(key, body, "sha256") != v2
    assert AuditKey(bytes(32)).digest(b"x", {"a": 2, "b": 1}) != v2  # keyed


def test_a_chain_digested_with_hmac_before_blake2b_still_verifies(place: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries written before version 2 (their keyed digests HMAC-SHA-256, by
    a writer as it was: ``AuditKey.digest`` then, and no keyed state for the
    one-pass step) verify after the change, and so does a run begun then and
    finished after, whose chain holds both versions; an edit of an old entry
    is still found."""
    ring = keyring()
    with monkeypatch.context() as old:
        old.setattr(AuditKey, "digest", AuditKey.digest_v1)
        key_of = AuditKeys.key

        def without_keyed_state(self: AuditKeys, tenant: str) -> AuditKey:
            found = key_of(self, tenant)
            self.keyed.pop(tenant, None)  # the step's inline digest did not exist: ``AuditKeys.sealed``
            return found

        old.setattr(AuditKeys, "key", without_keyed_state)
        app = build(place, ring)
        runs = runs_of(app)
        begun = app.start("canary", "begun before", tenant="a").run_id
        assert execute_once(app, begun) == "suspended"
        app.close()
    raw = Raw(place)
    app = build(place, ring)  # the writer of today
    assert drive_on(app, begun) == "completed"
    chains = verify_store(app.store)
    assert chains.problems == [], chains.problems
    keys = app.store.audit_keys  # type: ignore[attr-defined]
    versions = {}
    for run_id, seq in sealed_entries(raw):
        (event,) = app.store.history_at(run_id, [seq])
        data = None if event.payload is None else event.payload.data
        key = keys.key(raw("SELECT tenant FROM runs WHERE run_id = :r", r=run_id)[0][0])
        stored = stored_digest(raw, run_id, seq)
        version = 2 if stored == key.digest(data, event.detail) else 1
        assert version == 2 or stored == key.digest_v1(data, event.detail), (run_id, seq)
        versions.setdefault(run_id, set()).add(version)
    assert all(versions[run] == {1} for run in runs.values())
    assert versions[begun] == {1, 2}
    # an old entry's digest rewritten (an HMAC of another plaintext, under the right key) and every
    # link after it recomputed (the links are keyless): only the digest check can tell
    run_id, seq = runs["a2"], a_step(raw, runs["a2"])
    forged = keys.key("a").digest_v1(b'"forged"', None)
    raw("UPDATE history SET digest = :d WHERE run_id = :r AND seq = :s", d=forged, r=run_id, s=seq)
    relink(raw, run_id, seq)
    problems = verify_store(app.store).problems
    assert [(p.run_id, p.seq) for p in problems] == [(run_id, seq)], problems
    assert "differs from the digest recorded" in str(problems[0])
    app.close()


def relink(raw: Raw, run_id: str, seq: int) -> None:
    """Recompute the links of ``run_id`` from entry ``seq`` on, as a forger could."""
    rows = raw("SELECT seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt, "
               "started_at, payload_ref, digest FROM history WHERE run_id = :r AND seq >= :s ORDER BY seq",
               r=run_id, s=seq)
    previous = bytes(raw("SELECT link FROM history WHERE run_id = :r AND seq = :s",
                         r=run_id, s=seq - 1)[0][0])
    for row in rows:
        previous = link(previous, (run_id, *row[:12]), bytes(row[12]))
        raw("UPDATE history SET link = :l WHERE run_id = :r AND seq = :s", l=previous, r=run_id, s=row[0])


def drive_on(app: cairn.App, run_id: str) -> str:
    """``drive`` from the signal on, for a run already at its signal."""
    app.signal(run_id, "go", "ok")
    assert execute_once(app, run_id) == "suspended"  # at the approval
    (request,) = app.approvals(run_id=run_id)
    app.approve(run_id, request.request_id)
    return execute_once(app, run_id)


def test_unsealed_digest_stays_plain_sha256(place: str) -> None:
    """Without a keyring a step's digest is not stored and its link holds the
    plain digest: BLAKE2b (``cairn digest 3``) in a link of version 3 where the
    client hashed it, SHA-256 in a link of version 1 where PostgreSQL did."""
    app, runs = made(place, False)
    raw = Raw(place)
    seq = a_step(raw, runs["a1"])
    plain = plain_digest(app, runs["a1"], seq)
    (event,) = app.store.history_at(runs["a1"], [seq])
    encoded = msgspec.msgpack.Encoder(order="sorted").encode(
        [None if event.payload is None else event.payload.data, event.detail])
    plain_v3 = hashlib.blake2b(encoded, digest_size=32, person=b"cairn digest 3").digest()
    stored = raw("SELECT digest FROM history WHERE run_id = :r AND seq = :s", r=runs["a1"], s=seq)[0][0]
    # not stored (no keyring, either backend): the link holds the plain digest
    assert stored is None
    row = raw("SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, "
              "attempt, started_at, payload_ref, link FROM history WHERE run_id = :r AND seq = :s",
              r=runs["a1"], s=seq)[0]
    previous = raw("SELECT link FROM history WHERE run_id = :r AND seq = :s",
                   r=runs["a1"], s=seq - 1)[0][0]
    # a step's link of version 3 where the client hashed it, of version 1 where PostgreSQL did
    stored_link = bytes(row[13])
    if link_version(stored_link) == 3:
        hashed = bytes(previous) + body(row[:13], plain_v3)
        v3 = hashlib.blake2b(hashed, digest_size=32, person=b"cairn link 3").digest()
        assert stored_link == b"\x03" + v3
    else:
        assert stored_link == link(bytes(previous), row[:13], plain)
    app.close()


def test_rotation_and_reencryption_keep_the_keyed_digests(place: str) -> None:
    app, runs = made(place, True)
    store: Any = app.store
    raw = Raw(place)
    before = raw("SELECT run_id, seq, digest, link FROM history ORDER BY run_id, seq")
    assert store.rotate("a") == 2
    assert store.reencrypt("a").moved > 0
    assert raw("SELECT run_id, seq, digest, link FROM history ORDER BY run_id, seq") == before
    assert verify_store(store).problems == []
    seq = a_step(raw, runs["a1"])
    assert stored_digest(raw, runs["a1"], seq) \
        != plain_digest(app, runs["a1"], seq)
    app.close()


def test_a_destroyed_key_reports_erased_not_tampered(place: str) -> None:
    app, runs = made(place, True)
    raw = Raw(place)
    raw("DELETE FROM data_keys WHERE tenant = 'b'")
    app = reopened(app, place)
    chains = verify_store(app.store)
    assert chains.problems == []
    b_runs = {run_id for (run_id,) in raw("SELECT run_id FROM runs WHERE tenant = 'b'")}
    b_sealed = [entry for entry in sealed_entries(raw) if entry[0] in b_runs]
    assert chains.erased == len(b_sealed) > 5
    assert runs["b1"] in chains.heads  # the chain around the erased entries still links
    app.close()


def test_an_erased_entry_whose_metadata_is_edited_is_still_tampered(place: str) -> None:
    app, runs = made(place, True)
    raw = Raw(place)
    raw("DELETE FROM data_keys WHERE tenant = 'b'")
    app = reopened(app, place)
    seq = a_step(raw, runs["b1"])
    raw("UPDATE history SET worker = 'someone-else' WHERE run_id = :r AND seq = :s", r=runs["b1"], s=seq)
    problems = verify_store(app.store).problems
    assert problems, "the edit went unnoticed"
    assert f"run {runs['b1']!r} entry {seq}" in str(problems[0])
    assert "metadata" in str(problems[0])
    app.close()


def test_an_edited_ciphertext_on_a_live_key_stays_tampered(place: str) -> None:
    app, runs = made(place, True)
    raw = Raw(place)
    raw("DELETE FROM data_keys WHERE tenant = 'b'")  # another tenant's erasure changes nothing for a
    seq = a_step(raw, runs["a1"])
    where = {"r": runs["a1"], "s": seq}
    data = bytearray(raw("SELECT payload FROM history WHERE run_id = :r AND seq = :s", **where)[0][0])
    data[-1] ^= 1
    raw("UPDATE history SET payload = :p WHERE run_id = :r AND seq = :s", p=bytes(data), **where)
    chains = verify_store(app.store)
    assert chains.problems, "the edit went unnoticed"
    assert "does not open" in str(chains.problems[0])
    assert f"entry {seq}" in str(chains.problems[0])
    app.close()


def test_a_database_adopted_into_encryption_still_verifies(place: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries digested in the clear before ``cairn keys adopt`` sealed them
    keep their plain digests: they verify, and new sealed entries are keyed."""
    monkeypatch.setenv("CAIRN_KEYRING", "")
    keys = tmp_path / "keys"
    keys.write_text(new_kek_line("k1") + "\n")
    plain = build(place, None, inline_limit=1 << 20)
    runs_of(plain)
    plain.close()
    done = CliRunner().invoke(cli, ["--db", place, "keys", "adopt", "--keyring", f"file:{keys}"])
    assert done.exit_code == 0, done.output
    app = build(place, LocalKeyring.from_file(keys), inline_limit=1 << 20)
    assert verify_store(app.store).problems == []
    later = app.start("canary", "after adoption", tenant="a").run_id
    drive(app, later, "ok")
    raw = Raw(place)
    seq = a_step(raw, later)
    assert stored_digest(raw, later, seq) != plain_digest(app, later, seq)
    assert verify_store(app.store).problems == []
    app.close()


def test_a_key_version_that_never_existed_is_an_edit_not_an_erasure(place: str) -> None:
    """An envelope header rewritten to name key 99 (the tenant's newest is 1) hides nothing as 'erased'."""
    app, runs = made(place, True)
    raw = Raw(place)
    seq = a_step(raw, runs["a1"])
    where = {"r": runs["a1"], "s": seq}
    data = bytearray(raw("SELECT payload FROM history WHERE run_id = :r AND seq = :s", **where)[0][0])
    data[4:8] = (99).to_bytes(4, "big")
    raw("UPDATE history SET payload = :p WHERE run_id = :r AND seq = :s", p=bytes(data), **where)
    app = reopened(app, place)
    chains = verify_store(app.store)
    assert chains.erased == 0
    assert chains.problems, "the edit went unnoticed"
    assert f"run {runs['a1']!r} entry {seq}: a sealed value does not open" in str(chains.problems[0])
    app.close()


def test_data_key_1_destroyed_after_a_rotation_erases_every_sealed_entry_of_the_tenant(place: str) -> None:
    """The audit key comes from data key 1: without it no sealed entry's digest can be recomputed,
    those sealed under key 2 included (they still open): all ERASED, none TAMPERED."""
    app, _ = made(place, True)
    store: Any = app.store
    assert store.rotate("b") == 2
    later = app.start("canary", "under key 2", tenant="b").run_id
    drive(app, later, "ok")
    raw = Raw(place)
    raw("DELETE FROM data_keys WHERE tenant = 'b' AND version = 1")
    app = reopened(app, place)
    chains = verify_store(app.store)
    assert chains.problems == []
    b_runs = {run_id for (run_id,) in raw("SELECT run_id FROM runs WHERE tenant = 'b'")}
    assert later in b_runs
    assert chains.erased == len([e for e in sealed_entries(raw) if e[0] in b_runs])
    app.close()
