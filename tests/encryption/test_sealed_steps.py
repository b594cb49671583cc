"""A journaled step's entry sealed and digested in one pass
(``cairn.store.sealedsteps``), on both backends: what it stores is what
``Sealer.seal_at`` and ``AuditKeys.sealed`` would (an envelope bound to its
place, sealed with the newest key of the tenant or the run's subject, a
digest keyed from the plaintext), a rotation here takes effect at the next
step and one in another process within ``KEY_REFRESH_SECONDS``; and the
one-pass path is the one these steps take (``seal_at`` is not called for
them)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.security.envelope import FLAG_ZLIB, Place, SealError, header_of
from cairn.security.keyring import LocalKeyring
from cairn.security.shredding import FileShredder
from cairn.store import sealing
from cairn.store.auditlinks import digest as plain_digest
from cairn.store.auditverify import verify_store
from cairn.store.keysql import SUBJECT_KEY_BASE
from cairn.store.rekey import version_of
from cairn.store.sealing import Sealer
from tests.encryption.test_sealed_store import Raw, keyring
from tests.engine.conftest import execute_once

STEPS = 4


def build(url: str, ring: Any, during: Callable[[int], None] = lambda i: None,
          value: Callable[[int], str] = lambda i: f"value {i}") -> tuple[cairn.App, Any]:
    """An app whose ``steps`` runs ``STEPS`` steps, ``during(i)`` in step ``i``, returning ``value(i)``."""
    app = cairn.App(db=url, keyring=ring, lease_seconds=5.0)

    @app.step()
    def echo(i: int) -> str:
        during(i)
        return value(i)

    @app.workflow(name="steps")
    def steps(ctx: cairn.Context) -> int:
        for i in range(STEPS):
            echo(i)
        return STEPS

    return app, steps


def step_rows(place: str, run_id: str) -> list[tuple[int, bytes, bytes]]:
    """``(seq, stored payload, stored digest)`` of the run's step entries."""
    rows = Raw(place)("SELECT seq, payload, digest FROM history WHERE run_id = :r "
                      "AND event = 'step.completed' ORDER BY seq", r=run_id)
    return [(seq, bytes(payload), bytes(digest)) for seq, payload, digest in rows]


@pytest.fixture
def seal_at_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The positions ``Sealer.seal_at`` sealed (a store made after this fixture calls the spy)."""
    calls: list[str] = []
    original = Sealer.seal_at

    def spy(self: Sealer, tenant: str, run: str, table: str, position: str, kind: str, data: bytes) -> bytes:
        calls.append(f"{table} {position}")
        return original(self, tenant, run, table, position, kind, data)

    monkeypatch.setattr(Sealer, "seal_at", spy)
    return calls


def run_once(app: cairn.App) -> str:
    run_id = app.start("steps").run_id
    assert execute_once(app, run_id) == "completed"
    return run_id


def test_a_step_is_sealed_at_its_place_and_digested_from_its_plaintext_in_one_pass(
        place: str, seal_at_calls: list[str]) -> None:
    app, _ = build(place, keyring())
    store: Any = app.store
    run_once(app)  # the tenant's key made, its audit key derived: one pass from here
    del seal_at_calls[:]
    run_id = run_once(app)
    rows = step_rows(place, run_id)
    assert len(rows) == STEPS
    assert not [c for c in seal_at_calls if c.startswith("history")]  # none of them took ``seal_at``
    for i, (seq, payload, stored) in enumerate(rows):
        at = Place("default", run_id, "history", f"seq {seq}", "payload")
        value = store.sealer.open(at, payload)
        assert value == f'"value {i}"'.encode()
        assert stored == store.audit_keys.key("default").digest(value, None)  # keyed, from the plaintext
        assert stored != plain_digest(value, None)
        for other in (at._replace(run="another"), at._replace(position=f"seq {seq + 1}"),
                      at._replace(tenant="b"), at._replace(table="runs"), at._replace(kind="detail")):
            with pytest.raises(SealError, match=r"refused|does not decrypt"):
                store.sealer.open(other, payload)
    assert [e.payload.data for e in store.history(run_id) if e.event.value == "step.completed"] == [
        f'"value {i}"'.encode() for i in range(STEPS)]
    assert verify_store(store).problems == []
    app.close()


def large(i: int) -> str:
    """A step result of 2,000 bytes that compresses well (``COMPRESS_AT`` is 512)."""
    return f"value {i} " + "z" * 2000


def test_a_large_step_result_is_compressed_and_sealed_in_the_one_pass(
        place: str, seal_at_calls: list[str]) -> None:
    """A step result of ``COMPRESS_AT`` bytes or more takes the one pass too
    (issue 25, 2026-12-07; it took ``seal_at`` and ``envelope.seal`` before):
    compressed, then sealed at its place, its digest keyed from the plaintext."""
    app, _ = build(place, keyring(), value=large)
    store: Any = app.store
    run_once(app)
    del seal_at_calls[:]
    run_id = run_once(app)
    rows = step_rows(place, run_id)
    assert len(rows) == STEPS
    assert not [c for c in seal_at_calls if c.startswith("history")]
    for i, (seq, payload, stored) in enumerate(rows):
        at = Place("default", run_id, "history", f"seq {seq}", "payload")
        assert header_of(payload, at).flags & FLAG_ZLIB
        assert len(payload) < 200  # compressed before sealing
        value = store.sealer.open(at, payload)
        assert value == f'"{large(i)}"'.encode()
        assert stored == store.audit_keys.key("default").digest(value, None)
        for other in (at._replace(run="another"), at._replace(position=f"seq {seq + 1}"),
                      at._replace(tenant="b")):
            with pytest.raises(SealError, match=r"refused|does not decrypt"):
                store.sealer.open(other, payload)
    assert verify_store(store).problems == []
    app.close()


def test_a_large_run_input_or_result_is_compressed_by_seal_at(place: str) -> None:
    """``Sealer.seal_at`` (a run's input and result) compresses a value of
    ``COMPRESS_AT`` bytes or more before sealing it, as ``envelope.seal``
    does (issue 25, 2026-12-07: it went through ``envelope.seal`` before),
    bound to its place; a small one is sealed as it is."""
    app, _ = build(place, keyring())
    store: Any = app.store
    run_id = run_once(app)
    big = b'{"text": "' + b"q" * 3000 + b'"}'
    for kind in ("input", "result"):
        at = Place("default", run_id, "runs", "-", kind)
        sealed = store.sealer.seal_at("default", run_id, "runs", "-", kind, big)
        assert header_of(sealed, at).flags & FLAG_ZLIB
        assert len(sealed) < 200
        assert store.sealer.open(at, sealed) == big
        with pytest.raises(SealError, match=r"does not decrypt"):
            store.sealer.open(at._replace(kind="error"), sealed)
        small = store.sealer.seal_at("default", run_id, "runs", "-", kind, b"{}")
        assert not header_of(small, at).flags & FLAG_ZLIB
        assert store.sealer.open(at, small) == b"{}"
    app.close()


def test_a_rotation_takes_effect_at_the_next_step_here_and_within_the_refresh_elsewhere(
        place: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ring = keyring()
    elsewhere: list[int] = []

    def rotate_elsewhere(i: int) -> None:  # another process rotates while step 1 runs
        if i == 1 and elsewhere:
            other, _ = build(place, ring)
            elsewhere.append(other.store.rotate("default"))
            other.close()

    app, _ = build(place, ring, rotate_elsewhere)
    store: Any = app.store
    run_once(app)
    assert [version_of(p) for _, p, _ in step_rows(place, run_once(app))] == [1] * STEPS
    assert store.rotate("default") == 2  # in this process: at the next step
    assert [version_of(p) for _, p, _ in step_rows(place, run_once(app))] == [2] * STEPS
    elsewhere.append(0)
    assert [version_of(p) for _, p, _ in step_rows(place, run_once(app))] == [2] * STEPS  # key 3: not yet
    assert elsewhere[-1] == 3
    monkeypatch.setattr(sealing, "KEY_REFRESH_SECONDS", 0.0)  # the cached key is old at every value
    assert [version_of(p) for _, p, _ in step_rows(place, run_once(app))] == [3] + [4] * (STEPS - 1)
    assert elsewhere[-1] == 4
    assert verify_store(store).problems == []
    app.close()


def test_a_subjects_steps_are_sealed_with_the_subjects_key(place: str, tmp_path: Path) -> None:
    app, _ = build(place, LocalKeyring({"k1": os.urandom(32)}, "k1", FileShredder(tmp_path / "subjects")))
    run_once(app)
    run_id = app.start("steps", subject="someone").run_id
    assert execute_once(app, run_id) == "completed"
    versions = {version_of(p) for _, p, _ in step_rows(place, run_id)}
    assert len(versions) == 1
    assert min(v for v in versions if v is not None) > SUBJECT_KEY_BASE
    assert verify_store(app.store).problems == []
    app.close()
