"""Issue 26 part 1: each run's permissions context (who started it, how
authenticated, tenant, role, delegated scopes) recorded in its run.created
entry, which the audit chain covers, through every path that starts runs:
Python, the CLI (the OS user or $CAIRN_ACTOR), HTTP (the token), a parent
run, a schedule; operator actions on each path record their actor."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main as cli
from cairn.errors import InvalidArgument
from cairn.store.auditverify import verify_store
from cairn.store.records import RunFilter
from cairn.worker.scheduler import Scheduler
from tests.encryption.test_sealed_store import Raw, build


def created(app: cairn.App, run_id: str) -> dict[str, Any]:
    first = app.history(run_id)[0]
    assert first.event.value == "run.created"
    return dict((first.detail or {}).get("started_by") or {})


def test_python_start_records_the_app_and_a_program_may_pass_who_it_acts_for(place: str) -> None:
    app = build(place, None)
    run_id = app.start("canary", "x", tenant="a").run_id
    assert created(app, run_id) == {"actor": f"app:{os.getpid()}", "auth": "in-process", "tenant": "a"}
    other = app.start("canary", "y", tenant="a", started_by={
        "actor": "user:ada", "role": "support", "scopes": ["refunds:write"], "tenant": "evil"}).run_id
    assert created(app, other) == {"actor": "user:ada", "auth": "in-process, vouched for by the program",
                                   "tenant": "a", "role": "support", "scopes": ["refunds:write"]}
    app.cancel(other, "by hand")
    log = app.audit.log(run_id=other)
    assert [(e.event, e.actor) for e in log] == [("run.created", "user:ada"),
                                                 ("run.cancelled", f"app:{os.getpid()}")]
    # the context is part of the chained entry: changing it is tampering
    Raw(place)("UPDATE history SET detail = replace(detail, 'support', 'admin') "
               "WHERE run_id = :r AND seq = 1", r=other)
    problems = verify_store(app.store).problems
    assert [(p.run_id, p.seq) for p in problems] == [(other, 1)]
    app.close()


@pytest.mark.parametrize("bad", [{"role": "x"}, {"actor": ""}, {"actor": "a\nforged line"},
                                 {"actor": "a", "scopes": "refunds"}, {"actor": "a", "scopes": [1]},
                                 {"actor": "a", "role": 5}, "ada"])
def test_a_bad_permissions_context_is_refused_and_nothing_is_written(tmp_path: Path, bad: Any) -> None:
    app = build(f"sqlite:///{tmp_path}/c.db", None)
    with pytest.raises(InvalidArgument):
        app.start("canary", "x", run_id="r", started_by=bad)
    assert app.store.get_run("r") is None
    app.close()


def test_a_child_and_a_scheduled_run_record_who_started_them(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/c.db")

    @app.step()
    def one() -> int:
        return 1

    @app.workflow(name="kid")
    def kid(ctx: cairn.Context) -> int:
        return one()

    @app.workflow(name="parent")
    def parent(ctx: cairn.Context) -> int:
        return int(ctx.child("kid", run_id="kid-1"))

    app.run("parent", run_id="mom")
    assert created(app, "kid-1") == {"actor": "run:mom", "auth": "parent-run", "tenant": "default"}

    # a schedule due every second, fired by a worker's scheduler pass a tick later
    app.schedule("* * * * * *", "kid", name="each-second", tenant="acme", grace=600)
    scheduler = Scheduler(app.runtime, list(app.runtime.schedules.values()))
    scheduler.run_pass()
    time.sleep(1.1)
    scheduler.run_pass()
    ticks = [run.run_id for run in app.store.list_runs(RunFilter(tenant="acme"))]
    assert ticks
    assert all(run_id.startswith("schedule:acme:each-second:") for run_id in ticks), ticks
    for run_id in ticks:
        assert created(app, run_id) == {"actor": "schedule:each-second", "auth": "schedule", "tenant": "acme"}
    assert verify_store(app.store).problems == []
    app.close()


def cli_run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_cli_start_and_cancel_record_the_os_user_or_the_configured_identity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.delenv("CAIRN_ACTOR", raising=False)
    started = cli_run("start", "greet", "--app", "tests.cli.sample_app:app", "--db", db,
                      "--input", '{"name": "x"}', "--run-id", "c1")
    assert started.exit_code == 0, started.output
    assert cli_run("cancel", "c1", "--db", db).exit_code == 0
    monkeypatch.setenv("CAIRN_ACTOR", "ada\x1b[31m")  # a control character is dropped, never printed
    assert cli_run("start", "greet", "--app", "tests.cli.sample_app:app", "--db", db,
                   "--input", '{"name": "x"}', "--run-id", "c2").exit_code == 0
    logged = cli_run("audit", "log", "--db", db, "--json")
    lines = [json.loads(line) for line in logged.output.splitlines()]
    who = [(e["run_id"], e["event"], e["actor"].split("@")[0], e["auth"]) for e in lines
           if e["event"] in ("run.created", "run.cancelled")]
    import pwd

    me = "cli:" + pwd.getpwuid(os.getuid()).pw_name
    assert who == [("c1", "run.created", me, "os-user"), ("c1", "run.cancelled", me, "os-user"),
                   ("c2", "run.created", "user:ada[31m", "configured")]
