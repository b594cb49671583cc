"""Rotation: a new data key seals new writes at once, a re-encryption pass
moves the old values to it (compare-and-set, resumable after SIGKILL), and a
KEK rotation rewraps the data keys only. Values read back after each step
are the values recorded before it."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main as cli
from cairn.security.envelope import SealError
from cairn.security.keyring import LocalKeyring, new_kek_line
from cairn.store.auditverify import verify_store
from cairn.store.coldvalues import thaw
from cairn.store.memrecords import ItemPut, Provenance
from cairn.store.records import Payload
from cairn.store.rekey import version_of
from tests.encryption.test_sealed_store import CANARY, Raw, build, drive, keyring, runs_of
from tests.engine.conftest import execute_once
from tests.processes import spawn


def snapshot(app: cairn.App, runs: dict[str, str], *, memory: bool = True) -> dict[str, Any]:
    """Every sealed value of ``runs`` (and their tenants' memory) as the store reads it back."""
    out: dict[str, Any] = {}
    for tenant in ("a", "b", "default") if memory else ():
        out[f"memory:{tenant}"] = [(i.namespace, i.key, i.value, i.index_text)
                                   for i in app.store.memory_items(tenant, "", limit=1000)]
    for name, run_id in runs.items():
        run = app.store.get_run(run_id)
        out[f"run memory:{name}"] = [(m.key, m.value) for m in app.store.run_memory(run_id)]
        out[name] = (run.input, run.result, run.error,
                     [(e.seq, e.payload, e.detail) for e in app.history(run_id)],
                     [app.store.get_artifact(e.payload.ref) for e in app.history(run_id)  # artifacts' bytes
                      if e.payload is not None and e.payload.ref is not None],
                     [(d.seq, d.payload) for d in app.store.deliveries(run_id)],
                     [(a.request_id, a.comment) for a in app.store.approvals(run_id=run_id, pending=False)])
    return out


def versions(place: str, tenant: str) -> set[int]:
    raw = Raw(place)
    rows = raw("SELECT h.payload FROM history AS h WHERE h.tenant = :t AND h.payload IS NOT NULL", t=tenant)
    rows += raw("SELECT input FROM runs WHERE tenant = :t AND input IS NOT NULL", t=tenant)
    rows += raw("SELECT payload FROM mailbox WHERE tenant = :t AND payload IS NOT NULL", t=tenant)
    rows += raw("SELECT value FROM memory_items WHERE tenant = :t AND value IS NOT NULL", t=tenant)
    rows += raw("SELECT value FROM memory_run WHERE tenant = :t AND value IS NOT NULL", t=tenant)
    rows += raw("SELECT value FROM memory_thread_messages WHERE tenant = :t AND value IS NOT NULL", t=tenant)
    colds = raw("SELECT codec, size, value FROM memory_item_cold WHERE tenant = :t", t=tenant)
    rows += [(thaw(codec, size, bytes(value), what="a cold copy"),) for codec, size, value in colds]
    comments = raw("SELECT comment FROM approvals WHERE tenant = :t AND comment IS NOT NULL", t=tenant)
    rows += [(base64.b64decode(c),) for (c,) in comments]
    return {version_of(bytes(r[0])) for r in rows} - {None}  # type: ignore[misc]


def cool(store: Any) -> None:
    """Tenant a's long-term memory items in the cold tier (their values compressed, out of the hot row)."""
    value = Payload(json.dumps(f"{CANARY}-cold " + "c" * 200).encode())
    store.write_memory("a", [ItemPut("cold\x1f", f"k{i}", value, None, None) for i in range(3)], Provenance())
    now = store.clock
    store.clock = lambda: now() + 3600.0  # an hour later: nobody read them since
    try:
        assert store.tier_items(60.0).cooled >= 3
    finally:
        store.clock = now


def test_a_pass_moves_one_tenants_values_to_its_new_key_and_reads_the_same(place: str) -> None:
    app = build(place, keyring())
    runs = runs_of(app)
    runs["cancelled"] = app.start("canary", "c", tenant="a").run_id
    app.cancel(runs["cancelled"], reason=f"{CANARY} why")  # operator text, sealed under key 1 too
    store: Any = app.store
    cool(store)
    before = snapshot(app, runs)
    assert store.rotate("a") == 2
    assert store.key_status("a").old > 0
    first = store.reencrypt("a", page=3)  # small pages: the cursor crosses many of them
    assert first.moved > 0
    assert first.raced == 0
    assert first.artifacts_moved > 0  # the large step results
    status = store.key_status("a")
    assert status.old == 0
    assert status.old_artifacts == 0
    assert status.artifacts[2] == first.artifacts_moved
    assert versions(place, "a") == {2}
    assert versions(place, "b") == {1}
    assert Raw(place)("SELECT comment FROM approvals WHERE tenant = 'a' AND comment IS NOT NULL")  # looked at
    assert Raw(place)("SELECT value FROM memory_item_cold WHERE tenant = 'a'")  # looked at, still cold
    assert snapshot(app, runs) == before
    assert store.reencrypt("a").moved == 0  # nothing left: a second pass writes nothing
    app.close()


def test_a_kek_rotation_rewraps_the_data_keys_only(place: str, tmp_path: Path) -> None:
    old = LocalKeyring.parse(new_kek_line("old"), "old key")
    app = build(place, old)
    runs = runs_of(app)
    before = snapshot(app, runs)
    sealed_before = Raw(place)("SELECT run_id, input FROM runs ORDER BY run_id")
    app.close()
    both = LocalKeyring({"old": old._kek("old"), "new": os.urandom(32)}, "new")  # the new KEK is current
    app = build(place, both)
    assert app.store.rewrap() == 2  # tenants a and b, version 1 each
    assert {r[0] for r in Raw(place)("SELECT kek_id FROM data_keys")} == {"new"}
    assert Raw(place)("SELECT run_id, input FROM runs ORDER BY run_id") == sealed_before  # no value touched
    app.close()
    only_new = LocalKeyring({"new": both._kek("new")}, "new")
    app = build(place, only_new)  # the old KEK is gone: every value still opens
    assert snapshot(app, runs) == before
    app.close()


def test_cairn_keys_status_rotate_reencrypt_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_KEYRING", "")  # --keyring sets it in this process: restored (unset) after
    keys = tmp_path / "keys"
    keys.write_text(new_kek_line("k1") + "\n")
    url = f"sqlite:///{tmp_path}/c.db"
    app = build(url, LocalKeyring.from_file(keys))
    runs_of(app)
    app.close()
    runner = CliRunner()
    spec = ["--db", url, "keys"]
    ring = ["--keyring", f"file:{keys}"]
    done = runner.invoke(cli, [*spec, "rotate", *ring, "--tenant", "a"])
    assert done.exit_code == 0, done.output
    assert "a: data key v2" in done.output, done.output
    done = runner.invoke(cli, [*spec, "status", *ring, "--tenant", "a"])
    assert "newest v2" in done.output, done.output
    assert " 0 on older keys" not in done.output, done.output
    done = runner.invoke(cli, [*spec, "reencrypt", *ring, "--tenant", "a"])
    assert done.exit_code == 0, done.output
    assert "a: moved" in done.output, done.output
    done = runner.invoke(cli, [*spec, "status", *ring])
    assert "a: newest v2" in done.output, done.output
    assert "values v2:" in done.output, done.output
    assert "; 0 on older keys; " in done.output.splitlines()[0], done.output
    assert "artifacts v2: " in done.output, done.output
    assert done.output.splitlines()[0].endswith("; 0 on older keys"), done.output
    assert runner.invoke(cli, [*spec, "verify", *ring]).exit_code == 0
    Raw(url)("UPDATE runs SET input = :v WHERE run_id = (SELECT MIN(run_id) FROM runs WHERE tenant = 'a')",
             v=b'"plain"')
    done = runner.invoke(cli, [*spec, "verify", *ring])
    assert done.exit_code == 1, done.output
    assert "not encrypted" in done.output, done.output
    done = runner.invoke(cli, ["--db", url, "keys", "new-kek", "k2"])
    assert done.output.startswith("k2 ")
    assert len(base64.b64decode(done.output.split()[1])) == 32


@pytest.mark.slow  # a cairn keys reencrypt process, SIGKILLed
def test_rotation_under_load_with_a_sigkilled_reencryption(place: str, tmp_path: Path) -> None:
    """Killed while it moves artifacts (the first thing a pass moves), some
    moved and some not; the next pass finishes them and every value."""
    keys = tmp_path / "keys"
    keys.write_text(new_kek_line("k1") + "\n")
    url = place
    app = build(url, LocalKeyring.from_file(keys))
    runs = {f"r{i}": app.start("canary", f"{CANARY}-{i}", tenant="a").run_id for i in range(12)}
    for run_id in runs.values():
        assert drive(app, run_id, "ok") == "completed"
    before = snapshot(app, runs, memory=False)  # the load below writes the same memory item again
    store: Any = app.store
    cool(store)  # cold copies on key 1 too
    store.rotate("a")
    status = store.key_status("a")
    total, artifacts = status.old, status.old_artifacts
    assert artifacts >= 12  # each run's large step result
    # the load (new runs meanwhile) comes from a thread with an app of its own, so that
    # this thread watches the pass closely and kills it as soon as a third moved: watching
    # between two runs instead, a run slower than the pass (a busy machine) let it finish
    load: list[str] = []
    failed: list[BaseException] = []
    stop, writing = threading.Event(), threading.Event()

    def keep_writing() -> None:
        writer = build(url, LocalKeyring.from_file(keys))
        try:
            while not stop.is_set():
                run_id = writer.start("canary", f"{CANARY}-load", tenant="a").run_id
                load.append(run_id)
                writing.set()
                assert drive(writer, run_id, "ok") == "completed"
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)
        finally:
            writing.set()
            writer.close()

    loader = threading.Thread(target=keep_writing)
    loader.start()
    writing.wait()  # the load is under way before the pass starts
    child = spawn("cairn", ["--db", url, "keys", "reencrypt", "--keyring", f"file:{keys}", "--tenant", "a",
                            "--page", "1", "--pause", "0.2"], log=tmp_path / "rekey.log")
    try:
        while store.key_status("a").old_artifacts > artifacts * 2 // 3:  # a third moved: kill it mid-pass
            assert child.poll() is None, (tmp_path / "rekey.log").read_text()
            time.sleep(0.02)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        stop.set()
        loader.join()
    assert not failed, failed
    assert load  # the pass ran under load
    left = store.key_status("a")
    assert 0 < left.old_artifacts < artifacts
    assert 0 < left.old <= total  # values come after the artifacts (the load rewrote a memory item)
    resumed = store.reencrypt("a", page=5)  # the next pass finishes what the killed one left
    assert resumed.artifacts_moved == left.old_artifacts
    assert resumed.moved > resumed.artifacts_moved
    status = store.key_status("a")
    assert status.old == status.old_artifacts == 0  # 0 values and artifacts left on the retired key
    assert verify_store(store).problems == []  # cairn audit verify: the chain is as it was
    assert snapshot(app, runs, memory=False) == before  # replay reads the values recorded before the rotation
    assert versions(url, "a") == {2}  # 0 values left on the retired key, memory included
    for run_id in [*runs.values(), *load]:
        assert app.store.get_run(run_id).status.value == "completed"
        assert not [e for e in app.history(run_id) if e.event.value == "step.failed"]
    app.close()


def test_a_pass_never_overwrites_a_row_changed_since_it_read_it(place: str) -> None:
    """Compare-and-set: a holder that finished a run between the pass's read
    and its write keeps its result; the pass counts the row as raced."""
    app = build(place, keyring())
    run_id = app.start("canary", f"{CANARY}-cas").run_id
    assert execute_once(app, run_id) == "suspended"
    store: Any = app.store
    store.rotate("default")
    (row,) = [r for r in store.inner.rekey_page("rekey_runs_page", {"tenant": "default", "after": "",
                                                                     "limit": 10}) if r[0] == run_id]
    Raw(place)("UPDATE runs SET result = :v WHERE run_id = :run_id", v=b"holder's result", run_id=run_id)
    stale = {"run_id": run_id, "input": b"resealed", "result": row[2], "error": row[3],
             "old_input": row[1], "old_result": row[2], "old_error": row[3]}
    assert store.inner.rekey_set("rekey_run_set", stale) is False
    assert Raw(place)("SELECT result FROM runs WHERE run_id = :r", r=run_id)[0][0] == b"holder's result"
    app.close()


def test_cairn_keys_adopt_seals_a_database_written_without_encryption(
        place: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_KEYRING", "")
    keys = tmp_path / "keys"
    keys.write_text(new_kek_line("k1") + "\n")
    plain = build(place, None, inline_limit=1 << 20)  # no artifacts: adoption does not seal those yet
    runs = runs_of(plain)
    runs["cancelled"] = plain.start("canary", "c", tenant="a").run_id
    plain.cancel(runs["cancelled"], reason=f"{CANARY} why")
    cool(plain.store)  # plaintext cold copies: adopted too
    before = snapshot(plain, runs)
    plain.close()
    with pytest.raises(cairn.errors.ConfigError, match="written without encryption"):
        build(place, LocalKeyring.from_file(keys))  # a worker given a keyring now would park every run
    done = CliRunner().invoke(cli, ["--db", place, "keys", "adopt", "--keyring", f"file:{keys}"])
    assert done.exit_code == 0, done.output
    app = build(place, LocalKeyring.from_file(keys), inline_limit=1 << 20)
    assert snapshot(app, runs) == before  # every value reads back as it was written
    for tenant in ("a", "b", "default"):
        assert versions(place, tenant) <= {1}
    raw = Raw(place)
    assert not raw("SELECT tenant FROM data_keys WHERE version = 0")  # the adoption is over: strict again
    dump = "".join(repr(raw(f"SELECT * FROM {table}")) for table in (
        "runs", "history", "mailbox", "memory_items", "memory_run", "memory_thread_messages", "approvals"))
    assert CANARY not in dump
    raw("UPDATE runs SET input = :v WHERE run_id = :r", v=b'"plain"', r=runs["a1"])
    with pytest.raises(SealError, match="not encrypted"):
        app.store.get_run(runs["a1"])
    app.close()


def test_cairn_keys_adopt_refuses_a_database_with_artifacts(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_KEYRING", "")
    keys = tmp_path / "keys"
    keys.write_text(new_kek_line("k1") + "\n")
    url = f"sqlite:///{tmp_path}/c.db"
    plain = build(url, None)  # the canary's large step result is an artifact
    runs_of(plain)
    plain.close()
    done = CliRunner().invoke(cli, ["--db", url, "keys", "adopt", "--keyring", f"file:{keys}"])
    assert done.exit_code != 0
    assert "holds artifacts" in done.output


@pytest.mark.parametrize("table", ["memory_run", "memory_thread_messages"])
def test_cairn_keys_adopt_refuses_a_database_whose_run_or_thread_memory_names_an_artifact(
        place: str, table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_KEYRING", "")
    keys = tmp_path / "keys"
    keys.write_text(new_kek_line("k1") + "\n")
    plain = build(place, None, inline_limit=1 << 20)  # no artifact but the one named below
    runs_of(plain)
    plain.close()
    Raw(place)(f"UPDATE {table} SET value_ref = :ref", ref="ab" * 32)  # as a large value would be stored
    done = CliRunner().invoke(cli, ["--db", place, "keys", "adopt", "--keyring", f"file:{keys}"])
    assert done.exit_code != 0
    assert "holds artifacts" in done.output
    assert not Raw(place)("SELECT tenant FROM data_keys")  # nothing half-done: no marker, no key


@pytest.mark.parametrize("size", [100, 4096])
def test_a_value_sealed_in_one_call_opens_only_at_its_place_and_under_the_newest_key(
        place: str, size: int) -> None:
    """``Sealer.seal_at`` (a journaled step's path, its key cached) seals what
    ``seal`` does: bound to all five parts of its place, with the tenant's
    newest key, a rotation taking effect for the next value at once."""
    from cairn.security.envelope import Place, header_of

    app = build(place, keyring())
    store: Any = app.store
    value = os.urandom(size // 2).hex().encode()  # 4 KiB: compressible, the other path
    for parts in (("a", "run-1", "history", "seq 4", "payload"), ("a", "run-2", "runs", "-", "result")):
        sealed = store.sealer.seal_at(*parts, value)
        assert store.sealer.open(Place(*parts), sealed) == value
        for i in range(len(parts)):
            elsewhere = Place(*(p + "x" if j == i else p for j, p in enumerate(parts)))
            with pytest.raises(SealError) as caught:
                store.sealer.open(elsewhere, sealed)
            assert str(elsewhere) in str(caught.value)
    assert header_of(sealed, Place(*parts)).key_version == 1
    assert store.rotate("a") == 2
    again = store.sealer.seal_at(*parts, value)
    assert header_of(again, Place(*parts)).key_version == 2
    assert store.sealer.open(Place(*parts), again) == value
    app.close()
