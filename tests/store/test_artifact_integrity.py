"""Issue 9 item 8: artifacts are verified.

An artifact's name is the SHA-256 of its bytes, so a store can always tell
edited or damaged bytes from the ones it was given: reading refuses them
(an edited file was replayed as a step's result), storing the same bytes
again rewrites them (an existing file used to be trusted blindly), and the
effect barrier of a ``write`` tool's intent covers the arguments it
offloaded to an artifact (they were left in the page cache while the intent
itself was fsynced).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cairn
from cairn.codec import values
from cairn.errors import PayloadError
from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import Durability, Payload
from cairn.store.sqlite import SQLiteStore
from tests.store.contract.helpers import FakeClock, claim, intent, new_run

ORIGINAL = b'"' + b"x" * 100_000 + b'"'
FORGED = b'"' + b"y" * 100_000 + b'"'


_PG_URLS: dict[int, str] = {}


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        opened = PostgresStore(url)
        _PG_URLS[id(opened)] = url
    else:
        opened = SQLiteStore(tmp_path / "a.db")
    yield opened
    _PG_URLS.pop(id(opened), None)
    opened.close()


def tamper(store: Store, ref: str, data: bytes) -> None:
    """Replace the stored bytes of ``ref`` as someone with access to where they are kept would."""
    if isinstance(store, SQLiteStore):
        (store.artifact_dir / ref[:2] / ref).write_bytes(data)
    else:
        assert isinstance(store, PostgresStore)
        with psycopg.connect(_PG_URLS[id(store)], autocommit=True) as conn:
            conn.execute(f"UPDATE {store.schema}.artifacts SET data = %s WHERE ref = %s", (data, ref))


def test_edited_bytes_are_refused_naming_the_artifact(store: Store) -> None:
    ref = store.put_artifact(ORIGINAL)
    tamper(store, ref, FORGED)
    with pytest.raises(PayloadError, match=f"artifact {ref} .*damaged"):
        store.get_artifact(ref)
    tamper(store, ref, ORIGINAL[:10])  # truncated, as by a crash or a full disk
    with pytest.raises(PayloadError, match=ref):
        store.get_artifact(ref)


def test_storing_the_bytes_again_rewrites_a_damaged_artifact(store: Store) -> None:
    ref = store.put_artifact(ORIGINAL)
    tamper(store, ref, FORGED)
    assert store.put_artifact(ORIGINAL) == ref  # the existing copy is checked, not trusted
    assert store.get_artifact(ref) == ORIGINAL
    small = store.put_artifact(b'"small"')  # below PostgreSQL's look-up-first size too
    tamper(store, small, b'"SMALL"')
    store.put_artifact(b'"small"')
    assert store.get_artifact(small) == b'"small"'


def test_a_replayed_step_result_is_never_the_edited_value(tmp_path: Path) -> None:
    """The journal's step result lives in an artifact; after the file is
    edited, replay fails naming the artifact instead of returning the forgery."""
    app = cairn.App(db=f"sqlite:///{tmp_path}/big.db", inline_limit=1024)
    crash = {"now": True}

    @app.step()
    def big() -> str:
        return "x" * 5000

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> str:
        value = big()
        if crash["now"]:
            raise RuntimeError("fail after the step was journaled")
        return value

    with pytest.raises(cairn.RunFailed):
        app.run(w, run_id="big")
    entry = next(e for e in app.history("big") if e.payload is not None and e.payload.ref is not None)
    assert entry.payload is not None
    assert entry.payload.ref is not None
    ref = entry.payload.ref
    (tmp_path / "big.db.artifacts" / ref[:2] / ref).write_bytes(values.encode("y" * 5000))
    crash["now"] = False
    app.operator.retry("big")
    with pytest.raises(cairn.RunFailed, match=f"artifact {ref}"):
        app.resume("big")
    run = app.operator.get_run("big")
    assert run.result is None
    app.close()


def test_the_barrier_syncs_the_artifacts_its_entries_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the ``process`` mode a plain ``put_artifact`` is not fsynced; an
    intent that references it is appended behind the barrier, which must
    put the artifact file on stable storage before the intent."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "b.db", durability=Durability.PROCESS, clock=clock)
    store.create_run(new_run("r1"))
    c = claim(store, "r1")
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    ref = store.put_artifact(ORIGINAL)
    target = str(store.artifact_dir / ref[:2] / ref)
    assert target not in synced  # the plain put: left to the page cache
    entry = dataclasses.replace(intent(clock, "r1", c.next_seq, c.run.epoch), payload=Payload(ref=ref))
    store.append("r1", c.run.epoch, [entry], barrier=True)
    assert target in synced, "the intent's offloaded arguments were not synced by its barrier"
    assert str(store.artifact_dir / ref[:2]) in synced  # and the directory entry naming the file
    assert hashlib.sha256(store.get_artifact(ref)).hexdigest() == ref
    store.close()


def test_a_write_tools_offloaded_arguments_are_synced_before_the_tool_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: a ``write`` tool whose arguments exceed the inline limit;
    when its body runs, the artifact holding those arguments is on stable
    storage (the intent that references it was appended behind the barrier)."""
    app = cairn.App(db=f"sqlite:///{tmp_path}/w.db", inline_limit=1024, durability="process")
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    seen: dict[str, bool] = {}

    @app.tool(effect="write")
    def send(op: cairn.Operation, letter: str) -> int:
        intent = next(e for e in app.history("mail") if e.event.value == "op.intent")
        assert intent.payload is not None
        assert intent.payload.ref is not None
        ref = intent.payload.ref
        seen["synced"] = str(app.store.artifact_dir / ref[:2] / ref) in synced  # type: ignore[attr-defined]
        return len(letter)

    @app.workflow(name="mailer")
    def mailer(ctx: cairn.Context) -> int:
        return send("x" * 5000)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    assert app.run(mailer, run_id="mail") == 5000
    assert seen == {"synced": True}, "the tool ran before its offloaded arguments were synced"
    app.close()
