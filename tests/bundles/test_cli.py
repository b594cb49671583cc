"""``cairn bundles``, ``replay-check``, ``migrate``, ``export``: what they print,
and bad input as one line with exit status 2 (nothing written)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import cairn
from cairn.cli.main import main
from cairn.store.records import EventType
from tests.bundles import apps

APP = "tests.bundles.cliapp:app"


@pytest.fixture(autouse=True)
def _fresh_module() -> Iterator[None]:
    sys.modules.pop("tests.bundles.cliapp", None)
    yield
    sys.modules.pop("tests.bundles.cliapp", None)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    return url


@pytest.fixture
def v1_run(db: str) -> Iterator[tuple[cairn.App, str]]:
    app = apps.serving_v1(db)
    handle = app.start("order", 1, 30.0)
    app.worker(poll_interval=0.02).run(install_signals=False, max_idle=0.2)  # to its timer
    yield app, handle.run_id
    app.close()


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "200"})


def bad(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.output, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_bundles_lists_each_bundle_with_its_runs(db: str, v1_run: tuple[cairn.App, str]) -> None:
    app, run_id = v1_run
    bundle = app.get_run(run_id).bundle
    assert bundle is not None
    listed = cli("bundles", "--db", db)
    assert listed.exit_code == 0, listed.stderr
    assert bundle in listed.stdout
    assert "1 suspended" in listed.stdout
    [view] = json.loads(cli("bundles", "--db", db, "--json").stdout)
    assert view["bundle_id"] == bundle
    assert view["runs"] == {"suspended": 1}
    assert view["prompts"] == ["greeting"]


def test_replay_check_migrate_and_export(db: str, v1_run: tuple[cairn.App, str]) -> None:
    app, run_id = v1_run
    v2 = apps.serving_v2(db)
    try:
        target = v2.runtime.registry.local()[("order", "2")].bundle_id
        v1_bundle = app.get_run(run_id).bundle
        checked = cli("replay-check", run_id, "--app", APP, "--db", db)  # against v2, the newest
        assert checked.exit_code == 1, checked.stderr
        assert "diverges at position 0: recorded step 'mark'" in checked.stdout  # other arguments
        same = cli("replay-check", run_id, "--app", APP, "--db", db, "--bundle", str(v1_bundle), "--json")
        assert same.exit_code == 0, same.stderr
        assert json.loads(same.stdout)["compatible"] is True
        refused = cli("migrate", run_id, "--to", target, "--app", APP, "--db", db)
        assert refused.exit_code == 1
        assert "not migrated" in refused.stderr
        assert app.get_run(run_id).bundle == v1_bundle
        moved = cli("migrate", run_id, "--to", target, "--app", APP, "--db", db, "--force",
                    "--reason", "CVE-2026-0002")
        assert moved.exit_code == 0, moved.stderr
        assert f"migrated to bundle {target}" in moved.stdout
        assert "forced" in moved.stdout
        [entry] = [e for e in app.history(run_id) if e.event is EventType.RUN_MIGRATED]
        assert entry.detail is not None
        assert str(entry.detail["actor"]).startswith("cli:")
        assert entry.detail["reason"] == "CVE-2026-0002"
        assert entry.detail["from_bundle"] == v1_bundle
        assert entry.detail["to_bundle"] == target
        exported = cli("export", run_id, "--db", db)
        assert exported.exit_code == 0, exported.stderr
        document = json.loads(exported.stdout)
        assert document["format"] == "cairn.run/1"
        assert document["run"]["bundle"] == target
    finally:
        v2.close()


def test_replay_check_exit_status_1_on_divergence(db: str, tmp_path: Path) -> None:
    app = apps.serving_both(db)
    try:
        handle = app.start("order", 1, 0.0, version="2")
        app.worker(poll_interval=0.02).run(install_signals=False, max_idle=0.2)
        assert handle.result(timeout=5).startswith("v2")
        v1_bundle = app.runtime.registry.local()[("order", "1")].bundle_id
    finally:
        app.close()
    result = cli("replay-check", handle.run_id, "--app", APP, "--db", db, "--bundle", v1_bundle)
    assert result.exit_code == 1
    assert "diverges at position" in result.stdout
    refused = cli("migrate", handle.run_id, "--to", v1_bundle, "--app", APP, "--db", db)
    assert refused.exit_code == 1
    assert "completed and will not run again" in refused.stderr


@pytest.mark.parametrize(("args", "fragments"), [
    (["replay-check", "no-such-run", "--app", APP], ["no run with id 'no-such-run'"]),
    (["replay-check", "RUN", "--app", APP, "--bundle", "bnope"], ["bundle 'bnope' is not served"]),
    (["replay-check", "RUN"], ["--app"]),
    (["replay-check", "--app", APP], ["RUN..."]),
    (["migrate", "RUN", "--app", APP], ["--to"]),
    (["migrate", "RUN", "--to", "bnope", "--app", APP], ["bundle 'bnope' is not served"]),
    (["migrate", "no-such-run", "--to", "bnope", "--app", APP], ["no run with id 'no-such-run'"]),
    (["migrate", "RUN", "--to", "bnope", "--app", APP, "--force"], ["--force needs --reason"]),
    (["migrate", "RUN", "--to", "bnope", "--app", APP, "--force", "--reason", " "],
     ["--force needs --reason"]),
    (["migrate", "RUN", "--to", "bnope", "--app", APP, "--reason", "x"], ["--reason is for --force"]),
    (["migrate", "RUN", "--to", "b", "--app", "no_such_module:app"], ["no module named"]),
    (["export", "no-such-run"], ["no run with id 'no-such-run'"]),
    (["export"], ["RUN"]),
    (["bundles", "--bogus"], ["--bogus"]),
])
def test_bad_input_is_one_line_and_exit_2(
    db: str, v1_run: tuple[cairn.App, str], args: list[str], fragments: list[str]
) -> None:
    app, run_id = v1_run
    before = app.history(run_id)
    bad(cli(*[run_id if a == "RUN" else a for a in args], "--db", db), *fragments)
    assert app.history(run_id) == before


def test_show_names_the_bundle_a_waiting_run_needs(db: str) -> None:
    app = apps.serving_v1(db)
    try:
        run_id = app.start("order", 0, 0.0).run_id  # no worker has ever served it
        bundle = app.get_run(run_id).bundle
    finally:
        app.close()
    shown = cli("show", run_id, "--db", db)
    assert shown.exit_code == 0, shown.stderr
    assert f"waiting for a worker serving bundle {bundle} (order version 1; never served)" in shown.stdout
    as_json = json.loads(cli("show", run_id, "--db", db, "--json").stdout)
    assert as_json["bundle"] == bundle
    assert "waiting for a worker serving bundle" in as_json["waiting"]
