"""``cairn db status``, ``cairn db migrate`` and ``cairn prune``, in process."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import cairn
from cairn.cli.main import main, parse_duration
from cairn.errors import ConfigError, RunFailed
from cairn.store import open_store
from cairn.store.records import RunStatus
from cairn.store.sqlfiles import load_migrations
from tests.cli.workflows import build_app

SQLITE = load_migrations("sqlite")
POSTGRES = load_migrations("postgres")


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "200"})


def check_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def _database_at(path: Path, version: int) -> None:
    """A SQLite database an older Cairn left at schema ``version``."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                 "applied_at REAL NOT NULL)")
    for migration in SQLITE[:version]:
        conn.executescript(migration.sql)
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (migration.version, migration.name))
    conn.close()


def _versions(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    finally:
        conn.close()


# -- cairn db ---------------------------------------------------------------------------------


def test_status_shows_pending_migrations_without_applying_them(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _database_at(path, 1)
    result = cli("db", "status", "--db", f"sqlite:///{path}")
    assert result.exit_code == 0, result.stderr
    pending = ", ".join(f"{m.version} {m.name}" for m in SQLITE[1:])
    assert f"schema version: 1 (this Cairn's latest: {len(SQLITE)})" in result.stdout
    assert f"pending migrations ({len(SQLITE) - 1}): {pending}" in result.stdout
    assert "cairn db migrate" in result.stdout
    assert _versions(path) == [1]


def test_migrate_applies_what_is_missing_then_is_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _database_at(path, 1)
    url = f"sqlite:///{path}"
    result = cli("db", "migrate", "--db", url)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [*(f"applied migration {m.version} {m.name}" for m in SQLITE[1:]),
                     f"schema version {len(SQLITE)}"]
    assert _versions(path) == [m.version for m in SQLITE]
    again = cli("db", "migrate", "--db", url)
    assert again.exit_code == 0, again.stderr
    assert again.stdout == f"up to date (schema version {len(SQLITE)})\n"
    status = cli("db", "status", "--db", url)
    assert status.stdout.splitlines()[-1] == "up to date"


def test_migrate_creates_a_new_database(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "new.db"
    result = cli("--db", f"sqlite:///{path}", "db", "migrate")  # --db before the command works too
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"applied migration 1 {SQLITE[0].name}"
    assert _versions(path) == [m.version for m in SQLITE]


def test_status_of_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    check_error(cli("db", "status", "--db", str(path)), 1, "no database at")
    assert not path.exists()


def test_status_of_a_database_from_a_newer_cairn(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    open_store(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', 0)")
    conn.close()
    result = cli("db", "status", "--db", str(path))
    assert result.exit_code == 0, result.stderr
    assert "schema version: 999" in result.stdout
    assert "upgrade Cairn" in result.stdout


@pytest.mark.parametrize("command", ["status", "migrate"])
def test_db_commands_refuse_a_memory_store(command: str) -> None:
    check_error(cli("db", command, "--db", "memory://"), 2, "memory://")


def test_db_commands_refuse_an_unknown_scheme() -> None:
    check_error(cli("db", "status", "--db", "mysql://x/y"), 1, "unsupported database URL scheme 'mysql'")


def test_a_libpq_connection_string_is_refused_not_opened_as_a_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``host=... dbname=...`` is PostgreSQL's keyword form; taken as a plain
    path it silently created a SQLite file of that name (a test whose
    PostgreSQL cases ran on SQLite). Refused, nothing created."""
    monkeypatch.chdir(tmp_path)
    conninfo = "user=postgres dbname=cairn host=127.0.0.1 port=5432"
    check_error(cli("db", "status", "--db", conninfo), 1, "looks like a PostgreSQL connection string")
    with pytest.raises(ConfigError, match="postgresql://"):
        cairn.App(db=conninfo)
    assert list(tmp_path.iterdir()) == []
    other = cairn.App(db="plain=name.db")  # any other file name is still a file
    other.close()
    assert (tmp_path / "plain=name.db").exists()


def test_db_commands_on_postgres_with_a_schema() -> None:
    """``?schema=`` picks the schema, as everywhere else; status changes nothing."""
    from tests.store.pg import ServerUnavailable, TestDatabases, skip_requested

    if skip_requested():
        pytest.skip("CAIRN_SKIP_POSTGRES is set")
    databases = TestDatabases(ahead=1)
    try:
        databases.start()
    except ServerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        with databases.database() as conninfo:
            from psycopg.conninfo import conninfo_to_dict

            params = conninfo_to_dict(conninfo)
            url = (f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
                   "?schema=fresh")
            before = cli("db", "status", "--db", url)
            assert before.exit_code == 0, before.stderr
            assert "(postgres)" in before.stdout
            assert f"schema version: 0 (this Cairn's latest: {len(POSTGRES)})" in before.stdout
            assert f"pending migrations ({len(POSTGRES)})" in before.stdout
            assert "schema version: 0" in cli("db", "status", "--db", url).stdout  # still nothing applied
            migrated = cli("db", "migrate", "--db", url)
            assert migrated.exit_code == 0, migrated.stderr
            assert migrated.stdout.splitlines()[-1] == f"schema version {len(POSTGRES)}"
            assert cli("db", "status", "--db", url).stdout.splitlines()[-1] == "up to date"
            assert cli("db", "migrate", "--db", url).stdout.startswith("up to date")
            scoped = cli("db", "status", "--db", f"{url}&tenant=acme")  # Cairn's parameter, not libpq's
            assert scoped.exit_code == 0, scoped.stderr
            assert scoped.stdout.splitlines()[-1] == "up to date"
    finally:
        databases.close()


# -- cairn prune -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 7 * 86400), ("12h", 12 * 3600), ("30m", 1800), ("90s", 90), ("2w", 14 * 86400),
     ("1d12h", 36 * 3600), ("1.5h", 5400), ("0s", 0), (" 7D ", 7 * 86400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "d", "7x", "-1d", "7 d", "", "1d-2h", "1e3s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_duration(text)


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


def _finished_runs(app: cairn.App, flag: Path) -> dict[str, str]:
    """Two completed runs, one failed, one pending; returns run id -> status."""
    for name in ("ann", "bob"):
        app.run("greet", name, run_id=f"greet-{name}")
    with pytest.raises(RunFailed):
        app.run("flaky", str(flag), run_id="flaky-1")
    app.start("greet", "later", run_id="pending-1")
    return {r.run_id: r.status.value for r in app.list_runs()}


def test_prune_dry_run_then_prune(db: str, app: cairn.App, tmp_path: Path) -> None:
    assert _finished_runs(app, tmp_path / "no-flag") == {
        "greet-ann": "completed", "greet-bob": "completed", "flaky-1": "failed", "pending-1": "pending"}
    time.sleep(0.01)
    dry = cli("prune", "--older-than", "0s", "--dry-run", "--db", db)
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.startswith("would prune 3 runs (completed, failed or cancelled")
    assert len(app.list_runs()) == 4
    recent = cli("prune", "--older-than", "1h", "--db", db)
    assert recent.stdout.startswith("pruned 0 runs")
    only_failed = cli("prune", "--older-than", "0s", "--status", "failed", "--db", db)
    assert only_failed.exit_code == 0, only_failed.stderr
    assert only_failed.stdout.startswith("pruned 1 run (failed, last changed more than 0s ago)")
    assert sorted(r.run_id for r in app.list_runs()) == ["greet-ann", "greet-bob", "pending-1"]
    rest = cli("prune", "--older-than", "0s", "--db", db)
    assert rest.stdout.startswith("pruned 2 runs")
    assert [r.run_id for r in app.list_runs()] == ["pending-1"]
    assert app.history("pending-1")  # the live run and its history are untouched


def test_prune_takes_terminal_statuses_only(db: str, app: cairn.App) -> None:
    check_error(cli("prune", "--older-than", "1d", "--status", "running", "--db", db), 2, "--status")


@pytest.mark.parametrize("duration", ["7", "soon", "-1d"])
def test_prune_refuses_a_bad_duration(db: str, app: cairn.App, duration: str) -> None:
    check_error(cli("prune", "--older-than", duration, "--db", db), 2, "--older-than", "not a duration")


def test_prune_needs_older_than(db: str, app: cairn.App) -> None:
    check_error(cli("prune", "--db", db), 2, "--older-than")


def test_prune_of_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    check_error(cli("prune", "--older-than", "1d", "--db", str(path)), 1, "no database at")
    assert not path.exists()


def test_app_prune_in_batches(app: cairn.App) -> None:
    for i in range(5):
        app.run("greet", f"n{i}", run_id=f"r{i}")
    time.sleep(0.01)
    assert app.prune(3600) == 0
    assert app.prune(0, dry_run=True) == 5
    assert app.prune(0, batch_size=2) == 5
    assert app.list_runs() == []
    with pytest.raises(ValueError, match="negative"):
        app.prune(-1)
    with pytest.raises(ValueError, match="running"):
        app.prune(0, statuses=[RunStatus.RUNNING])


def test_app_prune_deletes_artifacts_of_pruned_runs(tmp_path: Path) -> None:
    """A result above the inline limit lives in an artifact file; pruning
    the run queues the file, and it goes once the grace period has passed."""
    from cairn.store.contract import ARTIFACT_GRACE_SECONDS

    application = build_app(f"sqlite:///{tmp_path / 'a.db'}", inline_limit=64)
    try:
        application.run("big", 1000, run_id="big-1")
        files = [f for f in (tmp_path / "a.db.artifacts").rglob("*") if f.is_file() and f.name != ".lock"]
        assert files
        assert application.prune(0) == 1
        assert all(f.exists() for f in files)  # stored moments ago: within the grace period
        later = time.time() + 2 * ARTIFACT_GRACE_SECONDS
        application.store.clock = lambda: later  # type: ignore[attr-defined]
        assert application.prune(0) == 0
        assert not any(f.exists() for f in files)
    finally:
        application.close()
