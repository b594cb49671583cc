"""Bad input at the command line (issue 9, item 15): one line naming the
problem, a non-zero exit, no traceback, nothing written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main
from cairn.store.records import RunStatus
from tests.cli.test_cli import APP, _fresh_app_modules, assert_one_line_error, cli  # noqa: F401
from tests.cli.workflows import build_app


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    cairn.App(url).close()
    return url


@pytest.fixture
def app(db: str) -> Iterator[cairn.App]:
    application = build_app(db)
    yield application
    application.close()


def _runs(app: cairn.App) -> list[str]:
    return [r.run_id for r in app.list_runs()]


def test_empty_run_id_is_an_error(db: str, app: cairn.App) -> None:
    result = cli("start", "greet", "--app", APP, "--db", db, "--input", '{"name": "ada"}', "--run-id", "")
    assert_one_line_error(result.exit_code, result.stderr, 1)
    assert "run id" in result.stderr
    assert _runs(app) == []  # before: '' silently became a generated id


@pytest.mark.parametrize("text", ['{"name": NaN}', '{"name": Infinity}', '[-Infinity]'])
def test_nan_and_infinity_in_input_are_refused(db: str, app: cairn.App, text: str) -> None:
    result = cli("start", "big", "--app", APP, "--db", db, "--input", text)
    assert_one_line_error(result.exit_code, result.stderr, 2)
    assert "not a JSON number" in result.stderr
    assert _runs(app) == []


def test_input_from_a_file_and_from_stdin(db: str, app: cairn.App, tmp_path: Path) -> None:
    name = "x" * 300_000  # far beyond what a command line holds comfortably
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"name": name}))
    from_file = cli("start", "greet", "--app", APP, "--db", db, "--input", f"@{path}")
    assert from_file.exit_code == 0, from_file.stderr
    run_id = from_file.stdout.strip()
    assert app.resume(run_id)["greeting"] == f"HELLO {name.upper()}!"
    from_stdin = CliRunner().invoke(main, ["start", "greet", "--app", APP, "--db", db, "--input", "-"],
                                    input=json.dumps({"name": "ada"}))
    assert from_stdin.exit_code == 0, from_stdin.stderr
    assert app.resume(from_stdin.stdout.strip())["greeting"] == "HELLO ADA!"


def test_unreadable_input_file_is_one_line(db: str, app: cairn.App, tmp_path: Path) -> None:
    result = cli("start", "greet", "--app", APP, "--db", db, "--input", f"@{tmp_path / 'missing.json'}")
    assert_one_line_error(result.exit_code, result.stderr, 2)
    assert "missing.json" in result.stderr
    assert "No such file" in result.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    result = cli("start", "greet", "--app", APP, "--db", db, "--input", f"@{bad}")
    assert_one_line_error(result.exit_code, result.stderr, 2)
    assert "bad.json" in result.stderr
    assert _runs(app) == []


@pytest.mark.parametrize("finish", ["complete", "cancel"])
def test_budget_of_a_run_that_will_not_run_again_is_refused(db: str, app: cairn.App, finish: str) -> None:
    handle = app.start("greet", "ada")
    if finish == "complete":
        app.resume(handle.run_id)
    else:
        app.cancel(handle.run_id)
    before = app.get_run(handle.run_id)
    result = cli("budget", handle.run_id, "--db", db, "--tokens", "100")
    assert_one_line_error(result.exit_code, result.stderr, 1)
    assert "will not run again" in result.stderr
    after = app.get_run(handle.run_id)
    assert (after.budget, after.status, after.updated_at) == (before.budget, before.status, before.updated_at)
    assert after.status in (RunStatus.COMPLETED, RunStatus.CANCELLED)
