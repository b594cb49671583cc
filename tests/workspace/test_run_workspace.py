"""A run's workspace through the engine, on SQLite and PostgreSQL.

What a step body leaves in ``step_info().workspace`` is snapshotted and its
root recorded in the step's journal entry; the next body, on this worker or
another, starts from exactly that tree; a failed attempt's writes are gone
before the next attempt; a worker that lost the run stores nothing and
records nothing. (The SIGKILL test is tests/workspace/test_kill.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from cairn import EventType, RunStatus
from cairn.engine.workspace import DETAIL_KEY, EMPTY_ROOT
from cairn.errors import LeaseLost
from cairn.workspace import Objects, TreeCache, restore, walk
from cairn.workspace.objects import BLOB, object_id, pack
from tests.engine.conftest import postgres_url
from tests.workspace.wsapps import build, root_of

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return postgres_url(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path}/cairn.db"


@pytest.fixture
def apps(db: str, tmp_path: Path) -> Iterator[tuple[cairn.App, cairn.App]]:
    """Two workers' apps on one store, each with its own workspaces directory."""
    a, b = build(db, tmp_path / "worker-a"), build(db, tmp_path / "worker-b")
    yield a, b
    a.close()
    b.close()


def roots(app: cairn.App, run_id: str) -> dict[str, str]:
    """The recorded snapshot root of each completed call, by name (the
    second call of a name as ``name#2``)."""
    found: dict[str, str] = {}
    for e in app.history(run_id):
        if e.event is EventType.STEP_COMPLETED and e.detail and DETAIL_KEY in e.detail:
            name = e.name or ""
            found[name if name not in found else f"{name}#2"] = e.detail[DETAIL_KEY]
    return found


def test_a_workspace_moves_between_workers_exactly(apps: tuple[cairn.App, cairn.App], tmp_path: Path) -> None:
    a, b = apps
    handle = a.start("ws-handoff", run_id="r1")
    a.worker(concurrency=1).run(max_idle=0.5)
    assert a.get_run("r1").status is RunStatus.SUSPENDED
    recorded = roots(a, "r1")
    assert recorded["fill"] != EMPTY_ROOT
    dir_a = a.runtime.workspaces.path_for("default", "r1")
    assert root_of(dir_a) == recorded["fill"]

    b.signal("r1", "go")
    b.worker(concurrency=1).run(max_idle=0.5)
    result = handle.result(timeout=10)
    recorded = roots(b, "r1")
    assert result["fill"] == EMPTY_ROOT  # the first body found an empty directory
    assert result["flaky"] == recorded["fill"]  # worker b restored a's snapshot before the body, exactly
    assert result["look"] == recorded["flaky"] != recorded["fill"]  # no trace of the failed attempt
    assert result["tool"] == recorded["look"]
    assert result["after"] == recorded["tool_writes"]
    # the run ended: the workers' directories and caches are gone, every snapshot is in the store
    assert not b.runtime.workspaces.path_for("default", "r1").exists()
    assert not b.runtime.workspaces._caches
    final = tmp_path / "final"
    source = _Source(b, "default")
    restore(final, recorded["tool_writes"], source, TreeCache())
    assert root_of(final) == recorded["tool_writes"]
    assert not (final / "half-written.txt").exists()
    assert (final / "by-tool.txt").read_text()  # the tool's operation id
    assert (final / "passwd").readlink() == Path("/etc/passwd")

    # time travel: any recorded snapshot restores exactly, anywhere
    elsewhere = tmp_path / "checkout"
    restore(elsewhere, recorded["fill"], source, TreeCache())
    assert root_of(elsewhere) == recorded["fill"]
    assert "second.txt" in dict(walk(Objects(source, recorded["flaky"]), recorded["flaky"]))


class _Source:
    def __init__(self, app: cairn.App, tenant: str) -> None:
        self.store, self.tenant = app.store, tenant

    def fetch(self, oids: list[str]) -> dict[str, bytes]:  # type: ignore[override]
        return self.store.workspace_objects(self.tenant, oids)


def test_a_warm_worker_with_a_tampered_directory_restores_it(apps: tuple[cairn.App, cairn.App]) -> None:
    """A directory changed between two claims on the same worker (by anything
    but a body) is verified by root id and restored."""
    a, _ = apps
    handle = a.start("ws-handoff", run_id="r2")
    a.worker(concurrency=1).run(max_idle=0.5)
    ws = a.runtime.workspaces.path_for("default", "r2")
    (ws / "src" / "main.py").write_text("tampered")
    (ws / "intruder.txt").write_text("x")
    a.signal("r2", "go")
    a.worker(concurrency=1).run(max_idle=0.5)
    result = handle.result(timeout=10)
    assert result["flaky"] == roots(a, "r2")["fill"]


def test_a_failed_steps_writes_are_gone_before_the_next_body(apps: tuple[cairn.App, cairn.App]) -> None:
    """In the same execution: the workflow catches the failure and goes on."""
    a, _ = apps
    result = a.run("ws-catch", run_id="r5")
    assert result["fill"] == EMPTY_ROOT
    assert result["after"] == roots(a, "r5")["fill"]  # the garbage the failed step left is gone


def test_objects_are_per_tenant(apps: tuple[cairn.App, cairn.App]) -> None:
    a, _ = apps
    a.start("ws-handoff", run_id="t1", tenant="acme")
    a.worker(concurrency=1).run(max_idle=0.5)
    blob = object_id(BLOB, b"print('hi')\n")
    assert set(a.store.workspace_objects("acme", [blob])) == {blob}
    assert a.store.workspace_objects("default", [blob]) == {}  # another tenant cannot even tell it exists


def test_a_worker_that_lost_the_run_stores_and_records_nothing(apps: tuple[cairn.App, cairn.App]) -> None:
    """The run is cancelled (its epoch bumped) while a body writes: the
    snapshot's objects are refused with the fenced write, and no entry names it."""
    a, _ = apps

    @a.step
    def write_then_lose() -> None:
        ws = cairn.step_info().workspace
        (ws / "late.txt").write_text("written by a worker that lost the run")
        a.cancel(cairn.step_info().run_id, "taken away mid-step")

    @a.workflow(name="ws-lose")
    def lose(ctx: cairn.Context) -> None:
        write_then_lose()

    a.start("ws-lose", run_id="r3")
    a.worker(concurrency=1).run(max_idle=0.5)
    assert a.get_run("r3").status is RunStatus.CANCELLED
    assert roots(a, "r3") == {}
    late = object_id(BLOB, b"written by a worker that lost the run")
    assert a.store.workspace_objects("default", [late]) == {}


def test_put_workspace_objects_is_fenced(apps: tuple[cairn.App, cairn.App]) -> None:
    a, _ = apps
    a.start("ws-handoff", run_id="r4")
    a.worker(concurrency=1).run(max_idle=0.5)
    run = a.get_run("r4")
    oid = object_id(BLOB, b"stale")
    with pytest.raises(LeaseLost):
        a.store.put_workspace_objects("r4", run.epoch, {oid: b"nbstale"})  # suspended: nobody holds it
    assert a.store.workspace_objects("default", [oid]) == {}
    with pytest.raises(cairn.InvalidArgument):
        a.store.workspace_objects("default", ["../../etc/passwd"])


def _corrupt(db: str, oid: str, data: bytes) -> None:
    """Overwrite a stored object's bytes behind the store's back (a damaged or forged row)."""
    if db.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
            assert conn.execute("UPDATE workspace_objects SET data = ? WHERE oid = ?", (data, oid)).rowcount
        return
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        ((schema,),) = conn.execute("SELECT table_schema FROM information_schema.tables "
                                    "WHERE table_name = 'workspace_objects'").fetchall()
        changed = conn.execute(f'UPDATE "{schema}".workspace_objects SET data = %s WHERE oid = %s',
                               (data, oid)).rowcount
        assert changed


def test_a_damaged_object_fails_the_step_and_its_body_never_runs(apps: tuple[cairn.App, cairn.App],
                                                                  db: str) -> None:
    """A row whose bytes no longer hash to its id (here: another file's
    content under the id of src/main.py) is refused on the worker that
    restores it: the body never runs on a wrong tree."""
    a, b = apps
    handle = a.start("ws-handoff", run_id="r6")
    a.worker(concurrency=1).run(max_idle=0.5)
    blob = object_id(BLOB, b"print('hi')\n")
    forged = b"evil(); rm \n"  # as long as the real content: only the hash can tell
    assert len(forged) == len(b"print('hi')\n")
    _corrupt(db, blob, pack(BLOB, forged))
    b.signal("r6", "go")
    b.worker(concurrency=1).run(max_idle=1.0)
    with pytest.raises(cairn.RunFailed, match="damaged"):
        handle.result(timeout=10)
    attempts = [e for e in b.history("r6") if e.name == "flaky"
                and e.event in (EventType.STEP_RETRIED, EventType.STEP_FAILED)]
    assert len(attempts) == 3
    # each attempt failed at the restore, before its body (whose first attempt raises "flaky")
    assert all(e.detail and e.detail["error"]["type"] == "UnsafeSnapshot" for e in attempts)
