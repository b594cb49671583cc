"""Workspace objects under encryption at rest, on SQLite and PostgreSQL.

With a keyring, a workspace object is stored sealed (bound to its tenant
and its address) under an address keyed per tenant: a canary file's
content and name appear nowhere in the database (raw, base64, hex, or
inside any zstd frame), restore and diff read the objects back, the same
content stored by two tenants has unrelated addresses (nothing learnt
across tenants) while one tenant stores it once, and a row whose bytes are
swapped with another's is refused, naming the object.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from cairn import EventType, RunStatus
from cairn.engine.workspace import DETAIL_KEY
from cairn.errors import CairnError
from cairn.security.keyring import LocalKeyring
from cairn.workspace import TreeCache, snapshot
from tests.engine.conftest import postgres_url
from tests.security.test_canary import occurrences
from tests.store.contract.helpers import claim, new_run
from tests.workspace.wsapps import root_of

zstandard = pytest.importorskip("zstandard")

CANARY_ENV = "CAIRN_TEST_WS_CANARY"


@pytest.fixture(params=("sqlite", "postgres"))
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return postgres_url(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path}/cairn.db"


def build(db: str, workspaces: Path, ring: LocalKeyring | None) -> cairn.App:
    app = cairn.App(db=db, lease_seconds=5.0, workspaces=workspaces, keyring=ring)

    @app.step
    def write(content: str, name: str) -> None:
        ws = cairn.step_info().workspace
        (ws / "notes").mkdir(exist_ok=True)
        (ws / "notes" / name).write_text(content)
        (ws / "big.txt").write_text((content + "\n") * 4000)  # compressible: stored as a zstd frame

    @app.step
    def more() -> None:
        (cairn.step_info().workspace / "later.txt").write_text("later")

    @app.workflow(name="ws-canary")
    def canary(ctx: cairn.Context, content: str, name: str) -> None:
        write(content, name)
        more()

    return app


@pytest.fixture
def ring() -> LocalKeyring:
    return LocalKeyring({"kek1": os.urandom(32)}, "kek1")


@pytest.fixture
def sealed(db: str, tmp_path: Path, ring: LocalKeyring) -> Iterator[cairn.App]:
    app = build(db, tmp_path / "ws", ring)
    yield app
    app.close()


def run(app: cairn.App, run_id: str, content: str, name: str, tenant: str = "default") -> list[str]:
    """Run ``ws-canary`` to its end; the recorded roots, oldest first."""
    app.start("ws-canary", content, name, run_id=run_id, tenant=tenant)
    app.worker(concurrency=1).run(max_idle=0.5)
    assert app.get_run(run_id).status is RunStatus.COMPLETED
    return [e.detail[DETAIL_KEY] for e in app.history(run_id)
            if e.event is EventType.STEP_COMPLETED and e.detail and DETAIL_KEY in e.detail]


def _with_frames(data: bytes) -> bytes:
    """``data`` and the plain bytes of every zstd frame found in it."""
    found = [data]
    start = data.find(b"\x28\xb5\x2f\xfd")
    while start >= 0:
        try:
            with zstandard.ZstdDecompressor().stream_reader(data[start:]) as reader:
                found.append(reader.read(64 << 20))
        except zstandard.ZstdError:
            pass
        start = data.find(b"\x28\xb5\x2f\xfd", start + 1)
    return b"\n".join(found)


def stored_bytes(db: str) -> bytes:
    """Everything the database holds: the SQLite files (database, WAL,
    shared memory), or every row of every PostgreSQL table as text plus
    the raw bytes of every workspace object; with zstd frames inflated."""
    if db.startswith("sqlite:///"):
        path = Path(db.removeprefix("sqlite:///"))
        files = [p for p in path.parent.iterdir() if p.name.startswith(path.name)]
        assert any(p.name.endswith("-wal") for p in files) or path.exists()
        return _with_frames(b"\n".join(p.read_bytes() for p in files))
    import psycopg
    from psycopg import sql

    chunks: list[bytes] = []
    with psycopg.connect(db, autocommit=True) as conn:
        ((schema,),) = conn.execute("SELECT table_schema FROM information_schema.tables "
                                    "WHERE table_name = 'workspace_objects'").fetchall()
        tables = [t for (t,) in conn.execute("SELECT table_name FROM information_schema.tables WHERE "
                                             "table_schema = %s AND table_type = 'BASE TABLE'", (schema,))]
        for table in tables:
            query = sql.SQL("SELECT t::text FROM {}.{} AS t").format(sql.Identifier(schema),
                                                                     sql.Identifier(table))
            chunks.extend(str(row[0]).encode() for row in conn.execute(query))
        chunks.extend(bytes(d) for (d,) in conn.execute(
            sql.SQL("SELECT data FROM {}.workspace_objects").format(sql.Identifier(schema))))
    return _with_frames(b"\n".join(chunks))


def object_rows(db: str) -> list[tuple[str, str, bytes]]:
    """``(tenant, address, data)`` of every stored workspace object."""
    if db.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
            rows = conn.execute("SELECT tenant, oid, data FROM workspace_objects")
            return [(t, o, bytes(d)) for t, o, d in rows]
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        ((schema,),) = conn.execute("SELECT table_schema FROM information_schema.tables "
                                    "WHERE table_name = 'workspace_objects'").fetchall()
        return [(t, o, bytes(d)) for t, o, d in conn.execute(
            f'SELECT tenant, oid, data FROM "{schema}".workspace_objects')]


def set_row(db: str, address: str, data: bytes) -> None:
    if db.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
            changed = conn.execute("UPDATE workspace_objects SET data = ? WHERE oid = ?", (data, address))
            assert changed.rowcount
        return
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        ((schema,),) = conn.execute("SELECT table_schema FROM information_schema.tables "
                                    "WHERE table_name = 'workspace_objects'").fetchall()
        assert conn.execute(f'UPDATE "{schema}".workspace_objects SET data = %s WHERE oid = %s',
                            (data, address)).rowcount


def canaries() -> dict[str, str]:
    return {"content": f"cairn-canary-{secrets.token_hex(12)}", "name": f"canary-name-{secrets.token_hex(8)}"}


def test_without_a_keyring_the_scan_finds_the_canary(db: str, tmp_path: Path) -> None:
    """The control: the scan below sees a plaintext workspace's canary, so
    its zero under encryption means something."""
    app = build(db, tmp_path / "ws", None)
    secret = canaries()
    run(app, "plain", secret["content"], secret["name"])
    app.close()
    found = occurrences(stored_bytes(db), secret)
    assert found.get("content")
    assert found.get("name")
    # in the workspace rows themselves, not only in the run's input: what sealing must hide
    in_objects = occurrences(_with_frames(b"\n".join(d for _, _, d in object_rows(db))), secret)
    assert in_objects.get("content")
    assert in_objects.get("name")


def test_a_sealed_workspace_holds_no_canary_and_reads_back(sealed: cairn.App, db: str,
                                                            tmp_path: Path) -> None:
    secret = canaries()
    roots = run(sealed, "r1", secret["content"], secret["name"])
    assert len(roots) == 2
    views = sealed.operator.workspaces
    shot, _ = views.restore("r1", None, tmp_path / "out")
    assert root_of(tmp_path / "out") == roots[-1] == shot.root
    assert (tmp_path / "out" / "notes" / secret["name"]).read_text() == secret["content"]
    _, _, changes = views.diff("r1")
    assert [c.path for c in changes] == ["later.txt"]
    rows = object_rows(db)
    assert rows
    assert all(d[:1] == b"\xce" for _, _, d in rows)  # every object an envelope
    sealed.close()
    assert occurrences(stored_bytes(db), secret) == {}


def test_addresses_are_keyed_per_tenant_and_dedup_stays_within_one(sealed: cairn.App, db: str) -> None:
    run(sealed, "a1", "same content", "same.txt", tenant="acme")
    acme = {o for t, o, _ in object_rows(db) if t == "acme"}
    run(sealed, "a2", "same content", "same.txt", tenant="acme")
    assert {o for t, o, _ in object_rows(db) if t == "acme"} == acme  # one tenant stores it once
    run(sealed, "g1", "same content", "same.txt", tenant="globex")
    globex = {o for t, o, _ in object_rows(db) if t == "globex"}
    assert len(globex) == len(acme)
    assert not globex & acme  # nothing in common across tenants


def test_a_swapped_object_row_is_refused_naming_the_object(sealed: cairn.App, db: str,
                                                           tmp_path: Path) -> None:
    run(sealed, "s1", "swap me", "swap.txt")
    rows = sorted(object_rows(db), key=lambda r: r[1])
    (_, first, first_data), (_, second, second_data) = rows[0], rows[1]
    set_row(db, first, second_data)
    set_row(db, second, first_data)
    views = sealed.operator.workspaces
    with pytest.raises(CairnError) as refused:
        views.restore("s1", None, tmp_path / "out")
    message = str(refused.value)
    assert "refused" in message
    assert re.search(r"workspace object [0-9a-f]{64}", message), message


def _garbage(app: cairn.App, db: str, tmp_path: Path, run_id: str) -> set[str]:
    """Objects stored by a held run's snapshot that it never records: what
    a collection must delete. Their row keys (addresses)."""
    store = app.store
    store.create_run(new_run(run_id))
    held = claim(store, run_id)
    ws = tmp_path / f"garbage-{run_id}"
    ws.mkdir()
    (ws / "junk.txt").write_text("never recorded " * 100)
    shot = snapshot(ws, TreeCache(), lambda batch: store.put_workspace_objects(run_id, held.run.epoch, batch))
    assert shot.stored == 2  # the file and the root
    return store.workspace_keys("default", shot.sent) & {o for _, o, _ in object_rows(db)}


def test_the_collector_opens_sealed_roots_and_deletes_only_garbage(sealed: cairn.App, db: str,
                                                                    tmp_path: Path) -> None:
    """Journal details are sealed, so the roots are read by opening them; the
    rows are at keyed addresses, so the marked ids are compared as addresses.
    Only the never-recorded snapshot's objects go, and every recorded
    snapshot still restores."""
    roots = run(sealed, "c1", "keep", "keep.txt")
    garbage = _garbage(sealed, db, tmp_path, "g1")
    assert len(garbage) == 2
    before = {o for _, o, _ in object_rows(db)}
    time.sleep(0.05)  # grace 0: everything stored before now is a candidate
    done = sealed.operator.workspaces.collect("default", grace_seconds=0)[0]
    assert done.roots == len(set(roots)), done
    assert done.deleted == 2, done
    assert {o for _, o, _ in object_rows(db)} == before - garbage
    views = sealed.operator.workspaces
    restored = set()
    for shot in views.snapshots("c1"):
        views.restore("c1", shot.position, tmp_path / f"out-{shot.position}")
        restored.add(root_of(tmp_path / f"out-{shot.position}"))
    assert restored == set(roots)
    assert sealed.operator.workspaces.collect("default", grace_seconds=0)[0].deleted == 0


def test_a_damaged_sealed_detail_stops_the_collection_with_nothing_deleted(sealed: cairn.App, db: str,
                                                                          tmp_path: Path) -> None:
    """A hostile or damaged journal detail that does not open could hide a
    root (and so get live objects deleted): the collection stops, naming
    it, and deletes nothing, garbage included."""
    run(sealed, "d1", "keep", "keep.txt")
    _garbage(sealed, db, tmp_path, "g2")
    damage_a_sealed_detail(db, "d1")
    before = {o for _, o, _ in object_rows(db)}
    time.sleep(0.05)
    with pytest.raises(CairnError, match="d1"):
        sealed.operator.workspaces.collect("default", grace_seconds=0)
    assert {o for _, o, _ in object_rows(db)} == before


def damage_a_sealed_detail(db: str, run_id: str) -> None:
    """Flip one byte of the ciphertext of the first sealed detail that records a snapshot of ``run_id``."""
    def damaged(detail: str) -> str:
        value = json.loads(detail)
        raw = bytearray(base64.b64decode(value["sealed"]))
        raw[-5] ^= 1
        value["sealed"] = base64.b64encode(bytes(raw)).decode()
        return json.dumps(value)

    if db.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
            ((seq, detail),) = conn.execute(
                "SELECT seq, detail FROM history WHERE run_id = ? AND event = 'step.completed' "
                "AND detail LIKE '%sealed%' ORDER BY seq LIMIT 1", (run_id,)).fetchall()
            conn.execute("UPDATE history SET detail = ? WHERE run_id = ? AND seq = ?",
                         (damaged(detail), run_id, seq))
        return
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        ((schema,),) = conn.execute("SELECT table_schema FROM information_schema.tables "
                                    "WHERE table_name = 'workspace_objects'").fetchall()
        ((seq, detail),) = conn.execute(
            f'SELECT seq, detail::text FROM "{schema}".history WHERE run_id = %s '
            "AND event = 'step.completed' AND detail::text LIKE '%%sealed%%' ORDER BY seq LIMIT 1",
            (run_id,)).fetchall()
        conn.execute(f'UPDATE "{schema}".history SET detail = %s WHERE run_id = %s AND seq = %s',
                     (damaged(detail), run_id, seq))


def test_a_key_rotation_keeps_addresses_and_old_objects_readable(sealed: cairn.App, db: str,
                                                                  tmp_path: Path) -> None:
    """Addresses derive from the tenant's first data key, which rotation
    never removes: the same content keeps its address (stored once) and
    what the old key sealed still opens."""
    run(sealed, "k1", "before rotation", "k.txt")
    before = {o for _, o, _ in object_rows(db)}
    assert sealed.store.rotate("default") == 2
    roots = run(sealed, "k2", "before rotation", "k.txt")
    assert {o for _, o, _ in object_rows(db)} == before  # nothing new: dedup across the rotation
    sealed.operator.workspaces.restore("k1", None, tmp_path / "old")
    assert root_of(tmp_path / "old") == roots[-1]


def test_an_object_copied_to_another_kinds_address_is_refused_by_the_seal(sealed: cairn.App, db: str,
                                                                          tmp_path: Path) -> None:
    """A blob's sealed row copied over the root tree's row (an attacker
    with write access to the table, no key) is refused when the row is
    opened, before the workspace layer sees its bytes: the object's kind is
    bound into the seal through its address (the address is a keyed hash
    of the id, and the id hashes the kind byte with the bytes), so a row
    sealed for a blob never opens where a tree belongs."""
    from cairn.workspace.objects import BLOB, TREE, unpack

    roots = run(sealed, "x1", "kind swap", "kind.txt")
    store = sealed.store
    rows = {address: data for tenant, address, data in object_rows(db) if tenant == "default"}
    root = roots[-1]
    ((root_address,),) = [store.workspace_keys("default", [root]) & rows.keys()]
    opened = store.workspace_objects("default", [root])
    assert unpack(root, opened[root])[0] == TREE
    blob = cairn.workspace.objects.object_id(BLOB, b"later")  # the second step's file: a blob object
    ((blob_address,),) = [store.workspace_keys("default", [blob]) & rows.keys()]
    assert unpack(blob, store.workspace_objects("default", [blob])[blob])[0] == BLOB
    set_row(db, root_address, rows[blob_address])
    with pytest.raises(CairnError) as refused:
        sealed.operator.workspaces.restore("x1", None, tmp_path / "out")
    message = str(refused.value)
    assert f"workspace object {root}" in message, message
    assert "does not open at its address" in message, message  # the seal refused it, not a later check
    assert not (tmp_path / "out" / "later.txt").exists()
