"""User text is never markup and never terminal control (issue 9, items 14 and 16).

Every name and value a user or stored data controls is made hostile at once:
rich markup that crashes the parser (``[/INST]``, ``[/]``) or restyles the
output (``[bold red]``), an OSC title change ending in BEL, a screen clear,
an 8-bit CSI and a right-to-left override; in the run id, tenant, queue,
thread, workflow, step and tool names, inputs, results and error messages.
Each command must print it literally (visible, escaped) and exit 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import Result

import cairn
from cairn.store.records import RunStatus
from tests.cli.test_cli import ROOT, cli

#: markup that raises MarkupError, markup that styles, and terminal control
HOSTILE = "[/INST] [bold red]red[/] [/] \x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil\nfake line"
#: hostile text an id may hold (``runids.check_id`` refuses control characters
#: in run ids, thread ids and queues): markup and a bidi override
HOSTILE_ID = "[/INST] [bold red]red[/] [/] \u202eevil fake line"
#: what must never reach the terminal raw
RAW_CONTROL = ("\x1b", "\x07", "\x9b", "\u202e")


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    cairn.App(url).close()  # inspection commands refuse a database that does not exist
    return url


def _assert_safe(result: Result) -> None:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    for output in (result.stdout, result.stderr):
        for raw in RAW_CONTROL:
            assert raw not in output, (raw, output)
        assert "Traceback" not in output


@pytest.fixture
def hostile(db: str) -> dict[str, str]:
    """Three runs full of hostile text, on ``db``: one completed, one failed,
    one needing attention (its write tool raised)."""
    app = cairn.App(db)

    @app.step(name=f"step {HOSTILE}")
    def echo(text: str) -> dict[str, str]:
        return {"echo": text, HOSTILE: "[bold red]value"}

    @app.step(name="boom")
    def boom(text: str) -> None:
        raise RuntimeError(text)

    @app.tool(effect="write", name=f"tool {HOSTILE}")
    def pay(amount: int) -> str:
        raise ConnectionError(HOSTILE)

    @app.workflow(name=f"wf {HOSTILE}")
    def completes(ctx: cairn.Context, text: str) -> dict[str, str]:
        return echo(text)

    @app.workflow(name="fails")
    def fails(ctx: cairn.Context, text: str) -> None:
        boom(text)

    @app.workflow(name="attention")
    def attention(ctx: cairn.Context) -> None:
        pay(1)

    ids = {"completed": f"run {HOSTILE_ID}", "failed": f"failed {HOSTILE_ID}",
           "attention": f"att {HOSTILE_ID}"}
    app.start(f"wf {HOSTILE}", HOSTILE, run_id=ids["completed"], tenant=f"tenant {HOSTILE}",
              thread_id=HOSTILE_ID, queue=f"queue {HOSTILE_ID}")
    app.start("fails", HOSTILE, run_id=ids["failed"], tenant="[/]")
    app.start("attention", run_id=ids["attention"])
    app.set_queue(f"queue {HOSTILE_ID}", concurrency=2)
    app.worker(concurrency=1, poll_interval=0.01, queues=(f"queue {HOSTILE_ID}", "default")).run(
        install_signals=False, max_idle=0.3)
    assert app.get_run(ids["completed"]).status is RunStatus.COMPLETED
    assert app.get_run(ids["failed"]).status is RunStatus.FAILED
    assert app.get_run(ids["attention"]).status is RunStatus.NEEDS_ATTENTION
    app.close()
    return ids


@pytest.mark.parametrize("columns", [80, 200])
def test_runs_prints_hostile_tenants_and_names_literally(
    db: str, hostile: dict[str, str], columns: int
) -> None:
    result = cli("runs", "--db", db, columns=columns)
    _assert_safe(result)
    assert "[/INST] [bold red]red[/] [/] \\u202eevil" in result.stdout  # an id, escaped
    assert "\\x1b]0;pwned\\x07" in result.stdout.replace("\n", "").replace(" ", "")  # a tenant, a name
    assert "[/]" in result.stdout  # the tenant that broke `cairn runs` for everyone


def test_show_prints_hostile_inputs_results_and_errors_literally(db: str, hostile: dict[str, str]) -> None:
    for run_id in hostile.values():
        result = cli("show", run_id, "--db", db)
        _assert_safe(result)
        assert "[/INST] [bold red]red[/]" in result.stdout
        assert "\\x1b]0;pwned\\x07" in result.stdout
    failed = cli("show", hostile["failed"], "--db", db)
    assert "failed: StepFailed" in failed.stdout or "RuntimeError" in failed.stdout
    # A newline in a one-line field must not forge a line of its own.
    assert not any(line.startswith("fake line") for line in failed.stdout.splitlines()[:8])


def test_events_and_ops_print_hostile_text_literally(db: str, hostile: dict[str, str]) -> None:
    for run_id in hostile.values():
        result = cli("events", run_id, "--db", db)
        _assert_safe(result)
        assert "[/INST]" in result.stdout
        assert not any(line.startswith("fake line") for line in result.stdout.splitlines())
    ops = cli("ops", hostile["attention"], "--db", db)
    _assert_safe(ops)
    assert "tool [/INST] [bold red]red[/]" in ops.stdout
    assert "\\u202eevil" in ops.stdout


def test_json_output_stays_valid_and_keeps_the_value(db: str, hostile: dict[str, str]) -> None:
    for args in (("runs", "--json"), ("show", hostile["completed"], "--json"),
                 ("events", hostile["completed"], "--json"), ("ops", hostile["attention"], "--json"),
                 ("queues", "--json")):
        result = cli(*args, "--db", db)
        _assert_safe(result)
        text = result.stdout
        values = [json.loads(line) for line in text.splitlines()] if args[0] in ("runs", "events") else [
            json.loads(text)]
        # escaped on screen, the same value decoded (a queue holds the text an id may hold)
        assert any(HOSTILE in text or HOSTILE_ID in text for text in _strings(values))


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_queues_and_errors_print_hostile_names_literally(db: str, hostile: dict[str, str]) -> None:
    result = cli("queues", "--db", db)
    _assert_safe(result)
    assert "queue [/INST] [bold red]red[/]" in result.stdout
    missing = cli("show", f"nope {HOSTILE}", "--db", db)
    assert missing.exit_code == 1
    assert len(missing.stderr.splitlines()) == 1
    for raw in RAW_CONTROL:
        assert raw not in missing.stderr


def test_runs_at_80_columns_shows_whole_ids_and_statuses(db: str) -> None:
    app = cairn.App(db)

    @app.workflow(name="research_agent_with_a_long_name")
    def research(ctx: cairn.Context) -> None:
        return None

    long_id = "0193b8a2-1c3e-7f00-9a1b-2c3d4e5f6a7b-order-2024-11-30"
    app.start("research_agent_with_a_long_name", run_id=long_id, tenant="acme-corporation-eu-west")
    other = app.start("research_agent_with_a_long_name", tenant="globex").run_id
    app.close()
    result = cli("runs", "--db", db, columns=80)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), result.stdout
    for run_id in (long_id, other):  # whole, on one line: copyable
        assert any(line.split()[:2] == [run_id, "pending"] for line in lines), result.stdout
    assert "acme-corporation-eu-west" in result.stdout


@pytest.mark.slow
def test_start_and_worker_print_the_absolute_database(tmp_path: Path) -> None:
    """``sqlite:///.cairn/cairn.db`` is relative to each command's directory:
    both commands say which file they use."""
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    command = [sys.executable, "-m", "cairn", "start", "greet", "--app", "tests.cli.sample_app:app",
               "--input", '{"name": "ada"}']
    started = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60,
                             check=False)
    assert started.returncode == 0, started.stderr
    assert f"(database: SQLite {tmp_path.resolve() / '.cairn' / 'cairn.db'})" in started.stderr


@pytest.mark.parametrize(("url", "label"), [
    ("postgresql://cairn:s3cret@db.example:5433/cairn?sslmode=require",
     "postgresql://cairn:***@db.example:5433/cairn?sslmode=require"),
    ("postgresql://cairn@db.example/cairn", "postgresql://cairn@db.example/cairn"),
    ("postgresql://u:p@[::1]:5432/x", "postgresql://u:***@[::1]:5432/x"),
])
def test_database_label_hides_the_password(url: str, label: str) -> None:
    from cairn.cli.options import database_label

    assert database_label(url) == label


def test_database_label_resolves_a_relative_sqlite_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cairn.cli.options import database_label

    monkeypatch.chdir(tmp_path)
    expected = f"SQLite {tmp_path.resolve() / '.cairn' / 'cairn.db'}"
    assert database_label("sqlite:///.cairn/cairn.db") == expected


@pytest.mark.slow
def test_worker_banner_and_log_escape_hostile_names(db: str) -> None:
    """The banner prints the worker id and queue names the command line gave,
    and its log lines carry run errors: neither may act on the terminal."""
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn", "worker", "--app", "tests.cli.sample_app:app", "--db", db,
         "--worker-id", f"w {HOSTILE}", "--queue", f"q {HOSTILE}", "--poll", "0.05"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline() + proc.stdout.readline()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "[/INST] [bold red]red[/]" in banner
    assert "\\x1b]0;pwned\\x07" in banner
    assert f"database: SQLite {Path(db.removeprefix('sqlite://')).resolve()}" in banner
    for raw in RAW_CONTROL:
        assert raw not in banner
        assert raw not in err
