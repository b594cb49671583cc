"""The audit chain as the stores write it (issue 26): every entry linked in
the statement or transaction that writes it, on both backends, sealed or
not; a key rotation and re-encryption keep every link; each kind of edit
made behind the store's back is named by the verifier."""

from __future__ import annotations

from typing import Any

import pytest

import cairn
from cairn.store.auditlinks import GENESIS, digest, link, link_version, row_link
from cairn.store.auditsql import ENTRY_COLUMNS
from cairn.store.auditverify import recomputed_digest, verify_store
from tests.encryption.test_sealed_store import Raw, build, drive, keyring, runs_of


def made(place: str, sealed: bool) -> tuple[cairn.App, dict[str, str]]:
    app = build(place, keyring() if sealed else None)
    runs = runs_of(app)
    cancelled = app.start("canary", "to cancel", tenant="a").run_id
    app.cancel(cancelled, reason="an operator's reason")
    runs["cancelled"] = cancelled
    return app, runs


def test_every_entry_is_linked_when_written_and_verifies(place: str, sealed: bool) -> None:
    app, runs = made(place, sealed)
    raw = Raw(place)
    # a link says its version (auditlinks.link_version): 32 bytes version 1 (linked at commit, a
    # new run's first entries, PostgreSQL's statements that hash in the server), 33 bytes starting
    # 0x02 version 2 (a journaled step's with a keyring, hashed by the client on both backends),
    # 0x03 version 3 (the same without a keyring: its plain digest BLAKE2b)
    assert raw("SELECT count(*) FROM history WHERE link IS NULL OR length(link) NOT IN (32, 33)") == [(0,)]
    assert raw("SELECT count(*) FROM history WHERE length(link) = 33")[0][0] > 0
    # a digest is not stored only where the verifier can recompute it: without a keyring, on
    # SQLite and PostgreSQL alike (journaled entries; entries linked at commit keep theirs), never
    # when sealed
    unstored = raw("SELECT count(*) FROM history WHERE digest IS NULL")[0][0]
    if not sealed:
        assert unstored > 20
    else:
        assert unstored == 0
    assert raw("SELECT count(*) FROM history WHERE digest IS NOT NULL AND length(digest) <> 32") == [(0,)]
    chains = verify_store(app.store)
    assert chains.problems == []
    assert chains.entries == raw("SELECT count(*) FROM history")[0][0] > 50
    assert set(chains.heads) == set(runs.values())
    app.close()


def test_the_first_link_is_the_documented_formula(place: str) -> None:
    """An independent recomputation of a run's first entry (not the store's code path)."""
    app = build(place, None)
    run_id = app.start("canary", "one").run_id
    raw = Raw(place)
    row = raw("SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt, "
              "started_at, payload_ref, detail, digest, link FROM history WHERE run_id = :r AND seq = 1",
              r=run_id)[0]
    import json

    entry_digest = digest(None, json.loads(row[13]))
    assert row[14] is None or bytes(row[14]) == entry_digest  # stored or not, the link holds it:
    assert bytes(row[15]) == link(GENESIS, row[:13], entry_digest)
    app.close()


def test_rotation_and_reencryption_keep_the_chain_verified(place: str) -> None:
    app, _ = made(place, True)
    store: Any = app.store
    stored_before = Raw(place)("SELECT run_id, seq, payload, digest, link FROM history ORDER BY run_id, seq")
    assert verify_store(store).problems == []
    assert store.rotate("a") == 2
    assert store.reencrypt("a").moved > 0
    stored_after = Raw(place)("SELECT run_id, seq, payload, digest, link FROM history ORDER BY run_id, seq")
    resealed = [b for b, a in zip(stored_before, stored_after, strict=True) if b[2] != a[2]]
    assert resealed, "the pass re-sealed no history payload: the test would prove nothing"
    assert [r[:2] + r[3:] for r in stored_before] == [r[:2] + r[3:] for r in stored_after]
    chains = verify_store(store)
    assert chains.problems == []
    run_id = app.start("canary", "after", tenant="a").run_id  # new entries under key 2 link on
    drive(app, run_id, "ok")
    assert verify_store(store).problems == []
    app.close()


# -- each edit behind the store's back, named --------------------------------------------------


def chain_rows(raw: Raw, run_id: str) -> list[tuple[Any, ...]]:
    """A run's entries as the verifier reads them (``ENTRY_COLUMNS``), links as bytes."""
    rows = raw(f"SELECT {', '.join(ENTRY_COLUMNS)} FROM history WHERE run_id = :r ORDER BY seq", r=run_id)
    return [(*row[:16], None if row[16] is None else bytes(row[16]), row[17]) for row in rows]


def rewrite_in_version(raw: Raw, run_id: str, version: int) -> None:
    """Rewrite a run's links as the code before version 3 wrote them: every
    link of ``version`` (1: SHA-256, as before version 2; 2: BLAKE2b over the
    plain SHA-256 digest, as before version 3) from the one before."""
    previous = GENESIS
    for row in chain_rows(raw, run_id):
        entry_digest = row[15] if row[15] is not None else recomputed_digest(row, version)
        assert entry_digest is not None
        previous = row_link(previous, row, bytes(entry_digest), version)
        raw("UPDATE history SET link = :l WHERE run_id = :r AND seq = :s", l=previous, r=run_id, s=row[1])
    assert {link_version(row[16]) for row in chain_rows(raw, run_id)} == {version}



@pytest.mark.parametrize("version", [1, 2])
def test_links_of_earlier_versions_verify_and_a_relabelled_link_is_named(place: str, version: int) -> None:
    """A run whose every link is of version 1 (SHA-256, 32 bytes: as written
    before version 2, issue 26, 2026-12-07) or of version 2 (BLAKE2b over the
    plain SHA-256 digest: as written before version 3, chain26) verifies; a
    link of version 3 replaced by the link of an earlier version of the same
    entry (its label downgraded, the hash and its digest recomputed
    correctly) no longer is what the next entry's link chained from, which
    is named."""
    app, runs = made(place, False)
    raw = Raw(place)
    run_id = runs["a1"]
    assert {link_version(row[16]) for row in chain_rows(raw, run_id)} == {1, 3}  # both in one chain
    rewrite_in_version(raw, run_id, version)
    assert verify_store(app.store).problems == []
    app.close()
    # again as written, then one version-2 link (not the last) relabelled to version 1
    app, runs = made(place, False)
    raw = Raw(place)
    run_id = runs["a1"]
    rows = chain_rows(raw, run_id)
    index = next(i for i, row in enumerate(rows[:-1]) if link_version(row[16]) == 3)
    row = rows[index]
    previous = GENESIS if index == 0 else rows[index - 1][16]
    entry_digest = row[15] if row[15] is not None else recomputed_digest(row, version)
    assert entry_digest is not None
    downgraded = row_link(previous, row, bytes(entry_digest), version)
    assert link_version(downgraded) == version
    raw("UPDATE history SET link = :l WHERE run_id = :r AND seq = :s", l=downgraded, r=run_id, s=row[1])
    problem = first_problem(app)
    assert f"run {run_id!r} entry {row[1] + 1}" in problem
    assert "does not match its link" in problem
    app.close()




def first_problem(app: cairn.App) -> str:
    problems = verify_store(app.store).problems
    assert problems, "the edit went unnoticed"
    return str(problems[0])


def a_step(raw: Raw, run_id: str) -> int:
    return int(raw("SELECT min(seq) FROM history WHERE run_id = :r AND payload IS NOT NULL", r=run_id)[0][0])


def test_an_edited_payload_is_named(place: str, sealed: bool) -> None:
    app, runs = made(place, sealed)
    raw = Raw(place)
    seq = a_step(raw, runs["a1"])
    if sealed:  # one bit of the ciphertext
        data = bytearray(raw("SELECT payload FROM history WHERE run_id = :r AND seq = :s",
                             r=runs["a1"], s=seq)[0][0])
        data[-1] ^= 1
        raw("UPDATE history SET payload = :p WHERE run_id = :r AND seq = :s", p=bytes(data), r=runs["a1"],
            s=seq)
        assert "does not open" in first_problem(app)
    else:
        raw("UPDATE history SET payload = :p WHERE run_id = :r AND seq = :s", p=b'"forged"', r=runs["a1"],
            s=seq)
        # the digest recomputed from the edited payload (not stored without a keyring) no longer links
        assert "payload or detail (its digest, not stored" in first_problem(app)
    assert f"entry {seq}" in first_problem(app)
    app.close()


def test_a_forged_actor_is_named(place: str, sealed: bool) -> None:
    app, runs = made(place, sealed)
    raw = Raw(place)
    seq = a_step(raw, runs["b1"])
    raw("UPDATE history SET worker = 'someone-else' WHERE run_id = :r AND seq = :s", r=runs["b1"], s=seq)
    problem = first_problem(app)
    assert f"run {runs['b1']!r} entry {seq}" in problem
    assert "metadata" in problem
    app.close()


def test_a_deleted_entry_is_named(place: str) -> None:
    app, runs = made(place, False)
    raw = Raw(place)
    raw("DELETE FROM history WHERE run_id = :r AND seq = 3", r=runs["a2"])
    assert f"run {runs['a2']!r} entry 3: entry 3 is missing" in first_problem(app)
    app.close()


def test_an_entry_copied_from_another_run_is_named(place: str) -> None:
    app, runs = made(place, False)
    raw = Raw(place)
    seq = a_step(raw, runs["a1"])
    # a1's step entry overwritten by a2's at the same seq, every column but the run id (digest and link too)
    columns = ("event", "at", "epoch", "worker", "position", "step_kind", "name", "input_hash", "attempt",
               "started_at", "payload", "payload_ref", "detail", "digest", "link")
    raw("UPDATE history SET " + ", ".join(
        f"{c} = (SELECT o.{c} FROM history AS o WHERE o.run_id = :b AND o.seq = :s)" for c in columns)
        + " WHERE run_id = :a AND seq = :s", a=runs["a1"], b=runs["a2"], s=seq)
    assert f"run {runs['a1']!r} entry {seq}" in first_problem(app)
    app.close()
