"""``cairn tokens`` (mint, list, revoke: the secret printed once, only its
digest stored) and ``cairn watch`` (a run's timeline and progress line,
following it to its end); ``cairn serve`` refuses a database that does not
exist in one line."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main
from tests.timing import SLACK

from .workflows import register


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def test_tokens_mint_list_revoke(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cairn.db"
    cairn.App(db=db).close()
    code, out, err = cli("tokens", "mint", "deploy-bot", "--tenant", "acme", "--role", "operator", "--json",
                         "--db", db)
    assert code == 0, err
    minted = json.loads(out)
    secret = minted["token"]
    assert secret.startswith("cairn_" + minted["token_id"] + "_")
    with cairn.App(db=db) as app:
        principal = app.tokens.check(secret)
        assert (principal.tenant, principal.role.value, principal.name) == ("acme", "operator", "deploy-bot")
        (stored,) = app.tokens.list()
        assert stored.digest != secret
        assert secret.split("_", 2)[2] not in stored.digest
    assert secret.split("_", 2)[2].encode() not in (tmp_path / "cairn.db").read_bytes()
    code, out, _ = cli("tokens", "--db", db)
    assert code == 0
    assert minted["token_id"] in out
    assert "live" in out
    assert secret not in out
    code, out, _ = cli("tokens", "revoke", minted["token_id"], "--db", db)
    assert code == 0
    assert "revoked" in out
    code, _, err = cli("tokens", "revoke", "ffffffffffffffff", "--db", db)
    assert code == 1
    assert err.strip() == "error: no token with id 'ffffffffffffffff'"
    with cairn.App(db=db) as app, pytest.raises(cairn.CairnError, match="invalid or revoked"):
        app.tokens.check(secret)
    code, _, err = cli("tokens", "mint", "x", "--tenant", "acme", "--role", "god", "--db", db)
    assert code == 2
    assert "god" in err


def test_watch_follows_a_run_to_its_end(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cairn.db"
    app = cairn.App(db=db)
    wf = register(app)
    handle = app.start(wf["ticker"], 6, tenant="acme")
    threading.Thread(target=lambda: (time.sleep(0.5), app.resume(handle.run_id)), daemon=True).start()
    code, out, err = cli("watch", handle.run_id, "--db", db)
    app.close()
    assert code == 0, err
    assert out.count("step.completed") == 6
    assert "run.completed" in out
    last = out.strip().splitlines()[-1]
    assert "completed" in last
    assert "6 steps done" in last


def test_serve_and_watch_refuse_a_missing_database(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path}/nope.db"
    code, _, err = cli("serve", "--db", missing)
    assert code == 1
    assert err.startswith("error: no database at")
    assert len(err.strip().splitlines()) == 1
    code, _, err = cli("watch", "some-run", "--db", missing)
    assert code == 1
    assert err.startswith("error: no database at")


@pytest.mark.slow
def test_cairn_serve_serves_the_api(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    import httpx

    from .conftest import free_port

    db = f"sqlite:///{tmp_path}/cairn.db"
    with cairn.App(db=db) as app:
        secret = app.tokens.mint("acme", "viewer", "probe").secret
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cairn", "serve", "--db", db, "--port", str(port),
                             "--log-level", "warning"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        deadline = time.monotonic() + 20 * SLACK
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/api/whoami",
                                   headers={"Authorization": f"Bearer {secret}"}, timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "cairn serve did not start"
                assert proc.poll() is None, "cairn serve exited"
                time.sleep(0.1)
        assert answer.status_code == 200
        assert answer.json()["actor"].startswith("http:probe#")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "cairn serve: database" in err


def test_cairn_approve_decides_as_the_os_user_not_as_dollar_user(tmp_path: Path) -> None:
    """``USER=ada cairn approve`` decided as ada, passing ``approvers=["ada"]``:
    the decider is the user of the process's uid, whatever the environment says."""
    import os
    import pwd
    import socket

    from .workflows import drain

    me = pwd.getpwuid(os.getuid()).pw_name
    assert me != "ada"
    db = f"sqlite:///{tmp_path}/cairn.db"
    with cairn.App(db=db) as app:
        wf = register(app)
        guarded = app.start(wf["payout"], "x", 1, ["ada"]).run_id
        mine = app.start(wf["payout"], "y", 2, [me]).run_id
        drain(app)
        requests = {a.run_id: a.request_id for a in app.approvals()}
    forged = {"COLUMNS": "200", "USER": "ada", "LOGNAME": "ada", "LNAME": "ada", "USERNAME": "ada"}
    result = CliRunner().invoke(main, ["approve", guarded, requests[guarded], "--db", db], env=forged)
    assert result.exit_code != 0
    assert "may not decide" in result.stderr
    result = CliRunner().invoke(main, ["approve", mine, requests[mine], "--db", db], env=forged)
    assert result.exit_code == 0, result.stderr
    with cairn.App(db=db) as app:
        assert app.operator.approval(guarded, requests[guarded]).status.value == "pending"
        decided = app.operator.approval(mine, requests[mine])
    assert decided.decided_by == f"cli:{me}@{socket.gethostname()}"


def test_the_installation_role_is_minted_at_the_command(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cairn.db"
    cairn.App(db=db).close()
    code, out, err = cli("tokens", "mint", "ops", "--tenant", "acme", "--role", "installation", "--json",
                         "--db", db)
    assert code == 0, err
    with cairn.App(db=db) as app:
        assert app.tokens.check(json.loads(out)["token"]).role.value == "installation"
    code, out, err = cli("tokens", "mint", "ops", "--tenant", "acme", "--role", "root", "--db", db)
    assert code != 0
    assert "installation" in err
