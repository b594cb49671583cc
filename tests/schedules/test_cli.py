"""``cairn schedules``: what it lists (definition, last and next tick in the
schedule's zone and UTC, JSON), user text shown as text, and bad
declarations failing at import with one line."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from psycopg.conninfo import conninfo_to_dict

import cairn
from cairn.store import open_store
from cairn.worker.scheduler import Scheduler
from tests.acceptance.harness import REPO_ROOT as ROOT
from tests.acceptance.harness import wait_until
from tests.backends import libpq_url
from tests.cli.test_cli import assert_one_line_error, check_error, cli

APP = "tests.schedules.cli_app:app"


@pytest.fixture(autouse=True)
def _fresh_module() -> Iterator[None]:
    sys.modules.pop("tests.schedules.cli_app", None)
    yield
    sys.modules.pop("tests.schedules.cli_app", None)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    monkeypatch.delenv("CAIRN_TEST_BAD_SCHEDULE", raising=False)
    open_store(url).close()
    return url


def fire_once(db: str) -> cairn.App:
    """Register the app's schedules and fire what is due, as a worker's first pass."""
    import tests.schedules.cli_app as module

    Scheduler(module.app.runtime, list(module.app.runtime.schedules.values())).run_pass()
    return module.app


def test_nothing_registered(db: str) -> None:
    result = cli("schedules", "--db", db)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "no schedule is registered" in result.stderr
    assert cli("schedules", "--db", db, "--json").stdout.strip() == "[]"


def test_declared_schedules_show_with_the_app_before_any_worker_ran(db: str) -> None:
    result = cli("schedules", "--db", db, "--app", APP)
    assert result.exit_code == 0, result.stderr
    assert "acme/morning-report: workflow report, cron '0 8 * * 1-5' in Europe/Paris, missed=once" \
        in result.stdout
    assert "last tick  - (no worker has registered it yet)" in result.stdout


def test_registered_schedules_list_without_the_app_with_next_tick_in_zone_and_utc(db: str) -> None:
    fire_once(db).close()
    result = cli("schedules", "--db", db, "--json")
    assert result.exit_code == 0, result.stderr
    views = {v["name"]: v for v in json.loads(result.stdout)}
    morning = views["morning-report"]
    assert (morning["tenant"], morning["workflow"], morning["cron"], morning["timezone"], morning["missed"]) \
        == ("acme", "report", "0 8 * * 1-5", "Europe/Paris", "once")
    assert morning["registered"] is True
    assert morning["declared"] is None
    assert morning["last_tick"] is None
    assert morning["fired"] == 0
    nxt = morning["next_tick"]
    local = datetime.fromisoformat(nxt["local"])
    assert (local.hour, local.minute, local.weekday() < 5) == (8, 0, True)
    assert datetime.fromtimestamp(nxt["epoch"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ") == nxt["utc"]
    assert local == datetime.fromtimestamp(nxt["epoch"], ZoneInfo("Europe/Paris"))
    assert nxt["epoch"] > datetime.now(UTC).timestamp()

    text = cli("schedules", "--db", db, "--tenant", "acme")
    assert text.exit_code == 0, text.stderr
    zone = "CEST" if local.dst() else "CET"
    assert f"next tick  {local:%Y-%m-%d %H:%M:%S} {zone} = " in text.stdout
    assert cli("schedules", "--db", db, "--tenant", "globex").stdout == ""


def test_the_last_tick_and_its_run_are_shown(db: str) -> None:
    app = fire_once(db)
    try:
        # one more declaration, due every second, fired by a pass two seconds on
        app.schedule("* * * * * *", "report", name="every-second", tenant="acme", kwargs={"topic": "t"},
                     tick_arg="at", grace=600)
        scheduler = Scheduler(app.runtime, list(app.runtime.schedules.values()))
        scheduler.run_pass()
        time.sleep(1.1)
        scheduler.run_pass()
    finally:
        app.close()
    views = {v["name"]: v for v in json.loads(cli("schedules", "--db", db, "--json").stdout)}
    every = views["every-second"]
    assert every["fired"] >= 1
    assert every["last_run_id"] == f"schedule:acme:every-second:{every['last_tick']['utc']}"
    text = cli("schedules", "--db", db).stdout
    assert f"run {every['last_run_id']}" in text


def test_user_text_is_shown_as_text(db: str) -> None:
    fire_once(db).close()
    result = cli("schedules", "--db", db)
    assert "acme/[red]x\\x1b[2J: workflow report" in result.stdout
    assert "\x1b" not in result.stdout
    data = json.loads(cli("schedules", "--db", db, "--json").stdout)
    assert "[red]x\x1b[2J" in {v["name"] for v in data}


@pytest.mark.parametrize(("case", "fragments"), [
    ("cron", ("schedule 'bad': invalid cron expression '0 25 * * *': Bad hour",)),
    ("zone", ("schedule 'bad': unknown time zone 'Europe/Pariss'",)),
    ("workflow", ("schedule 'bad': unknown workflow 'no-such-workflow'",)),
    ("kwargs", ("schedule 'bad': arguments do not fit workflow 'report'",)),
    ("tick_arg", ("schedule 'bad': workflow 'report' has no parameter 'when'",)),
    ("missed", ("schedule 'bad': missed must be one of 'skip', 'once', 'all', not 'sometimes'",)),
    ("twice", ("schedule 'morning-report' of tenant 'acme' is already declared",)),
])
def test_a_bad_declaration_fails_at_import_with_one_line(db: str, monkeypatch: pytest.MonkeyPatch, case: str,
                                                         fragments: tuple[str, ...]) -> None:
    monkeypatch.setenv("CAIRN_TEST_BAD_SCHEDULE", case)
    for command in (("schedules",), ("worker",)):
        result = cli(*command, "--db", db, "--app", APP)
        check_error(result, 1, *fragments)
    assert cli("schedules", "--db", db, "--json").stdout.strip() == "[]"  # nothing registered


def test_a_wrong_database_is_one_line(tmp_path: Path) -> None:
    result = cli("schedules", "--db", str(tmp_path / "missing.db"))
    assert_one_line_error(result.exit_code, result.stderr, 1, "no database at")


def _worker(db: str, *extra: str) -> subprocess.Popen[str]:
    env = {**{k: v for k, v in os.environ.items() if k != "CAIRN_DB"}, "CAIRN_TEST_FAST_SCHEDULE": "1"}
    return subprocess.Popen([sys.executable, "-m", "cairn", "worker", "--app", APP, "--db", db, *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return out, err


def _fast_runs(db: str) -> list[str]:
    data = json.loads(cli("schedules", "--db", db, "--json").stdout)
    return [v["last_run_id"] for v in data if v["name"] == "every-second" and v["fired"]]


@pytest.mark.slow
def test_cairn_worker_fires_the_schedules_and_names_them(db: str) -> None:
    process = _worker(db)
    try:
        wait_until(lambda: _fast_runs(db), 60, "the worker to fire the every-second schedule")
    finally:
        out, err = _stop(process)
    assert "  schedule acme/every-second: report, cron '* * * * * *' in UTC, missed=once" in out
    assert "  schedule acme/morning-report: report, cron '0 8 * * 1-5' in Europe/Paris, missed=once" in out
    assert "started run schedule:acme:every-second:" in err


@pytest.mark.slow
def test_cairn_worker_no_schedules_fires_none(db: str) -> None:
    process = _worker(db, "--no-schedules")
    try:
        wait_until(lambda: "schedules: 3 declared, none fired" in (process.stdout.readline() if process.stdout
                                                                   else ""), 60, "the banner")
        time.sleep(2.0)  # long enough for two ticks of the every-second schedule
    finally:
        _stop(process)
    assert cli("schedules", "--db", db, "--json").stdout.strip() == "[]"  # not even registered


def test_a_damaged_schedule_row_is_one_line_naming_it(db: str) -> None:
    fire_once(db).close()
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE schedules SET last_tick = 'soon' WHERE name = 'morning-report'")
    result = cli("schedules", "--db", db)
    check_error(result, 1, "schedule 'morning-report' of tenant 'acme' is damaged", "'soon' is not a number")


def test_cairn_schedules_on_postgresql(pg_url: str) -> None:
    url = libpq_url(pg_url, str(conninfo_to_dict(pg_url)["dbname"]))
    app = cairn.App(url)
    try:
        app.schedule("*/5 * * * *", app.workflow(name="poll")(_poll), tenant="acme", timezone="Asia/Kolkata")
        Scheduler(app.runtime, list(app.runtime.schedules.values())).run_pass()
    finally:
        app.close()
    result = cli("schedules", "--db", url, "--json")
    assert result.exit_code == 0, result.stderr
    (view,) = json.loads(result.stdout)
    assert (view["tenant"], view["name"], view["timezone"]) == ("acme", "poll", "Asia/Kolkata")
    assert view["next_tick"]["local"].endswith("+05:30")
    assert int(view["next_tick"]["epoch"]) % 300 == 0


def _poll(ctx: cairn.Context) -> None:
    return None
