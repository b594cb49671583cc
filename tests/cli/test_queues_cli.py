"""``cairn queues``: list, set and clear queue limits, in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import cairn
from cairn.cli.main import main
from cairn.store.admission import QueueLimits, QueueShare, Rate
from tests.cli.test_db_cli import check_error
from tests.cli.workflows import build_app


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert cli("db", "migrate", "--db", url).exit_code == 0
    return url


def test_set_list_and_clear(db: str) -> None:
    result = cli("queues", "set", "emails", "--concurrency", "10", "--tenant-concurrency", "2",
                 "--rate", "100/min", "--tenant-rate", "5/30s", "--tenant-burst", "1", "--db", db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ("queue emails: concurrency 10, 2 per tenant, rate 100/min, "
                             "rate 5/30s (burst 1) per tenant\n")
    app = build_app(db)
    try:
        _three_runs(app)
        listed = json.loads(cli("queues", "--json", "--db", db).stdout)
        assert listed == [
            {"queue": "default", "running": 0, "runnable": 1, "concurrency": None, "tenant_concurrency": None,
             "rate": None, "tenant_rate": None},
            {"queue": "emails", "running": 0, "runnable": 2, "concurrency": 10, "tenant_concurrency": 2,
             "rate": {"limit": 100, "period": 60.0, "burst": 100},
             "tenant_rate": {"limit": 5, "period": 30.0, "burst": 1}},
        ]
        table = cli("queues", "list", "--db", db).stdout.splitlines()
        assert table[0].split() == ["queue", "running", "runnable", "limits"]
        assert table[2].split()[:3] == ["emails", "0", "2"]
        # set replaces every limit
        assert cli("queues", "set", "emails", "--concurrency", "1", "--db", db).exit_code == 0
        assert [s.limits for s in app.queues()][1] == QueueLimits("emails", concurrency=1)
        assert cli("queues", "clear", "emails", "--db", db).stdout == "queue emails: unlimited\n"
        assert [s.limits for s in app.queues()][1] == QueueLimits("emails")
    finally:
        app.close()


def _three_runs(app: cairn.App) -> None:
    """Two runs in queue emails and one in default, none claimed."""
    app.start("greet", "a", queue="emails")
    app.start("greet", "b", queue="emails", tenant="other")
    app.start("greet", "c")


def test_share_sets_lists_and_removes_a_tenants_own_cap(db: str) -> None:
    result = cli("queues", "share", "emails", "--tenant", "acme", "--concurrency", "3", "--db", db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "queue emails, tenant acme: at most 3 running\n"
    other = cli("queues", "share", "emails", "--tenant", "globex", "--concurrency", "1", "--db", db)
    assert other.exit_code == 0
    listed = json.loads(cli("queues", "shares", "--json", "--tenant", "acme", "--db", db).stdout)
    assert listed == [{"queue": "emails", "tenant": "acme", "concurrency": 3, "rate": None}]
    removed = cli("queues", "share", "emails", "--tenant", "acme", "--db", db)
    assert removed.stdout == "queue emails, tenant acme: no cap of its own\n"
    app = cairn.App(db=db)
    try:
        assert app.operator.queue_shares() == [QueueShare("emails", "globex", 1)]
        assert app.set_queue_share("q", "acme", concurrency=2) == QueueShare("q", "acme", 2)
    finally:
        app.close()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("share", "q", "--tenant", "acme", "--concurrency", "0"), ("--concurrency", "0")),
        (("share", "q", "--tenant", "acme", "--concurrency", "-2"), ("--concurrency",)),
        (("share", "q", "--tenant", "acme", "--concurrency", "\u0663"), ("--concurrency",)),
        (("share", "q", "--concurrency", "1"), ("--tenant",)),
        (("share", "q", "--tenant", "", "--concurrency", "1"), ("needs a tenant",)),
        (("share", "", "--tenant", "acme", "--concurrency", "1"), ("non-empty name",)),
        (("share", "q", "--tenant", "acme", "--rate", "0/m"), ("--rate", "at least 1 claim")),
        (("share", "q", "--tenant", "acme", "--rate", "abc"), ("--rate", "not COUNT/PERIOD")),
        (("share", "q", "--tenant", "acme", "--rate", "1/0s"), ("--rate", "positive number of seconds")),
        (("share", "q", "--tenant", "acme", "--burst", "2"), ("--burst needs --rate",)),
        (("share", "q", "--tenant", "acme", "--rate", "2/s", "--burst", "0"), ("--burst",)),
    ],
)
def test_bad_share_input_is_one_line_and_changes_nothing(
    db: str, args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    check_error(cli("queues", *args, "--db", db), 2, *fragments)
    assert json.loads(cli("queues", "shares", "--json", "--db", db).stdout) == []


def test_app_set_queue_takes_text_or_rate(db: str) -> None:
    app = cairn.App(db=db)
    try:
        assert app.set_queue("q", rate="3/s") == QueueLimits("q", rate=Rate(3, 1.0))
        assert app.set_queue("q", tenant_rate=Rate(1, 5, burst=2)).tenant_rate == Rate(1, 5, burst=2)
        assert [s.limits for s in app.queues()] == [QueueLimits("q", tenant_rate=Rate(1, 5, burst=2))]
    finally:
        app.close()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("set", "q"), ("give at least one limit", "cairn queues clear q")),
        (("set", "q", "--rate", "lots"), ("'--rate'", "not COUNT/PERIOD")),
        (("set", "q", "--tenant-rate", "0/s"), ("'--tenant-rate'", "at least 1")),
        (("set", "q", "--burst", "3", "--concurrency", "1"), ("--burst needs --rate",)),
        (("set", "q", "--concurrency", "0"), ("--concurrency", "0")),
        (("set", "q", "--tenant-concurrency", "\u0663"), ("--tenant-concurrency", "whole number")),
        (("set", "", "--concurrency", "1"), ("non-empty name",)),
        (("clear", ""), ("non-empty name",)),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    db: str, args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    check_error(cli("queues", *args, "--db", db), 2, *fragments)
    assert json.loads(cli("queues", "--json", "--db", db).stdout) == []


def test_missing_database_is_an_error_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    check_error(cli("queues", "--db", f"sqlite:///{missing}"), 1)
    assert not missing.exists()


def test_start_puts_a_run_in_a_queue_with_a_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'start.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    app = build_app(url)
    try:
        result = cli("start", "greet", "--app", "tests.cli.sample_app:app", "--db", url, "--input", '["ada"]',
                     "--queue", "emails", "--priority", "7", "--tenant", "acme")
        assert result.exit_code == 0, result.stderr
        record = app.get_run(result.stdout.strip())
        assert record is not None
        assert (record.queue, record.priority, record.tenant) == ("emails", 7, "acme")
        for option in ("--queue", "--tenant"):
            bad = cli("start", "greet", "--app", "tests.cli.sample_app:app", "--db", url, "--input", '["x"]',
                      option, "")
            check_error(bad, 1, "non-empty")
        assert len(app.list_runs()) == 1  # the refused starts created nothing
    finally:
        app.close()


def test_share_sets_lists_and_removes_a_tenants_own_rate(db: str) -> None:
    result = cli("queues", "share", "emails", "--tenant", "acme", "--concurrency", "3", "--rate", "10/min",
                 "--db", db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "queue emails, tenant acme: at most 3 running, at most 10/min claims\n"
    assert cli("queues", "share", "emails", "--tenant", "globex", "--rate", "5/30s", "--burst", "1",
               "--db", db).exit_code == 0
    listed = json.loads(cli("queues", "shares", "--json", "--db", db).stdout)
    assert listed == [
        {"queue": "emails", "tenant": "acme", "concurrency": 3,
         "rate": {"limit": 10, "period": 60.0, "burst": 10}},
        {"queue": "emails", "tenant": "globex", "concurrency": None,
         "rate": {"limit": 5, "period": 30.0, "burst": 1}},
    ]
    text = cli("queues", "shares", "--tenant", "globex", "--db", db).stdout
    assert text == "queue emails, tenant globex: at most 5/30s (burst 1) claims\n"
    cli("queues", "share", "emails", "--tenant", "acme", "--concurrency", "3", "--db", db)  # rate removed
    app = cairn.App(db=db)
    try:
        assert app.operator.queue_shares("acme") == [QueueShare("emails", "acme", 3)]
        assert app.set_queue_share("q", "acme", rate="10/min") == QueueShare("q", "acme", None, Rate(10, 60))
        assert app.operator.queue_shares("acme")[1] == QueueShare("q", "acme", rate=Rate(10, 60))
    finally:
        app.close()


def test_a_share_rate_above_the_installations_is_refused_in_one_line(db: str) -> None:
    assert cli("queues", "set", "emails", "--tenant-rate", "5/min", "--db", db).exit_code == 0
    refused = cli("queues", "share", "emails", "--tenant", "acme", "--rate", "10/min", "--db", db)
    check_error(refused, 2, "--rate", "exceeds the installation's per-tenant rate 5/min")
    assert json.loads(cli("queues", "shares", "--json", "--db", db).stdout) == []
    assert cli("queues", "share", "emails", "--tenant", "acme", "--rate", "5/min", "--db", db).exit_code == 0
