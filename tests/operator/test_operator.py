"""The operator façade (``cairn.api.operator``): typed results, the acting
identity, and the precondition each action checks, on a real SQLite store."""

from __future__ import annotations

import os
import pwd
import socket
from pathlib import Path

import pytest

import cairn
from cairn.api.ledger import OpStatus
from cairn.api.operator import Operator, cli_actor, open_schema
from cairn.engine.budget import Budget
from cairn.store.records import RunStatus
from tests.operator.conftest import stuck_payment


def test_the_app_acts_as_its_process_and_the_cli_as_its_user(app: cairn.App,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert app.operator.actor == f"app:{os.getpid()}"
    monkeypatch.setenv("USER", "ada")  # the uid's user, not $USER (USER=ada cairn approve)
    monkeypatch.setenv("LOGNAME", "ada")
    assert cli_actor() == f"cli:{pwd.getpwuid(os.getuid()).pw_name}@{socket.gethostname()}"
    other = app.operator.acting_as("http:ada")
    assert (other.actor, app.operator.actor) == ("http:ada", f"app:{os.getpid()}")


def test_cancel_says_what_it_changed(app: cairn.App) -> None:
    app.start("lookups", ["ada"], run_id="c1")
    change = app.operator.cancel("c1", "enough")
    assert (change.before.status, change.run.status, change.changed) == (
        RunStatus.PENDING, RunStatus.CANCELLED, True)
    again = app.operator.cancel("c1")
    assert (again.before.status, again.changed) == (RunStatus.CANCELLED, False)
    with pytest.raises(cairn.RunNotFound):
        app.operator.cancel("nope")


def test_retry_says_where_the_run_resumes(app: cairn.App, tmp_path: Path) -> None:
    breach = tmp_path / "breach"
    breach.write_text("")
    app.start("guarded", str(breach), run_id="g1")
    with pytest.raises(cairn.RunFailed):
        app.resume("g1")
    halted = app.get_run("g1").status
    assert halted is RunStatus.HALTED
    # retry is the store's rule: a halted run is not retried, it is revived
    with pytest.raises(cairn.CairnError, match="only failed or quarantined"):
        app.operator.retry("g1")
    revived = app.operator.revive("g1")
    assert (revived.before.status, revived.run.status) == (RunStatus.HALTED, RunStatus.PENDING)


def test_retry_of_a_failed_run(app: cairn.App, tmp_path: Path) -> None:
    @app.step(name="first")
    def first() -> int:
        return 1

    @app.step(name="check")
    def check(flag: str) -> str:
        if Path(flag).exists():
            raise RuntimeError("the flag is up")
        return "ok"

    @app.workflow(name="flaky")
    def flaky(ctx: cairn.Context, flag: str) -> str:
        return f"{first()} {check(flag)}"

    flag = tmp_path / "flag"
    flag.write_text("")
    with pytest.raises(cairn.RunFailed):
        app.run("flaky", str(flag), run_id="f1")
    flag.unlink()
    retried = app.operator.retry("f1")
    assert (retried.before.status, retried.run.status) == (RunStatus.FAILED, RunStatus.PENDING)
    assert retried.from_position == 1  # after the first step, which is kept
    assert app.resume("f1") == "1 ok"


def test_set_budget_can_keep_the_other_limits(app: cairn.App) -> None:
    app.start("lookups", ["ada"], run_id="b1", budget=Budget(tokens=100, cost=2.0))
    change = app.operator.set_budget("b1", Budget(tool_calls=3), keep_others=True)
    assert change.before.budget == {"tokens": 100, "cost": 2.0}
    assert change.run.budget == {"tokens": 100, "cost": 2.0, "tool_calls": 3}
    replaced = app.operator.set_budget("b1", Budget(tool_calls=4))
    assert replaced.run.budget == {"tool_calls": 4}


def test_resolve_returns_the_operation_it_settled(app: cairn.App, bank: dict[str, str]) -> None:
    run_id = stuck_payment(app, bank, "after")
    report = app.operator.operations(run_id)
    assert [op.position for op in report.uncertain()] == [1]
    resolved = app.operator.resolve(run_id, 1, done=True, result={"transfer": "t-1"})
    assert resolved.operation is not None
    assert (resolved.operation.tool, resolved.operation.status) == ("pay", OpStatus.UNCERTAIN)
    assert (resolved.before.status, resolved.run.status) == (RunStatus.NEEDS_ATTENTION, RunStatus.PENDING)
    assert app.operator.operations(run_id).uncertain() == []


def test_a_done_result_must_fit_the_tools_result_type(app: cairn.App, bank: dict[str, str]) -> None:
    """The run will read the recorded result back as the tool's result type
    when it replays: a result that does not fit would make it fail then, with
    the operator long gone. It is refused here and nothing is stored."""
    run_id = stuck_payment(app, bank, "after")
    history = app.history(run_id)
    for wrong in ("t-1", None, ["t-1"], 7):
        with pytest.raises(cairn.InvalidArgument, match=r"does not fit tool 'pay'.s result type"):
            app.operator.resolve(run_id, 1, done=True, result=wrong)
    assert app.history(run_id) == history
    assert app.get_run(run_id).status is RunStatus.NEEDS_ATTENTION
    app.operator.resolve(run_id, 1, done=True, result={"transfer": "t-1", "to": "acct_ada", "amount": 40})
    assert app.resume(run_id)["receipt"] == {"transfer": "t-1", "to": "acct_ada", "amount": 40}


def test_queues_and_prune(app: cairn.App) -> None:
    operator: Operator = app.operator
    operator.set_queue(cairn.QueueLimits("slow", concurrency=2))
    assert [s.limits.concurrency for s in operator.queues() if s.limits.name == "slow"] == [2]
    operator.clear_queue("slow")
    assert [s for s in operator.queues() if s.limits.name == "slow"] == []
    app.start("lookups", ["ada"], run_id="p1")
    app.resume("p1")
    assert operator.prune(0, dry_run=True) == 1
    assert operator.prune(0) == 1
    with pytest.raises(ValueError, match="must not be negative"):
        operator.prune(-1)


def test_open_schema(tmp_path: Path) -> None:
    with pytest.raises(cairn.CairnError, match="no database at"):
        open_schema(str(tmp_path / "missing.db"), create=False)
    assert not (tmp_path / "missing.db").exists()
    schema = open_schema(str(tmp_path / "new.db"), create=True)
    try:
        assert schema.dialect == "sqlite"
        applied = schema.migrate()
        assert applied
        assert schema.version() == applied[-1]
        assert schema.migrate() == []
    finally:
        schema.close()
    with pytest.raises(ValueError, match="no schema to manage"):
        open_schema("memory://", create=True)


def test_every_action_records_its_actor(app: cairn.App, bank: dict[str, str]) -> None:
    cli = app.operator.acting_as("cli:ada@host")
    run_id = stuck_payment(app, bank, "after")
    cli.resolve(run_id, 1, done=True, result={"transfer": "t-1"})
    [_, pay] = cli.operations(run_id).operations
    assert pay.resolution is not None
    assert pay.resolution.actor == "cli:ada@host"
    app.start("lookups", ["ada"], run_id="c1", budget=Budget(tokens=1))
    cli.set_budget("c1", Budget(tokens=2))
    cli.cancel("c1")
    app.start("lookups", ["bo"], run_id="k1")
    cli.kill("k1")
    cli.revive("k1")
    actors = {e.event.value: (e.detail or {}).get("actor") for e in app.history("c1") + app.history("k1")
              if e.event.value in ("run.budget_changed", "run.cancelled", "run.killed", "run.revived")}
    assert actors == dict.fromkeys(("run.budget_changed", "run.cancelled", "run.killed", "run.revived"),
                                   "cli:ada@host")
