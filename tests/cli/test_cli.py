"""The ``cairn`` command, in process (``CliRunner``) and as real processes.

Runs started by the CLI are executed either by a real ``cairn worker``
subprocess or inline by an App the test builds on the same database
(``tests.cli.workflows.build_app``), which keeps most tests fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import cairn
from cairn.cli.demo import JournalStep, judge
from cairn.cli.main import main
from cairn.store import open_store
from cairn.store.records import EventType, RunStatus
from tests.cli.workflows import build_app
from tests.timing import SLACK

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.cli.sample_app:app"
_APP_MODULES = ("tests.cli.sample_app", "tests.cli.pinned_app", "tests.cli.broken_app",
                "tests.cli.missing_dep_app", "cairn.demo.agent")


@pytest.fixture(autouse=True)
def _fresh_app_modules() -> Iterator[None]:
    """The CLI imports the --app module and closes its App when done; a cached
    module would hand the next test a closed App bound to another database."""
    for name in _APP_MODULES:
        sys.modules.pop(name, None)
    yield
    for name in _APP_MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    # The CLI sets $CAIRN_DB in this process; monkeypatch puts it back afterwards.
    monkeypatch.setenv("CAIRN_DB", url)
    open_store(url).close()  # inspection commands refuse a database that does not exist
    return url


@pytest.fixture
def app(db: str) -> Iterator[cairn.App]:
    application = build_app(db)
    yield application
    application.close()


def cli(*args: str, columns: int = 200) -> Result:
    return CliRunner().invoke(main, list(args), env={"COLUMNS": str(columns)})


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    return subprocess.run([sys.executable, "-m", "cairn", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def assert_one_line_error(exit_code: int, stderr: str, expected_code: int, *fragments: str) -> None:
    assert exit_code == expected_code, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def check_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert_one_line_error(result.exit_code, result.stderr, code, *fragments)


def start(db: str, workflow: str, *extra: str) -> str:
    result = cli("start", workflow, "--app", APP, "--db", db, *extra)
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


# -- user errors: one line, the right exit code, no traceback -----------------------------------


def test_show_missing_run(db: str) -> None:
    result = cli("show", "nope", "--db", db)
    check_error(result, 1)
    assert result.stderr == "error: no run with id 'nope'\n"


@pytest.mark.parametrize("command", [("show", "nope"), ("events", "nope"), ("cancel", "nope"),
                                     ("retry", "nope"), ("events", "nope", "--follow")])
def test_commands_on_a_missing_run(db: str, command: tuple[str, ...]) -> None:
    check_error(cli(*command, "--db", db), 1, "no run with id 'nope'")


def test_not_a_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """``cairn --db /etc/passwd runs``, on a byte-identical copy so a store bug
    can never damage the real file."""
    target = tmp_path / "passwd"
    target.write_bytes(Path("/etc/passwd").read_bytes() if Path("/etc/passwd").exists()
                       else b"root:x:0:0:root:/root:/bin/bash\n")
    before = target.read_bytes()
    check_error(cli("--db", str(target), "runs"), 1, "not a database")
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd"]  # no -wal/-shm/-journal beside it


def test_corrupt_database(tmp_path: Path) -> None:
    target = tmp_path / "corrupt.db"
    target.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    check_error(cli("runs", "--db", str(target)), 1, "corrupt.db")


def test_unopenable_database(tmp_path: Path) -> None:
    check_error(cli("runs", "--db", str(tmp_path)), 1, "cannot open SQLite database")


def test_unsupported_database_url() -> None:
    check_error(cli("runs", "--db", "mysql://localhost/x"), 1, "unsupported database URL scheme 'mysql'")


@pytest.mark.parametrize(
    ("spec", "code", "fragment"),
    [
        ("no_colon", 2, "expected 'package.module:app'"),
        ("tests.cli.sample_app:", 2, "expected 'package.module:app'"),
        ("tests.cli.no_such_module:app", 2, "no module named 'tests.cli.no_such_module'"),
        ("tests.cli.sample_app:nope", 2, "has no attribute 'nope'"),
        ("tests.cli.pinned_app:not_an_app", 2, "not a cairn.App"),
        ("tests.cli.broken_app:app", 1, "RuntimeError: the config file is missing"),
        ("tests.cli.missing_dep_app:app", 1, "cairn_no_such_dependency"),
    ],
)
def test_bad_app(db: str, spec: str, code: int, fragment: str) -> None:
    check_error(cli("start", "greet", "--app", spec, "--db", db), code, fragment)


def test_app_bound_to_another_database(db: str) -> None:
    check_error(cli("start", "greet", "--app", "tests.cli.pinned_app:app", "--db", db), 2,
                "bound to 'memory://'")


def test_unknown_workflow(db: str) -> None:
    check_error(cli("start", "nope", "--app", APP, "--db", db), 2, "unknown workflow 'nope'", "greet")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ('{"name": "ada", "colour": "red"}', "unexpected keyword argument 'colour'"),
        ('{"name": 42}', "Expected `str`, got `int`"),
        ("[]", "missing a required argument: 'name'"),
    ],
)
def test_input_that_does_not_fit(db: str, data: str, fragment: str) -> None:
    check_error(cli("start", "greet", "--app", APP, "--db", db, "--input", data), 2, fragment)


@pytest.mark.parametrize(
    "args",
    [("runs", "--bogus"), ("runs", "--status", "sleepy"), ("start",), ("show",), ("nosuchcommand",),
     ("start", "greet", "--app", APP, "--timeout", "3")],
)
def test_usage_errors(db: str, args: tuple[str, ...]) -> None:
    check_error(cli(*args), 2)


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (("show", "nope"), 1, "error: no database at "),
        (("start", "greet", "--app", "tests.cli.nope:app"), 2, "no module named"),
        (("start", "greet", "--app", APP, "--input", "{x"), 2, "not valid JSON"),
        (("start", "greet", "--app", "tests.cli.broken_app:app"), 1, "the config file is missing"),
    ],
)
@pytest.mark.slow
def test_errors_in_a_real_process(tmp_path: Path, args: tuple[str, ...], code: int, fragment: str) -> None:
    """What a shell sees: exit status and stderr of the actual process."""
    done = run_cli(*args, "--db", f"sqlite:///{tmp_path / 'c.db'}")
    assert_one_line_error(done.returncode, done.stderr, code, fragment)


@pytest.mark.parametrize("args", [("show", "\udcff\udcfe"), ("cancel", "r-\udcff"),
                                  ("runs", "--tenant", "\udcff"), ("events", "\udcff")])
@pytest.mark.slow
def test_an_argument_that_is_not_utf8_is_a_one_line_error(
    db: str, app: cairn.App, args: tuple[str, ...]
) -> None:
    """A shell passes bytes; Python makes lone surrogates of those that are not
    UTF-8 (here the bytes 0xff 0xfe). No database holds them: one line, exit 1."""
    app.start("greet", "ada")  # the database exists
    done = run_cli(*args, "--db", db)
    assert_one_line_error(done.returncode, done.stderr, 1, "text that is not valid Unicode")


# -- start, runs, show, events ------------------------------------------------------------------


def test_start_then_inspect(db: str, app: cairn.App) -> None:
    run_id = start(db, "greet", "--input", '{"name": "ada"}', "--tenant", "acme", "--thread-id", "t-1")
    listed = [json.loads(line) for line in cli("runs", "--json", "--db", db).stdout.splitlines()]
    assert [(r["run_id"], r["status"], r["tenant"]) for r in listed] == [(run_id, "pending", "acme")]

    assert app.resume(run_id) == {"greeting": "HELLO ADA!", "tenant": "acme"}

    shown = json.loads(cli("show", run_id, "--json", "--db", db).stdout)
    assert shown["status"] == "completed"
    assert shown["thread_id"] == "t-1"
    assert shown["input"] == {"name": "ada"}
    assert shown["result"] == {"greeting": "HELLO ADA!", "tenant": "acme"}
    assert [(j["position"], j["name"], j["status"], j["result"]) for j in shown["journal"]] == [
        (0, "shout", "completed", "HELLO ADA")
    ]
    text = cli("show", run_id, "--db", db)
    assert text.exit_code == 0
    for fragment in (run_id, "completed", "greet (version 1)", "acme", "t-1", "shout", '"HELLO ADA!"'):
        assert fragment in text.stdout


def test_input_as_array_and_as_single_value(db: str, app: cairn.App) -> None:
    positional = start(db, "greet", "--input", '["bo", "?"]')
    single = start(db, "greet", "--input", '"cy"')
    assert app.resume(positional)["greeting"] == "HELLO BO?"
    assert app.resume(single)["greeting"] == "HELLO CY!"


def test_start_is_idempotent_on_run_id(db: str) -> None:
    first = start(db, "greet", "--input", '{"name": "ada"}', "--run-id", "order-17")
    again = start(db, "greet", "--input", '{"name": "ada"}', "--run-id", "order-17")
    assert first == again == "order-17"
    assert len(cli("runs", "--json", "--db", db).stdout.splitlines()) == 1


def test_start_with_a_role_records_it(db: str, app: cairn.App) -> None:
    run_id = start(db, "greet", "--input", '{"name": "ada"}', "--role", "operator")
    assert app.store.started_with(run_id) == ("operator", None)
    assert app.store.started_with(start(db, "greet", "--input", '{"name": "bo"}')) == (None, None)
    check_error(cli("start", "greet", "--app", APP, "--db", db, "--role", "root"), 2, "--role", "'root'")
    assert len(cli("runs", "--json", "--db", db).stdout.splitlines()) == 2


def test_runs_filters_and_table(db: str, app: cairn.App) -> None:
    done = start(db, "greet", "--input", '{"name": "ada"}', "--tenant", "acme")
    waiting = start(db, "slow", "--input", "{}")
    app.resume(done)

    def ids(*filters: str) -> list[str]:
        lines = cli("runs", "--json", "--db", db, *filters).stdout.splitlines()
        return [json.loads(line)["run_id"] for line in lines]

    assert ids("--status", "completed") == [done]
    assert ids("--status", "pending") == [waiting]
    assert ids("--tenant", "acme") == [done]
    assert ids("--workflow", "slow") == [waiting]
    assert ids("--limit", "1") == [waiting]  # newest first
    table = cli("runs", "--db", db).stdout
    assert done in table
    assert "greet v1" in table


def test_db_before_the_command(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = start(db, "greet", "--input", '{"name": "ada"}')
    monkeypatch.delenv("CAIRN_DB")
    monkeypatch.chdir(tmp_path)
    assert run_id in cli("--db", db, "runs", "--json").stdout
    assert run_id in cli("runs", "--json", "--db", db).stdout


def test_show_decodes_artifacts(db: str) -> None:
    run_id = start(db, "big", "--input", '{"size": 200}')
    executor = build_app(db, inline_limit=64)
    try:
        executor.resume(run_id)
        assert executor.get_run(run_id).result.ref is not None  # type: ignore[union-attr]
    finally:
        executor.close()
    shown = json.loads(cli("show", run_id, "--json", "--db", db).stdout)
    assert shown["result"] == "X" * 200


def test_show_a_failed_run(db: str, app: cairn.App, tmp_path: Path) -> None:
    run_id = start(db, "flaky", "--input", json.dumps({"flag": str(tmp_path / "flag")}))
    with pytest.raises(cairn.RunFailed):
        app.resume(run_id)
    shown = cli("show", run_id, "--db", db)
    assert "failed" in shown.stdout
    assert "RuntimeError: flag file" in shown.stdout
    journal = json.loads(cli("show", run_id, "--json", "--db", db).stdout)["journal"]
    assert [(j["name"], j["status"]) for j in journal] == [("shout", "completed"), ("check_flag", "failed")]


def test_events(db: str, app: cairn.App) -> None:
    run_id = start(db, "greet", "--input", '{"name": "ada"}')
    app.resume(run_id)
    entries = [json.loads(line) for line in cli("events", run_id, "--json", "--db", db).stdout.splitlines()]
    kinds = [e["event"] for e in entries]
    assert kinds[0] == "run.created"
    assert kinds[-1] == "run.completed"
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    step = next(e for e in entries if e["event"] == "step.completed")
    assert (step["position"], step["name"], step["result"]) == (0, "shout", "HELLO ADA")
    later = [json.loads(line)["seq"] for line in
             cli("events", run_id, "--json", "--after", "2", "--db", db).stdout.splitlines()]
    assert later == list(range(3, len(entries) + 1))
    text = cli("events", run_id, "--db", db).stdout
    assert "step.completed" in text
    assert "#0 shout" in text


def test_events_follow_until_the_run_ends(db: str, app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run executes, start to end, at the worst moment for the follower:
    right after its first read of the history and before it looks at the
    run's status again. A follower that stops on a terminal status without a
    read after it loses the run's entries; no sleep decides the order."""
    run_id = start(db, "slow", "--input", '{"n": 3, "seconds": 0.01}')  # pending: no worker runs it
    real_history = cairn.App.history
    executed: list[str] = []

    def history(self: cairn.App, rid: str, after_seq: int = 0, limit: int | None = None) -> list[Any]:
        entries = real_history(self, rid, after_seq, limit)
        if not executed:
            executed.append(rid)
            assert app.resume(run_id) == [0, 1, 2]  # the whole run, between two reads of the follower
        return entries

    monkeypatch.setattr(cairn.App, "history", history)
    result = cli("events", run_id, "--follow", "--json", "--db", db)
    assert executed == [run_id]
    assert result.exit_code == 0
    entries = [json.loads(line) for line in result.stdout.splitlines()]
    assert entries[0]["event"] == "run.created"
    assert entries[-1]["event"] == "run.completed"
    assert [e["position"] for e in entries if e["event"] == "step.completed"] == [0, 1, 2]
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))  # each entry once


@pytest.mark.slow
def test_events_follow_stops_quietly_on_ctrl_c(db: str) -> None:
    run_id = start(db, "slow", "--input", "{}")  # pending: no worker, so --follow would wait forever
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    # SIGINT back to its default in the child: a test run started in the
    # background (CI, `pytest &`) inherits SIGINT ignored, and Python then
    # never turns Ctrl-C into KeyboardInterrupt -- the follower would not stop
    proc = subprocess.Popen([sys.executable, "-m", "cairn", "events", run_id, "--follow", "--db", db],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # following has begun
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "run.created" in first
    assert proc.returncode == 130
    assert err == ""


def test_start_wait_prints_the_result(db: str, app: cairn.App) -> None:
    worker = app.worker(concurrency=1, poll_interval=0.02)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        result = cli("start", "greet", "--app", APP, "--db", db, "--input", '{"name": "ada"}', "--wait",
                     "--timeout", "20")
    finally:
        worker.stop()
        thread.join()
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"greeting": "HELLO ADA!", "tenant": "default"}
    assert result.stderr.startswith("started run ")


def test_start_wait_times_out_without_a_worker(db: str) -> None:
    result = cli("start", "greet", "--app", APP, "--db", db, "--input", '{"name": "ada"}', "--wait",
                 "--timeout", "0.2")
    assert result.exit_code == 1
    started, error = result.stderr.splitlines()  # the id first, so the run can be found later
    assert started.startswith("started run ")
    assert error.startswith(f"error: run '{started.split()[2]}' is still pending after 0.2s")
    assert "is a worker running?" in error


# -- cancel and retry ---------------------------------------------------------------------------


def test_cancel(db: str, app: cairn.App) -> None:
    run_id = start(db, "slow", "--input", "{}")
    result = cli("cancel", run_id, "--reason", "not needed", "--db", db)
    assert result.exit_code == 0
    assert "cancelled run" in result.stdout
    record = app.get_run(run_id)
    assert record.status is RunStatus.CANCELLED
    assert record.error == {"type": "Cancelled", "message": "not needed"}
    assert cli("cancel", run_id, "--db", db).stdout.startswith(f"run {run_id} was already cancelled")


def test_cancel_a_completed_run_is_refused(db: str, app: cairn.App) -> None:
    run_id = start(db, "greet", "--input", '{"name": "ada"}')
    app.resume(run_id)
    check_error(cli("cancel", run_id, "--db", db), 1, "is completed")
    assert app.get_run(run_id).status is RunStatus.COMPLETED


def test_retry_resumes_from_the_failed_step(db: str, app: cairn.App, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    run_id = start(db, "flaky", "--input", json.dumps({"flag": str(flag)}))
    with pytest.raises(cairn.RunFailed):
        app.resume(run_id)
    check_error(cli("retry", start(db, "greet", "--input", '{"name": "x"}'), "--db", db), 1,
                "only failed or quarantined")
    flag.touch()
    result = cli("retry", run_id, "--db", db)
    assert result.exit_code == 0, result.stderr
    assert "from position 1" in result.stdout
    assert app.get_run(run_id).status is RunStatus.PENDING
    assert app.resume(run_id) == "flag found"
    shouts = [e for e in app.history(run_id) if e.event is EventType.STEP_COMPLETED and e.name == "shout"]
    assert len(shouts) == 1  # the good step before the failure was not run again


# -- the worker process -------------------------------------------------------------------------


def _wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout * SLACK  # (timeout: a quiet machine's)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


@pytest.mark.slow
def test_worker_executes_runs_and_drains_on_sigterm(db: str, app: cairn.App) -> None:
    greeting = app.start("greet", "ada")
    app.set_queue("default", concurrency=3, rate="50/min")
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn", "worker", "--app", APP, "--db", db, "--worker-id", "w-test",
         "--lease", "5", "--poll", "0.05", "--concurrency", "2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert greeting.result(timeout=30) == {"greeting": "HELLO ADA!", "tenant": "default"}
        slow = app.start("slow", n=3, seconds=1.0)
        _wait_for(lambda: any(e.event is EventType.STEP_COMPLETED for e in app.history(slow.run_id)))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    banner = out.splitlines()[0]
    for fragment in ("w-test", "greet", "slow", "concurrency 2", "lease 5s", "poll 0.05s"):
        assert fragment in banner
    assert out.splitlines()[1] == f"  database: SQLite {Path(db.removeprefix('sqlite://')).resolve()}"
    assert out.splitlines()[2] == "  queue default: concurrency 3, rate 50/min"
    assert f"run {greeting.run_id} (greet) completed" in err
    assert "draining" in err
    # Drained, not abandoned: the step in progress finished and the run was handed back at once.
    assert app.get_run(slow.run_id).status is RunStatus.PENDING
    assert EventType.RUN_RELEASED in [e.event for e in app.history(slow.run_id)]
    assert app.resume(slow.run_id) == [0, 1, 2]
    positions = [e.position for e in app.history(slow.run_id) if e.event is EventType.STEP_COMPLETED]
    assert positions == [0, 1, 2]


# -- the demo -----------------------------------------------------------------------------------


def _steps(*kinds: str) -> list[JournalStep]:
    return [JournalStep(i, kind, f"s{i}", "w") for i, kind in enumerate(kinds)]


def _effects(*pids_per_position: tuple[int, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for position, pids in enumerate(pids_per_position):
        out += [{"position": position, "pid": pid, "at": position + i / 10} for i, pid in enumerate(pids)]
    return out


WORKERS = {1: "w1", 2: "w2"}


def test_verdict_allows_the_step_in_flight_at_the_kill() -> None:
    effects = _effects((), (1,), (1, 2))
    verdict = judge(_steps("uuid", "step", "step"), effects, WORKERS, 1, RunStatus.COMPLETED)
    assert verdict.ok
    assert verdict.repeated == 2
    assert "except #2 s2" in verdict.message


@pytest.mark.parametrize(
    ("effects", "status", "problem"),
    [
        (_effects((), (1, 2), (2,)), RunStatus.COMPLETED, None),  # fine: the in-flight step
        (_effects((), (2, 2), (2,)), RunStatus.COMPLETED, "#1 s1 ran 2 times"),  # repeated by a live worker
        (_effects((), (1, 2), (1, 2)), RunStatus.COMPLETED, "ran 2 times"),  # two repeats
        (_effects((), (1, 2, 2), (2,)), RunStatus.COMPLETED, "ran 3 times"),
        (_effects((), (), (2,)), RunStatus.COMPLETED, "left no effect"),
        (_effects((), (1,), (2,), (2,)), RunStatus.COMPLETED, "no completed journal entry"),
        (_effects((), (1,), (2,)), RunStatus.FAILED, "ended failed"),
    ],
)
def test_verdict_catches_repeated_or_missing_effects(
    effects: list[dict[str, Any]], status: RunStatus, problem: str | None
) -> None:
    verdict = judge(_steps("uuid", "step", "step"), effects, WORKERS, 1, status)
    assert verdict.ok is (problem is None)
    if problem is not None:
        assert problem in verdict.message


def test_demo_corpus_ships_with_the_package(db: str) -> None:
    from cairn.demo import agent  # builds its App from $CAIRN_DB: the db fixture keeps it in tmp_path

    names = agent.corpus_names()
    assert 4 <= len(names) <= 6
    assert all(agent.corpus().joinpath(n).read_text(encoding="utf-8").strip() for n in names)


@pytest.mark.slow
def test_demo_end_to_end(tmp_path: Path) -> None:
    db_file = tmp_path / "demo.db"
    done = subprocess.run([sys.executable, "-m", "cairn", "demo", "--db", str(db_file)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: OK" in done.stdout
    assert "SIGKILL" in done.stdout
    # Re-check from the raw effects log, independently of the demo's own verdict.
    effects = [json.loads(line) for line in (tmp_path / "demo.effects.jsonl").read_text().splitlines()]
    counts = Counter(e["position"] for e in effects)
    assert len({e["pid"] for e in effects}) == 2  # two worker processes did the work
    assert sorted(counts.values())[:-1] == [1] * (len(counts) - 1)
    assert max(counts.values()) <= 2
    assert len(list((tmp_path / "demo-reports").glob("report-*.md"))) == 1
    for pid in {e["pid"] for e in effects}:  # both workers are gone (killed, or drained and reaped)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
def test_demo_stops_its_workers_when_terminated(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "cairn", "demo", "--db", str(tmp_path / "demo.db")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (tmp_path / "demo.effects.jsonl").exists())  # a worker is executing steps
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM
    lines = (tmp_path / "demo.effects.jsonl").read_text().splitlines()
    for pid in {json.loads(line)["pid"] for line in lines}:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
