"""``cairn audit`` end to end on both backends: keygen, checkpoint to an
anchor file, verify (VERIFIED 0 / UNANCHORED 3 / TAMPERED 4, never a plain
pass without an anchor), a tail cut or a rollback caught only through the
anchor, log --json; bad input is a one-line error."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from cairn.cli.main import main as cli
from cairn.security.keyring import LocalKeyring
from tests.audit.test_chain import made
from tests.encryption.test_sealed_store import Raw, build, drive, runs_of


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_checkpoint_then_verify_and_what_only_the_anchor_catches(place: str, tmp_path: Path) -> None:
    app, runs = made(place, False)
    key, anchor = tmp_path / "audit.key", tmp_path / "anchor.jsonl"
    assert run("audit", "keygen", str(key))[0] == 0
    code, out = run("audit", "verify", "--db", place)
    assert code == 3
    assert out.startswith("UNANCHORED"), out  # no anchor: never a plain pass
    code, out = run("audit", "checkpoint", "--db", place, "--key", str(key), "--anchor", str(anchor))
    assert code == 0, out
    assert "checkpoint 1 of tenant a" in out, out
    code, out = run("audit", "verify", "--db", place, "--anchor", str(anchor), "--key", f"{key}.pub")
    assert code == 0, out
    assert out.startswith("VERIFIED"), out

    later = app.start("canary", "later", tenant="a").run_id  # newer than the checkpoint
    code, out = run("audit", "verify", "--db", place, "--anchor", str(anchor))
    assert code == 3, out
    assert "newer entries" in out, out
    drive(app, later, "ok")

    raw = Raw(place)
    last = raw("SELECT max(seq) FROM history WHERE run_id = :r", r=runs["b1"])[0][0]
    raw("DELETE FROM history WHERE run_id = :r AND seq = :s", r=runs["b1"], s=last)  # the tail, cut
    code, out = run("audit", "verify", "--db", place, "--anchor", str(anchor))
    assert code == 4, out
    assert out.startswith(f"TAMPERED: run {runs['b1']!r} entry {last}: the anchor of"), out
    assert "tail was cut" in out
    code, out = run("audit", "checkpoint", "--db", place, "--key", str(key), "--anchor", str(anchor))
    assert code != 0
    assert "not checkpointed: TAMPERED" in out  # a cut database is never re-anchored
    code, out = run("audit", "verify", "--db", place, "--run", runs["a1"], "--anchor", str(anchor))
    assert code == 0, out  # one run alone
    app.close()


def test_log_lists_who_did_what_as_json(place: str) -> None:
    app, runs = made(place, False)
    code, out = run("audit", "log", "--db", place, "--run", runs["cancelled"], "--json")
    assert code == 0
    items = [json.loads(line) for line in out.splitlines()]
    cancelled = [i for i in items if i["event"] == "run.cancelled"]
    assert cancelled
    assert cancelled[0]["actor"].startswith("app:")
    assert cancelled[0]["auth"] == "in-process"
    code, out = run("audit", "log", "--db", place, "--actor", "worker:", "--run", runs["a1"])
    assert code == 0
    assert "lease epoch" in out
    assert "step.completed" in out
    app.close()


def test_bad_anchor_and_key_files_are_one_line_errors(place: str, tmp_path: Path) -> None:
    app, _ = made(place, False)
    junk = tmp_path / "junk"
    junk.write_text("not json\n")
    code, out = run("audit", "verify", "--db", place, "--anchor", str(junk))
    assert code == 1, out
    assert len(out.strip().splitlines()) == 1, out
    assert "line 1 is not JSON" in out, out
    code, out = run("audit", "checkpoint", "--db", place, "--key", str(junk))
    assert code == 1, out
    assert "not an unencrypted PEM private key" in out, out
    assert "Traceback" not in out, out
    key = tmp_path / "k"
    run("audit", "keygen", str(key))
    code, out = run("audit", "keygen", str(key))
    assert code == 1
    assert "already exists" in out
    anchor = tmp_path / "a.jsonl"
    assert run("audit", "checkpoint", "--db", place, "--key", str(key), "--anchor", str(anchor))[0] == 0
    record = json.loads(anchor.read_text().splitlines()[0])
    record["heads"][next(iter(record["heads"]))][0] += 1  # an edited anchor
    anchor.write_text(json.dumps(record) + "\n")
    code, out = run("audit", "verify", "--db", place, "--anchor", str(anchor))
    assert code == 1, out
    assert "signature does not match" in out, out
    app.close()


def test_verify_reports_erased_entries_apart_from_tampered_ones(place: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's keys destroyed: ``cairn audit verify`` (a new process's view,
    keyring from ``$CAIRN_KEYRING``) names its entries ERASED, the chains hold;
    an actor forged on an erased entry is still TAMPERED."""
    ring = LocalKeyring({"kek1": os.urandom(32)}, "kek1")
    app = build(place, ring)
    runs = runs_of(app)
    app.close()
    monkeypatch.setenv("CAIRN_KEYRING", "env:AUDIT_TEST_KEYS")
    monkeypatch.setenv("AUDIT_TEST_KEYS", "kek1 " + base64.b64encode(ring._kek("kek1")).decode())
    raw = Raw(place)
    raw("DELETE FROM data_keys WHERE tenant = 'b'")
    code, out = run("audit", "verify", "--db", place, "--json")
    assert code == 3, out  # chains hold (no anchor given: UNANCHORED, never TAMPERED)
    report = json.loads(out)
    assert report["verdict"] == "UNANCHORED"
    assert report["erased"] > 5
    assert "ERASED" in report["summary"]
    seq = raw("SELECT min(seq) FROM history WHERE run_id = :r AND payload IS NOT NULL", r=runs["b1"])[0][0]
    raw("UPDATE history SET worker = 'someone-else' WHERE run_id = :r AND seq = :s", r=runs["b1"], s=seq)
    code, out = run("audit", "verify", "--db", place)
    assert code == 4, out
    assert out.startswith(f"TAMPERED: run {runs['b1']!r} entry {seq}"), out
