"""The operator commands: ``cairn ops`` / ``ops resolve``, ``kill``,
``resume --force``, ``budget``; the store opened without creating it; and how
``show``/``events`` render side effects and the new statuses.

Runs are driven in process: ``drive`` claims a run and executes it once (as
a worker would), which leaves it wherever that claim ended (for example
``needs_attention``); ``app.resume`` then takes it to the end.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.cli.main import _outcome_logger
from cairn.engine.executor import Outcome, execute
from cairn.store.records import RunStatus
from tests.cli.effects import build_app, ledger_lines
from tests.cli.test_cli import check_error, cli

EFFECTS_APP = "tests.cli.effects_app:app"


@pytest.fixture(autouse=True)
def _fresh_app_modules() -> Iterator[None]:
    sys.modules.pop("tests.cli.effects_app", None)
    yield
    sys.modules.pop("tests.cli.effects_app", None)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    return url


@pytest.fixture
def app(db: str) -> Iterator[cairn.App]:
    application = build_app(db)
    yield application
    application.close()


@pytest.fixture
def bank(tmp_path: Path) -> dict[str, str]:
    return {"ledger": str(tmp_path / "ledger.jsonl"), "outage": str(tmp_path / "outage")}


def drive(app: cairn.App, run_id: str) -> Outcome:
    """One claim of ``run_id``, executed here, as a worker would."""
    claim = app.store.claim_run(run_id, "w-test", 5.0, 5)
    assert claim is not None
    return execute(app.runtime, claim, "w-test")


def stuck_payment(app: cairn.App, bank: dict[str, str], mode: str, run_id: str = "pay-1") -> str:
    """A ``payout`` run parked in ``needs_attention``: ``pay`` raised
    ``TimeoutError`` after (``mode="after"``) or before applying the transfer."""
    Path(bank["outage"]).write_text(mode)
    app.start("payout", "ada", 40, bank["ledger"], bank["outage"], run_id=run_id)
    assert drive(app, run_id).status == "suspended"
    assert app.get_run(run_id).status is RunStatus.NEEDS_ATTENTION
    Path(bank["outage"]).unlink()  # the bank is back
    return run_id


# -- ops and ops resolve ----------------------------------------------------------------------


def test_ops_lists_the_uncertain_operation_and_how_to_resolve_it(
    db: str, app: cairn.App, bank: dict[str, str]
) -> None:
    run_id = stuck_payment(app, bank, "after")
    key = cairn.operation_id(run_id, 1)

    text = cli("ops", run_id, "--db", db)
    assert text.exit_code == 0, text.stderr
    out = text.stdout
    for fragment in (f"run {run_id} (payout): needs_attention", "pay", "uncertain", key,
                     "TimeoutError: the bank did not answer in time",
                     '"amount": 40', '"to": "acct_ada"',
                     f"cairn ops resolve {run_id} 1 --done RESULT_JSON --db {db}",
                     f"cairn ops resolve {run_id} 1 --not-done --db {db}"):
        assert fragment in out, fragment
    assert "lookup_account  done" in out  # the read tool before it

    data = json.loads(cli("ops", run_id, "--json", "--db", db).stdout)
    assert data["status"] == "needs_attention"
    [lookup, op] = data["operations"]
    assert (lookup["tool"], lookup["status"], lookup["arguments"]) == ("lookup_account", "done", None)
    assert (op["position"], op["tool"], op["status"], op["operation_id"], op["attempt"]) == (
        1, "pay", "uncertain", key, 1)
    assert op["arguments"] == {"to": "acct_ada", "amount": 40, "ledger": bank["ledger"],
                               "outage": bank["outage"]}
    assert "TimeoutError" in op["why"]
    assert data["needs_resolution"] == [1]
    resolve = f"cairn ops resolve {run_id} 1"
    assert data["resolve"] == [{"position": 1, "done": f"{resolve} --done RESULT_JSON --db {db}",
                                "not_done": f"{resolve} --not-done --db {db}"}]
    # `list` is the default command, and can be named (e.g. for a run called "resolve")
    assert json.loads(cli("ops", "list", run_id, "--json", "--db", db).stdout) == data
    assert json.loads(cli("--db", db, "ops", "--json", run_id).stdout) == data


def test_resolve_done_records_the_result_and_the_run_completes(
    db: str, app: cairn.App, bank: dict[str, str]
) -> None:
    run_id = stuck_payment(app, bank, "after")
    [sent] = ledger_lines(bank["ledger"])  # the operator checks the bank: it happened
    assert sent["key"] == cairn.operation_id(run_id, 1)
    receipt = {"transfer": "t-manual", "to": sent["to"], "amount": sent["amount"]}

    result = cli("ops", "resolve", run_id, "1", "--done", json.dumps(receipt), "--db", db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"resolved #1 pay of run {run_id} as done")
    assert "the run is pending" in result.stdout

    assert app.resume(run_id) == {"receipt": receipt}
    assert len(ledger_lines(bank["ledger"])) == 1  # not sent again
    ops = json.loads(cli("ops", run_id, "--json", "--db", db).stdout)["operations"]
    assert [(o["tool"], o["status"]) for o in ops] == [("lookup_account", "done"), ("pay", "done")]
    text = cli("ops", run_id, "--db", db).stdout
    assert "needs attention" not in text
    assert "resolved by an operator" in cli("events", run_id, "--db", db).stdout


def test_resolve_not_done_executes_again_with_the_same_key(
    db: str, app: cairn.App, bank: dict[str, str]
) -> None:
    run_id = stuck_payment(app, bank, "before")
    assert ledger_lines(bank["ledger"]) == []  # the operator checks the bank: it did not happen
    result = cli("--db", db, "ops", "resolve", run_id, "1", "--not-done")
    assert result.exit_code == 0, result.stderr
    assert "as not done" in result.stdout
    out = app.resume(run_id)
    [sent] = ledger_lines(bank["ledger"])
    assert sent["key"] == cairn.operation_id(run_id, 1)
    assert out["receipt"]["amount"] == 40
    lines = cli("events", run_id, "--json", "--db", db).stdout.splitlines()
    events = [json.loads(line)["event"] for line in lines]
    assert "op.resolved" in events


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (("1", "--done", "{not json"), 2, "not valid JSON"),
        (("1",), 2, "exactly one of --done JSON and --not-done"),
        (("1", "--done", "1", "--not-done"), 2, "exactly one of --done JSON and --not-done"),
        (("one", "--not-done"), 2, "'one' is not a valid integer"),
        (("0", "--not-done"), 1, "operation at position 0 of run 'pay-1' is not uncertain"),
        (("7", "--done", "{}"), 1, "uncertain positions: [1]"),
        (("1", "--done", '"t-manual"'), 1, "does not fit tool 'pay'"),  # pay returns an object
        (("1", "--done", "null"), 1, "the value: None is not of type 'object'"),
    ],
)
def test_resolve_user_errors(
    db: str, app: cairn.App, bank: dict[str, str], args: tuple[str, ...], code: int, fragment: str
) -> None:
    run_id = stuck_payment(app, bank, "after")
    check_error(cli("ops", "resolve", run_id, *args, "--db", db), code, fragment)
    assert app.get_run(run_id).status is RunStatus.NEEDS_ATTENTION  # untouched


def test_resolve_a_run_that_needs_no_attention(db: str, app: cairn.App, bank: dict[str, str]) -> None:
    app.start("payout", "bo", 5, bank["ledger"], run_id="fine")
    check_error(cli("ops", "resolve", "fine", "1", "--done", "{}", "--db", db), 1,
                "run 'fine' is pending; it has no operation to resolve")
    check_error(cli("ops", "resolve", "nope", "1", "--not-done", "--db", db), 1, "no run with id 'nope'")


def test_ops_on_runs_without_tool_calls(db: str, app: cairn.App) -> None:
    app.start("rewinding", run_id="steps")
    app.resume("steps")
    result = cli("ops", "steps", "--db", db)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == "run steps (completed) has made no tool calls\n"
    assert json.loads(cli("ops", "steps", "--json", "--db", db).stdout)["operations"] == []
    check_error(cli("ops", "nope", "--db", db), 1, "no run with id 'nope'")
    check_error(cli("ops", "--db", db), 2, "Missing argument 'RUN'")


# -- kill and resume --------------------------------------------------------------------------


def test_kill_then_resume_forced(db: str, app: cairn.App, bank: dict[str, str]) -> None:
    app.start("payout", "ada", 10, bank["ledger"], run_id="k1")
    result = cli("kill", "k1", "--reason", "runaway agent", "--db", db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["killed 1 run:", "  k1  (payout, tenant default)"]
    record = app.get_run("k1")
    assert record.status is RunStatus.KILLED
    assert record.error == {"type": "Killed", "message": "runaway agent"}
    assert cli("kill", "k1", "--db", db).stdout == "run k1 was already killed\n"
    shown = cli("show", "k1", "--db", db).stdout
    assert "killed" in shown
    assert "runaway agent" in shown
    assert "runaway agent" in cli("events", "k1", "--db", db).stdout

    check_error(cli("resume", "k1", "--db", db), 2, "only resume when forced", "cairn resume k1 --force")
    assert app.get_run("k1").status is RunStatus.KILLED
    result = cli("resume", "k1", "--force", "--db", db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "resumed run k1 (was killed); it is pending until a worker picks it up\n"
    assert app.resume("k1")["receipt"]["amount"] == 10
    assert "run.revived" in cli("events", "k1", "--db", db).stdout


def test_kill_a_tenant(db: str, app: cairn.App, bank: dict[str, str]) -> None:
    for run_id in ("a1", "a2"):
        app.start("lookups", ["x"], run_id=run_id, tenant="acme")
    app.start("lookups", ["y"], run_id="other")
    result = cli("kill", "--tenant", "acme", "--db", db)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "killed 2 runs:"
    assert sorted(line.split()[0] for line in lines[1:]) == ["a1", "a2"]
    assert app.get_run("other").status is RunStatus.PENDING
    assert cli("kill", "--tenant", "acme", "--db", db).stdout == \
        "killed 0 runs: tenant 'acme' has no unfinished runs\n"


def test_kill_user_errors(db: str, app: cairn.App) -> None:
    app.start("lookups", [], run_id="done")
    app.resume("done")
    check_error(cli("kill", "--db", db), 2, "give exactly one of RUN and --tenant")
    check_error(cli("kill", "done", "--tenant", "acme", "--db", db), 2,
                "give exactly one of RUN and --tenant")
    check_error(cli("kill", "nope", "--db", db), 1, "no run with id 'nope'")
    check_error(cli("kill", "done", "--db", db), 1, "run 'done' is completed; only unfinished runs")
    assert app.get_run("done").status is RunStatus.COMPLETED


def test_resume_user_errors(db: str, app: cairn.App) -> None:
    app.start("lookups", [], run_id="live")
    check_error(cli("resume", "live", "--force", "--db", db), 1, "only killed or halted runs can be revived")
    check_error(cli("resume", "nope", "--force", "--db", db), 1, "no run with id 'nope'")
    check_error(cli("resume", "--db", db), 2, "Missing argument 'RUN'")


def test_a_halted_run_resumes_when_forced(db: str, app: cairn.App, tmp_path: Path) -> None:
    breach = tmp_path / "breach"
    breach.touch()
    app.start("guarded", str(breach), run_id="h1")
    assert drive(app, "h1").status == "halted"
    shown = cli("show", "h1", "--db", db).stdout
    assert "halted" in shown
    assert "another tenant's data" in shown
    assert "run.halted" in cli("events", "h1", "--db", db).stdout
    breach.unlink()
    result = cli("resume", "h1", "--force", "--db", db)
    assert result.exit_code == 0, result.stderr
    assert "(was halted)" in result.stdout
    assert app.resume("h1") == "clean"


# -- budget -----------------------------------------------------------------------------------


def test_budget_raise_lets_a_suspended_run_continue(db: str, app: cairn.App) -> None:
    app.start("lookups", ["a", "b", "c"], run_id="b1", budget=cairn.Budget(tool_calls=1, cost=2.5))
    assert drive(app, "b1").status == "suspended"
    assert app.get_run("b1").status is RunStatus.SUSPENDED
    shown = cli("show", "b1", "--db", db).stdout
    assert "budget exceeded: tool calls used 1 of 1" in shown
    assert "cost 2.5, tool calls 1" in shown
    assert "budget exceeded" in cli("events", "b1", "--db", db).stdout

    result = cli("budget", "b1", "--tool-calls", "10", "--db", db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ("budget of run b1: cost 2.5, tool calls 10 (was cost 2.5, tool calls 1); "
                             "the run is suspended\n")
    assert app.get_run("b1").budget == {"tool_calls": 10, "cost": 2.5}  # other limits kept
    assert app.resume("b1") == ["acct_a", "acct_b", "acct_c"]
    events = cli("events", "b1", "--db", db).stdout
    assert "run.budget_changed" in events
    assert "budget now cost 2.5, tool calls 10" in events


def test_budget_user_errors(db: str, app: cairn.App) -> None:
    app.start("lookups", ["a"], run_id="r1")
    check_error(cli("budget", "r1", "--db", db), 2, "give at least one limit")
    check_error(cli("budget", "r1", "--tokens", "-5", "--db", db), 2, "--tokens")
    check_error(cli("budget", "r1", "--cost", "lots", "--db", db), 2, "--cost")
    check_error(cli("budget", "nope", "--tokens", "5", "--db", db), 1, "no run with id 'nope'")
    assert app.store.claim_run("r1", "w-test", 5.0, 5) is not None  # now running
    check_error(cli("budget", "r1", "--tokens", "5", "--db", db), 1,
                "run 'r1' is running; change its budget once it is suspended")


# -- the database is never created by inspection --------------------------------------------


@pytest.mark.parametrize(
    "command",
    [("runs",), ("show", "r"), ("events", "r"), ("ops", "r"), ("ops", "resolve", "r", "0", "--not-done"),
     ("cancel", "r"), ("retry", "r"), ("kill", "r"), ("kill", "--tenant", "t"), ("resume", "r", "--force"),
     ("budget", "r", "--tokens", "5"), ("show", "r", "--app", "tests.cli.sample_app:app")],
)
def test_a_typo_in_db_creates_nothing(tmp_path: Path, command: tuple[str, ...]) -> None:
    missing = tmp_path / "typo" / "cairn.db"
    check_error(cli(*command, "--db", f"sqlite:///{missing}"), 1, f"no database at '{missing}'")
    assert list(tmp_path.iterdir()) == []


# -- start, --wait and the worker's log -------------------------------------------------------


def test_start_an_existing_run_id(db: str, app: cairn.App, bank: dict[str, str]) -> None:
    first = cli("start", "lookups", "--app", EFFECTS_APP, "--db", db, "--input", '{"customers": ["a"]}',
                "--run-id", "order-17")
    where = f"database: SQLite {Path(db.removeprefix('sqlite://')).resolve()}"
    assert (first.exit_code, first.stdout) == (0, "order-17\n")
    assert first.stderr == f"started run order-17 ({where})\n"
    again = cli("start", "lookups", "--app", EFFECTS_APP, "--db", db, "--input", '{"customers": ["b"]}',
                "--run-id", "order-17")
    assert again.exit_code == 0
    assert again.stdout == "order-17\n"
    assert again.stderr == ("run order-17 already existed (pending); it was not started again and its "
                            f"input is unchanged ({where})\n")
    assert app.resume("order-17") == ["acct_a"]


def test_start_wait_stops_when_the_run_needs_attention(db: str, app: cairn.App, bank: dict[str, str]) -> None:
    Path(bank["outage"]).write_text("after")
    worker = app.worker(concurrency=1, poll_interval=0.02)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    data = json.dumps({"customer": "ada", "amount": 3, "ledger": bank["ledger"], "outage": bank["outage"]})
    try:
        result = cli("start", "payout", "--app", EFFECTS_APP, "--db", db, "--input", data, "--wait",
                     "--timeout", "20")
    finally:
        worker.stop()
        thread.join()
    assert result.exit_code == 1
    started, error = result.stderr.splitlines()
    run_id = started.split()[2]
    assert error == (f"error: run '{run_id}' needs attention: the outcome of a side effect is uncertain "
                     f"(see 'cairn ops {run_id}')")


def test_worker_log_says_when_a_run_needs_attention(
    db: str, app: cairn.App, bank: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    Path(bank["outage"]).write_text("after")
    app.start("payout", "ada", 1, bank["ledger"], bank["outage"], run_id="p")
    claim = app.store.claim_run("p", "w-test", 5.0, 5)
    assert claim is not None
    outcome = execute(app.runtime, claim, "w-test")
    with caplog.at_level(logging.INFO, logger="cairn.worker"):
        _outcome_logger(app.store)(claim, outcome)
    assert "run p (payout) needs attention" in caplog.text
    assert "cairn ops p" in caplog.text


# -- show and events: the new statuses and entries --------------------------------------------


def test_show_and_events_render_side_effects(db: str, app: cairn.App, bank: dict[str, str]) -> None:
    run_id = stuck_payment(app, bank, "after")
    key = cairn.operation_id(run_id, 1)
    shown = cli("show", run_id, "--db", db)
    assert shown.exit_code == 0
    for fragment in ("needs_attention", "attention", f"operation {key}", "TimeoutError",
                     f"cairn ops {run_id}", "intent", "write op"):
        assert fragment in shown.stdout, fragment
    data = json.loads(cli("show", run_id, "--json", "--db", db).stdout)
    assert data["attention"]["operation_id"] == key
    intent = next(j for j in data["journal"] if j["status"] == "intent")
    assert intent["arguments"]["amount"] == 40
    assert intent["detail"] == {"operation_id": key, "effect": "write"}

    events = cli("events", run_id, "--db", db).stdout
    intent_line = next(line for line in events.splitlines() if "op.intent" in line)
    assert f"write op {key}" in intent_line
    assert "#1 pay" in intent_line
    attention_line = next(line for line in events.splitlines() if "run.needs_attention" in line)
    assert "is uncertain" in attention_line
    entries = [json.loads(line) for line in cli("events", run_id, "--json", "--db", db).stdout.splitlines()]
    intent_entry = next(e for e in entries if e["event"] == "op.intent")
    assert intent_entry["arguments"]["to"] == "acct_ada"
    assert "result" not in intent_entry
    listed = [json.loads(line)["run_id"] for line in
              cli("runs", "--status", "needs_attention", "--json", "--db", db).stdout.splitlines()]
    assert listed == [run_id]


def test_events_show_why_a_run_rewound(db: str, app: cairn.App) -> None:
    app.start("rewinding", run_id="rw")
    assert app.resume("rw") == 3
    events = cli("events", "rw", "--db", db).stdout
    line = next(line for line in events.splitlines() if "run.rewound" in line)
    assert "the total must be odd" in line
    assert "to 'plan'" in line
    entries = [json.loads(x) for x in cli("events", "rw", "--json", "--db", db).stdout.splitlines()]
    [rewound] = [e for e in entries if e["event"] == "run.rewound"]
    assert rewound["detail"]["reason"] == "the total must be odd"


def test_status_styles_cover_every_status() -> None:
    from cairn.cli.render import STATUS_STYLE

    assert set(STATUS_STYLE) == set(RunStatus)



# -- cairn demo payments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("payments", "--db", "memory://"), "needs a SQLite database file"),
        (("--steps", "12", "payments"), "--steps only applies to the research-agent demo"),
        (("nosuch",), "No such command 'nosuch'"),
    ],
)
def test_demo_usage_errors(args: tuple[str, ...], fragment: str) -> None:
    check_error(cli("demo", *args), 2, fragment)


@pytest.fixture
def no_payments_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """``cairn.demo.payments`` not imported yet (as in a fresh ``cairn``
    process), run from an empty directory; afterwards its App is closed and
    the module forgotten, so other tests import it afresh."""
    import cairn.demo

    def forget() -> None:
        module = sys.modules.pop("cairn.demo.payments", None)
        if module is not None:
            module.app.close()
        if hasattr(cairn.demo, "payments"):
            delattr(cairn.demo, "payments")

    forget()
    monkeypatch.delenv("CAIRN_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    yield
    forget()


def test_demo_payments_dispatch(no_payments_module: None, tmp_path: Path) -> None:
    from cairn.cli.main import _payments_demo

    _payments_demo()  # imported the way the CLI imports it: no database created
    assert list(tmp_path.iterdir()) == []
    assert "CAIRN_DB" not in os.environ
    calls: list[str | None] = []

    def fake(db_url: str | None, console: Any) -> int:
        calls.append(db_url)
        return 3

    sys.modules["cairn.demo.payments"].run_payments_demo = fake  # type: ignore[attr-defined]
    result = cli("demo", "payments", "--db", "p.db")
    assert result.exit_code == 3
    assert calls == ["p.db"]
    assert cli("--db", "x.db", "demo", "payments").exit_code == 3
    assert cli("demo", "payments").exit_code == 3
    assert calls[1:] == ["x.db", None]


def test_demo_payments_not_installed(no_payments_module: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cairn.demo.payments", None)  # the import fails
    check_error(cli("demo", "payments"), 1, "the payments demo is not installed")


@pytest.mark.slow
def test_demo_payments_end_to_end(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    done = subprocess.run([sys.executable, "-m", "cairn", "demo", "payments", "--db", str(tmp_path / "p.db")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: the bank holds exactly 3 transfer(s)" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("p.db")) == []
