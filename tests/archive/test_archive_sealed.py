"""A sealed run's archive (issue 26 item 5, ``store.archiveseal``): its
values stored opened inside the object sealed whole, so it compresses; no
plaintext of them anywhere in the object's bytes; a restore seals each one
back to the very envelope it was, so the rows and the audit chain are those
of the run before; a value under another subject's key is never opened into
it, and erasing the run's subject leaves its archive undecryptable."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.security.envelope import FLAG_ZLIB, Place, header, is_envelope, seal
from cairn.security.keyring import LocalKeyring
from cairn.security.shredding import FileShredder
from cairn.store.archive import ArchiveError, RunArchive, decode, encode
from cairn.store.archiveseal import RAW, TEXT, holds_opened, opened, resealed
from cairn.store.auditverify import verify_store
from tests.archive.test_archive import _object, rows_of
from tests.encryption.test_sealed_store import CANARY, Raw, build, drive, forms, inflated, keyring
from tests.engine.conftest import execute_once


def _opened_values(tables: dict[str, list[Any]]) -> list[dict[str, Any]]:
    columns = [("history", RAW["history"]), ("history", 14), *RAW.items(), *TEXT.items()]
    return [row[c] for t, c in columns for row in tables[t] if type(row[c]) is dict]


def _envelopes(tables: dict[str, list[Any]]) -> int:
    """Values still stored as envelopes (bytes, or a detail's base64 JSON)."""
    count = sum(1 for t, c in RAW.items() for row in tables[t]
                if type(row[c]) is bytes and is_envelope(row[c]))
    return count + sum(1 for row in tables["history"] if isinstance(row[14], str) and '"sealed"' in row[14])


def test_a_sealed_archive_holds_every_value_opened_and_none_of_it_in_clear(place: str) -> None:
    app = build(place, keyring())
    run_id = app.start("canary", f"{CANARY}-input", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    before = rows_of(place, run_id)
    record = app.operator.archive_run(run_id)
    stored, _ = _object(place, app, record.ref)
    scanned = [stored, *inflated(stored)]
    assert not [form for form in forms(CANARY) for blob in scanned if form in blob]
    # opened with the tenant's key: every sealed value is inside in plaintext (what lets it compress)
    body = decode(stored, "a", run_id, app.store.inner._archive_codec()[1])
    values = _opened_values(body.tables)
    assert _envelopes(body.tables) == 0, "a sealed value was archived as ciphertext"
    assert len(values) >= 8
    assert any(CANARY.encode() in bytes(v["p"]) for v in values)
    assert {"t" in v for v in values} == {True, False}
    assert any("j" in v for v in values)
    assert record.stored_bytes < sum(len(v["p"]) for v in values) + 40 * len(values)
    # read back, restored: the very envelopes, and the chain verifies
    assert [e.payload for e in app.history(run_id)]
    app.operator.restore(run_id)
    assert rows_of(place, run_id) == before
    assert verify_store(app.store, run_id=run_id).problems == []
    app.close()


def test_opened_values_reseal_to_the_byte_and_a_mismatch_is_kept_as_stored(tmp_path: Path) -> None:
    app = build(f"sqlite:///{tmp_path}/c.db", keyring())
    run_id = app.start("canary", "x", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    sealer = app.store.sealer
    rows = app.store.inner._in_read(lambda tx: app.store.inner._archivable(tx, run_id))[1]
    opened_rows = opened("a", run_id, rows, sealer)
    assert holds_opened(opened_rows)
    assert resealed("a", run_id, opened_rows, sealer) == rows
    # a value sealed at another place does not seal back at this one: kept as it was stored
    moved = sealer.seal(Place("a", run_id, "memory_run", "elsewhere", "value"), b"v")
    row = (run_id, "scratch", "a", moved, *rows["memory_run"][0][4:])
    assert opened("a", run_id, {"memory_run": [row]}, sealer)["memory_run"] == [row]
    # one that opens here but was compressed otherwise (another zlib level) would not seal back: kept
    place = Place("a", run_id, "memory_run", "scratch", "value")
    version, cipher = sealer.writer("a", run_id)
    head, nonce, plain = header(FLAG_ZLIB, version, "a"), os.urandom(12), b"a fairly long value " * 60
    assert zlib.compress(plain, 9) != zlib.compress(plain, 1)
    other = head + nonce + cipher.encrypt(nonce, zlib.compress(plain, 9), head + place.associated())
    assert sealer.open(place, other) == plain
    row = (run_id, "scratch", "a", other, *rows["memory_run"][0][4:])
    assert opened("a", run_id, {"memory_run": [row]}, sealer)["memory_run"] == [row]
    app.close()


def test_a_long_value_is_opened_whichever_compressor_sealed_it(tmp_path: Path) -> None:
    """A long value is compressed before it is sealed: in a window fitted to
    it under a random nonce since 2026-12-07 (``envelope.compress``), by
    ``zlib.compress`` before. Both are opened into the archive and seal back
    to the byte, the fitted one marked ``"f"``. Without the mark every long
    value written since was archived as its ciphertext: 0.43x of the run's
    hot bytes (``bench.archive --sealed``), not 0.27x."""
    app = build(f"sqlite:///{tmp_path}/l.db", keyring())
    run_id = app.start("canary", "x", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    sealer = app.store.sealer
    rows = app.store.inner._in_read(lambda tx: app.store.inner._archivable(tx, run_id))[1]
    place = Place("a", run_id, "memory_run", "scratch", "value")
    plain = b"a fairly long value, " * 60
    version, cipher = sealer.writer("a", run_id)
    fitted = sealer.seal(place, plain)  # as every writer seals one now
    before = seal(cipher, version, place, plain, os.urandom(12), fitted=False)  # as they did before
    assert fitted[12:24] != before[12:24]
    assert sealer.open(place, fitted) == sealer.open(place, before) == plain
    stored = {"memory_run": [(run_id, "scratch", "a", value, *rows["memory_run"][0][4:])
                             for value in (fitted, before)]}
    mapped = opened("a", run_id, stored, sealer)
    markers = [row[3] for row in mapped["memory_run"]]
    assert [type(m) for m in markers] == [dict, dict], "a long value was archived as its ciphertext"
    assert [m.get("f") for m in markers] == [1, None]
    assert [bytes(m["p"]) for m in markers] == [plain, plain]
    assert resealed("a", run_id, mapped, sealer) == stored
    app.close()


def subject_app(tmp_path: Path) -> tuple[cairn.App, LocalKeyring]:
    ring = LocalKeyring({"kek1": os.urandom(32)}, "kek1", FileShredder(tmp_path / "subjects"))
    app = cairn.App(db=f"sqlite:///{tmp_path}/s.db", keyring=ring, lease_seconds=5.0)

    @app.workflow(name="mine")
    def mine(ctx: cairn.Context, text: str) -> str:
        ctx.memory.run.put("scratch", f"{text} run-memory")
        return f"{text} result"

    return app, ring


def test_another_subjects_value_stays_under_its_key_and_erasure_shreds_the_archive(tmp_path: Path) -> None:
    app, _ = subject_app(tmp_path)
    run_id = app.start("mine", f"{CANARY}-alice", subject="alice", tenant="a").run_id
    assert execute_once(app, run_id) == "completed"
    sealer = app.store.sealer
    rows = app.store.inner._in_read(lambda tx: app.store.inner._archivable(tx, run_id))[1]
    own = rows["memory_run"][0]
    bobs = (run_id, "bob", "a", sealer.seal(Place("a", run_id, "memory_run", "bob", "value"), b"bob's",
                                            subject="bob"), *own[4:])
    mapped = opened("a", run_id, {"memory_run": [own, bobs]}, sealer)["memory_run"]
    assert type(mapped[0][3]) is dict  # the run's subject's value: opened into its subject-sealed archive
    assert mapped[1] == bobs  # bob's: his key alone opens it, archived or not
    record = app.operator.archive_run(run_id)
    copy = _object(f"sqlite:///{tmp_path}/s.db", app, record.ref)[0]
    open_ = app.store.inner._archive_codec()[1]
    assert len(decode(copy, "a", run_id, open_).history) == record.entries
    app.erase(subject="alice", tenant="a")
    with pytest.raises(ArchiveError, match="erased"):
        decode(copy, "a", run_id, open_)  # a copy kept from before the erasure: shredded with the key
    app.close()


def test_opened_values_in_an_unsealed_archive_are_refused(tmp_path: Path) -> None:
    """Plaintext stand-ins are accepted only inside a sealed object: an
    unsealed archive holding one (forged with write access to the database
    and the artifact store) is refused naming the run, never read as a value."""
    place = f"sqlite:///{tmp_path}/p.db"
    app = build(place, None)
    run_id = app.start("canary", "forged", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    app.operator.archive_run(run_id)
    archived = app.store.run_archived(run_id)
    history = list(archived.history)
    seq = next(i for i, row in enumerate(history) if type(row[12]) is bytes)
    history[seq] = (*history[seq][:12], {"v": 1, "n": bytes(12), "p": b"forged"}, *history[seq][13:])
    forged = app.store.put_artifact(encode(RunArchive("a", run_id, {**archived.tables, "history": history})))
    Raw(place)("UPDATE run_archives SET ref = :ref WHERE run_id = :r", ref=forged, r=run_id)
    app.store._archive_cache().clear()  # a fresh process: nothing decoded yet
    with pytest.raises(ArchiveError, match=f"run '{run_id}' is refused: it holds opened values but is not"):
        app.history(run_id)
    app.close()
