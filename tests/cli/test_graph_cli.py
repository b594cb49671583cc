"""``cairn graph history|state|diff|diverge|fork|replay``: time travel from
the command line. The readers work without the graph's code (no ``--app``);
fork and replay need it; bad input is one line and exit status 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.api.operator import cli_actor
from tests.cli.graph_flows import register
from tests.cli.test_cli import assert_one_line_error, check_error, cli, run_cli

APP = "tests.cli.graph_app:app"
START = {"notes": [], "n": 0, "meta": {}}


@pytest.fixture(autouse=True)
def _fresh_app_module() -> Iterator[None]:
    sys.modules.pop("tests.cli.graph_app", None)
    yield
    sys.modules.pop("tests.cli.graph_app", None)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    return url


@pytest.fixture
def app(db: str) -> Iterator[cairn.App]:
    application = cairn.App(db=db)
    application.run(register(application), START, run_id="o")
    yield application
    application.close()


def json_of(*args: str) -> Any:
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_history_pages_newest_first(app: cairn.App, db: str) -> None:
    page = json_of("graph", "history", "o", "--limit", "2", "--json", "--db", db)
    assert [c["step"] for c in page["checkpoints"]] == [2, 1]
    assert page["checkpoints"][0]["nodes"] == ["second"]
    assert page["checkpoints"][1]["next"] == ["second"]
    assert page["next_before"] == 1
    rest = json_of("graph", "history", "o", "--before", "1", "--json", "--db", db)
    assert [c["step"] for c in rest["checkpoints"]] == [0]
    assert rest["next_before"] is None
    text = cli("graph", "history", "o", "--db", db)
    assert text.exit_code == 0, text.stderr
    assert "ran second  next END" in text.stdout


def test_state_at_a_step_as_json(app: cairn.App, db: str) -> None:
    found = json_of("graph", "state", "o", "--step", "1", "--json", "--db", db)
    assert found == {"run_id": "o", "step": 1,
                     "state": {"notes": ["first"], "n": 1, "meta": {"who": {"name": "ada"}}}}
    latest = json_of("graph", "state", "o", "--json", "--db", db)
    assert latest["step"] == 2


def test_diff_and_diverge(app: cairn.App, db: str) -> None:
    found = json_of("graph", "diff", "o", "1", "2", "--json", "--db", db)
    assert found["changes"] == [
        {"path": ["notes"], "kind": "appended", "old": None, "new": ["second n=1"]},
        {"path": ["meta", "who", "name"], "kind": "replaced", "old": "ada", "new": "grace"}]
    text = cli("graph", "diff", "o", "1", "2", "--db", db)
    assert text.stdout.splitlines()[1].startswith("meta/who/name  replaced  ")
    app.graph_fork("o", 1, update={"n": 7}, run_id="f")
    app.resume("f")
    diverged = json_of("graph", "diverge", "o", "f", "--json", "--db", db)
    assert diverged == {"run_a": "o", "run_b": "f", "step": 1}
    other = json_of("graph", "diff", "o", "2", "2", "--other", "f", "--json", "--db", db)
    assert {"path": ["n"], "kind": "replaced", "old": 1, "new": 7} in other["changes"]
    assert cli("graph", "diverge", "o", "o", "--db", db).stdout.strip() == "o and o never diverge"


def test_fork_and_replay_start_runs_with_lineage(app: cairn.App, db: str) -> None:
    started = json_of("graph", "fork", "o", "--step", "1", "--update", '{"n": 41}', "--run-id", "f",
                      "--role", "operator", "--app", APP, "--json", "--db", db)
    assert started["created"] is True
    assert started["run"]["run_id"] == "f"
    assert app.resume("f")["notes"] == ["first", "second n=41"]
    replayed = cli("graph", "replay", "o", "--step", "0", "--run-id", "r", "--app", APP, "--db", db)
    assert replayed.exit_code == 0, replayed.stderr
    assert "replayed from o at step 0" in replayed.stdout
    assert app.resume("r") == app.graph_state("o")
    shown = json_of("show", "f", "--json", "--db", db)
    assert shown["forked_from"] == {"run_id": "o", "step": 1, "edited": True}
    # the fork acts with the role it was given (cairn start --role's rule), the replay with none
    assert (shown["started_role"], shown["started_token"]) == ("operator", None)
    assert shown["started_by"]["actor"] == cli_actor()
    assert json_of("show", "r", "--json", "--db", db)["started_role"] is None
    assert "forked from o at step 1" in cli("show", "f", "--db", db).stdout


@pytest.mark.parametrize(("args", "fragments"), [
    (("graph", "state", "o", "--step", "9"), ("no checkpoint at super-step 9",)),
    (("graph", "state", "o", "--step", "-1"), ("--step",)),
    (("graph", "state", "o", "--step", "x"), ("--step", "'x'")),
    (("graph", "state", "nope"), ("no run with id 'nope'",)),
    (("graph", "history", "p"), ("not a graph run",)),
    (("graph", "diff", "o", "0", "9"), ("no checkpoint at super-step 9",)),
    (("graph", "diff", "o", "0", "1", "--other", "nope"), ("no run with id 'nope'",)),
    (("graph", "fork", "o", "--step", "1", "--update", '{"n": "x"}', "--app", APP), ("field 'n'",)),
    (("graph", "fork", "o", "--step", "1", "--update", '{"zz": 1}', "--app", APP), ("'zz' is not a field",)),
    (("graph", "fork", "o", "--step", "1", "--update", "{nope", "--app", APP), ("--update is not JSON",)),
    (("graph", "fork", "o", "--step", "1", "--update", "[1]", "--app", APP), ("JSON object",)),
    (("graph", "replay", "o", "--step", "5", "--app", APP), ("no checkpoint at super-step 5",)),
    (("graph", "replay", "p", "--step", "0", "--app", APP), ("not a graph run",)),
    (("graph", "replay", "o", "--step", "1"), ("--app",)),
])
def test_bad_input_is_one_line_and_exit_2(app: cairn.App, db: str, args: tuple[str, ...],
                                         fragments: tuple[str, ...]) -> None:
    @app.workflow
    def plain(ctx: cairn.Context) -> int:
        return 1

    app.run(plain, run_id="p")
    check_error(cli(*args, "--db", db), 2, *fragments)
    assert {r.run_id for r in app.list_runs()} == {"o", "p"}


@pytest.mark.slow
def test_the_installed_command_reads_and_refuses(app: cairn.App, db: str) -> None:
    found = run_cli("graph", "state", "o", "--step", "1", "--json", "--db", db)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["state"]["n"] == 1
    missing = run_cli("graph", "diff", "o", "0", "9", "--db", db)
    assert_one_line_error(missing.returncode, missing.stderr, 2, "no checkpoint at super-step 9")
    forked = run_cli("graph", "fork", "o", "--step", "1", "--update", '{"n": 2}', "--app", APP, "--db", db)
    assert forked.returncode == 0, forked.stderr
    assert "forked from o at step 1" in forked.stdout


def test_a_damaged_checkpoint_is_listed_as_such_and_its_state_is_one_line(app: cairn.App, db: str) -> None:
    import sqlite3

    [entry] = [e for e in app.history("o") if e.step_kind == "graph" and e.name == "step 1"]
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE history SET payload = ?, payload_ref = NULL WHERE run_id = 'o' AND seq = ?",
                     (b'{"v":1,"step":1,"nodes":["<b>x</b>"],"next":[],"versions":{"n":[7,7]}}', entry.seq))
    page = json_of("graph", "history", "o", "--json", "--db", db)
    listed = page["checkpoints"]
    assert [(c["step"], c["error"] is None) for c in listed] == [(2, True), (1, False), (0, True)]
    assert "checkpoint 1 of run 'o' is damaged: field 'n' has version [7, 7]" in listed[1]["error"]
    text = cli("graph", "history", "o", "--db", db)
    assert text.exit_code == 0, text.stderr
    assert "unreadable: checkpoint 1 of run 'o' is damaged" in text.stdout
    refused = cli("graph", "state", "o", "--step", "1", "--db", db)
    check_error(refused, 2, "checkpoint 1 of run 'o' is damaged")
    assert json_of("graph", "state", "o", "--step", "0", "--json", "--db", db)["state"] == START
