"""Issue 26 part 1: the actor of every operator path (Python, CLI; HTTP in
tests/server/test_actions.py) and each run's permissions context, recorded
in the entries themselves (so the audit chain covers them) and shown to an
operator. Both backends for the Python paths."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import cairn
from cairn.api.audit import Verdict
from cairn.cli.main import main
from cairn.errors import InvalidArgument
from tests.cli.test_cli import check_error, cli


def created_detail(app: cairn.App, run_id: str) -> dict[str, object]:
    first = app.history(run_id)[0]
    assert first.event.value == "run.created"
    return dict(first.detail or {})


def test_python_start_records_the_app_as_starter(app: cairn.App) -> None:
    app.start("steps", 1, run_id="r", tenant="acme")
    assert created_detail(app, "r")["started_by"] == {"actor": f"app:{os.getpid()}", "auth": "in-process",
                                                      "tenant": "acme"}
    app.run("steps", 1, run_id="inline")
    assert created_detail(app, "inline")["started_by"]["actor"] == f"app:{os.getpid()}"  # type: ignore[index]


def test_a_program_passes_the_user_it_acts_for_with_role_and_scopes(app: cairn.App) -> None:
    app.start("steps", 1, run_id="r", tenant="acme",
              started_by={"actor": "user:ada", "role": "support", "scopes": ["refunds:write"],
                          "tenant": "evil"})
    started = created_detail(app, "r")["started_by"]
    assert started == {"actor": "user:ada", "auth": "in-process, vouched for by the program",
                       "tenant": "acme", "role": "support", "scopes": ["refunds:write"]}  # the run's tenant
    shown = cairn.api.views.run_detail(app.operator, app.store.get_run("r"), journal=False)  # type: ignore[arg-type]
    assert shown["started_by"]["scopes"] == ["refunds:write"]


@pytest.mark.parametrize("bad", [{"role": "x"}, {"actor": ""}, {"actor": "a\nforged line"},
                                 {"actor": "a", "scopes": "refunds"}, {"actor": "a", "scopes": [1]},
                                 {"actor": "a", "role": 5}, "ada"])
def test_a_bad_permissions_context_is_refused_and_nothing_is_written(app: cairn.App, bad: object) -> None:
    with pytest.raises(InvalidArgument):
        app.start("steps", 1, run_id="r", started_by=bad)  # type: ignore[arg-type]
    assert app.store.get_run("r") is None


def test_python_operator_actions_record_the_actor_and_the_log_shows_them(app: cairn.App) -> None:
    app.start("steps", 1, run_id="r")
    app.operator.acting_as("user:bob").cancel("r", "by hand")
    log = app.audit.log(run_id="r")
    assert [(e.event, e.actor, e.auth) for e in log] == [
        ("run.created", f"app:{os.getpid()}", "in-process"), ("run.cancelled", "user:bob", "configured")]
    assert [e.run_id for e in app.audit.log(actor="user:bob")] == ["r"]
    cancelled = app.audit.log(event="run.cancelled", limit=1)[0]
    assert cancelled.detail == {"reason": "by hand", "actor": "user:bob"}


def test_a_child_run_is_started_by_its_parent(app: cairn.App) -> None:
    @app.workflow(name="parent")
    def parent(ctx: cairn.Context) -> int:
        return ctx.child("steps", 2, run_id="kid")  # type: ignore[no-any-return]

    app.run("parent", run_id="mom")
    assert created_detail(app, "kid")["started_by"] == {"actor": "run:mom", "auth": "parent-run",
                                                        "tenant": "default"}
    assert app.audit.verify().verdict is Verdict.UNANCHORED  # the children's entries are chained too
    assert app.audit.verify().problems == []


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    return url


def test_cli_start_and_cancel_record_the_os_user(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAIRN_ACTOR", raising=False)
    started = cli("start", "greet", "--app", "tests.cli.sample_app:app", "--db", db,
                  "--input", '{"name": "x"}', "--run-id", "c1")
    assert started.exit_code == 0, started.stderr
    cancelled = cli("cancel", "c1", "--db", db)
    assert cancelled.exit_code == 0, cancelled.stderr
    app = cairn.App(db=db)
    try:
        log = app.audit.log(run_id="c1")
        assert [e.actor.split("@")[0] for e in log] == ["cli:" + _user(), "cli:" + _user()]
        assert {e.auth for e in log} == {"os-user"}
    finally:
        app.close()
    shown = cli("show", "c1", "--db", db)
    assert "starter" in shown.stdout
    assert "(os-user)" in shown.stdout


def test_cli_uses_a_configured_identity(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_ACTOR", "ada\x1b[31m")  # a control character is dropped, never printed
    assert cli("start", "greet", "--app", "tests.cli.sample_app:app", "--db", db, "--input", '{"name": "x"}',
               "--run-id", "c1").exit_code == 0
    assert cli("cancel", "c1", "--db", db).exit_code == 0
    logged = cli("audit", "log", "--db", db, "--json")
    assert logged.exit_code == 0, logged.stderr
    lines = [json.loads(line) for line in logged.stdout.splitlines()]
    assert [(e["event"], e["actor"], e["auth"]) for e in lines] == [
        ("run.created", "user:ada[31m", "configured"), ("run.cancelled", "user:ada[31m", "configured")]


def test_cli_audit_commands_and_their_errors(db: str, tmp_path: Path) -> None:
    assert cli("start", "greet", "--app", "tests.cli.sample_app:app", "--db", db, "--input", '{"name": "x"}',
               "--run-id", "c1").exit_code == 0
    unanchored = cli("audit", "verify", "--db", db)
    assert unanchored.exit_code == 3
    assert unanchored.stdout.startswith("UNANCHORED: 1 entries of 1 runs")
    key, anchor = tmp_path / "k", tmp_path / "anchor.jsonl"
    assert cli("audit", "keygen", str(key)).exit_code == 0
    check_error(cli("audit", "keygen", str(key)), 1, "already exists")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    made = cli("audit", "checkpoint", "--db", db, "--key", str(key), "--anchor", str(anchor))
    assert made.exit_code == 0, made.stderr
    verified = cli("audit", "verify", "--db", db, "--anchor", str(anchor), "--key", f"{key}.pub")
    assert verified.exit_code == 0, verified.stdout
    assert verified.stdout.startswith("VERIFIED: 1 entries"), verified.stdout
    check_error(cli("audit", "verify", "--db", db, "--anchor", str(tmp_path / "none")), 1, "cannot read")
    other = tmp_path / "other"
    cli("audit", "keygen", str(other))
    check_error(cli("audit", "verify", "--db", db, "--anchor", str(anchor), "--key", str(other)), 1,
                "signed with another key")
    forged = anchor.read_text().replace('"runs":1', '"runs":2')
    (tmp_path / "forged.jsonl").write_text(forged)
    check_error(cli("audit", "verify", "--db", db, "--anchor", str(tmp_path / "forged.jsonl")), 1,
                "signature does not match")
    check_error(cli("audit", "verify", "--db", db, "--anchor", str(key)), 1, "not JSON")


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


assert main is not None
