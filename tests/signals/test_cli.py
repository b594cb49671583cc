"""``cairn signal``, ``cairn wait`` and what ``cairn show`` says of a waiting
run: through App and the operator, one-line errors, user text never markup."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main
from cairn.cli.signals import EXIT_COMPLETED, EXIT_FAILED, EXIT_SUSPENDED, EXIT_TIMEOUT
from cairn.store.records import RunStatus
from tests.cli.test_cli import check_error, cli
from tests.cli.test_hostile_text import HOSTILE, RAW_CONTROL
from tests.engine.conftest import execute_once


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[cairn.App]:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    monkeypatch.setenv("CAIRN_DB", url)
    application = cairn.App(url)

    @application.workflow(name="approval")
    def approval(ctx: cairn.Context) -> dict:
        return dict(ctx.wait_for_signal("approve", timeout=3600, type_=dict))

    @application.workflow(name="boom")
    def boom(ctx: cairn.Context) -> None:
        raise ValueError("no")

    yield application
    application.close()


def _waiting(app: cairn.App) -> str:
    run_id = app.start("approval").run_id
    assert execute_once(app, run_id) == "suspended"
    return run_id


def test_cairn_signal_sends_json_from_an_option_a_file_or_stdin(app: cairn.App, tmp_path: Path) -> None:
    run_id = _waiting(app)
    result = cli("signal", run_id, "approve", "--data", '{"ok": true}')
    assert result.exit_code == 0, result.stderr
    assert f"sent signal 'approve' to run {run_id} (message 1)" in result.stdout
    data = tmp_path / "data.json"
    data.write_text('{"from": "file"}')
    assert cli("signal", run_id, "approve", "--data", f"@{data}").exit_code == 0
    piped = CliRunner().invoke(main, ["signal", run_id, "approve", "--data", "-"], input='{"from": "stdin"}')
    assert piped.exit_code == 0, piped.stderr
    mailbox = app.operator.mailbox(run_id)
    assert [m.payload.data for m in mailbox if m.payload] == [b'{"ok":true}', b'{"from":"file"}',
                                                               b'{"from":"stdin"}']
    assert {m.sender for m in mailbox} == {cairn.api.operator.cli_actor()}  # the acting identity
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == {"ok": True}  # the first, in order


def test_cairn_signal_with_a_dedupe_key_sends_once(app: cairn.App) -> None:
    run_id = _waiting(app)
    assert cli("signal", run_id, "approve", "--data", "1", "--dedupe", "k").exit_code == 0
    again = cli("signal", run_id, "approve", "--data", "2", "--dedupe", "k")
    assert again.exit_code == 0
    assert "nothing more was sent" in again.stdout
    assert len(app.operator.mailbox(run_id)) == 1


def test_cairn_signal_refuses_bad_input_in_one_line(app: cairn.App, tmp_path: Path) -> None:
    run_id = _waiting(app)
    check_error(cli("signal", run_id, "approve", "--data", "{nope"), 2, "--data", "not valid JSON")
    check_error(cli("signal", run_id, "approve", "--data", "NaN"), 2, "not valid JSON")
    check_error(cli("signal", run_id, "approve", "--data", f"@{tmp_path / 'missing'}"), 2, "cannot read")
    check_error(cli("signal", "no-such-run", "approve"), 1, "no run with id 'no-such-run'")
    check_error(cli("signal", run_id, "bad\x07name"), 1, "control characters")
    done = app.start("boom").run_id
    assert execute_once(app, done) == "failed"
    check_error(cli("signal", done, "approve"), 1, "is failed: it takes no more deliveries")
    assert app.operator.mailbox(run_id) == []


def test_cairn_show_says_what_a_suspended_run_waits_for(app: cairn.App) -> None:
    run_id = _waiting(app)
    shown = cli("show", run_id)
    assert shown.exit_code == 0, shown.stderr
    assert "waiting   signal 'approve' until 20" in shown.stdout
    as_json = cli("show", run_id, "--json")
    assert '"waiting_for": "signal:approve"' in as_json.stdout


def test_cairn_wait_exit_codes_say_how_the_run_ended(app: cairn.App) -> None:
    run_id = _waiting(app)
    waited = cli("wait", run_id)
    assert waited.exit_code == EXIT_SUSPENDED, waited.stderr
    assert "waiting for signal 'approve' until" in waited.stderr
    app.signal(run_id, "approve", {"ok": 1})
    # woken but not yet claimed: it has not suspended again, so wait keeps waiting
    assert cli("wait", run_id, "--timeout", "0.3").exit_code == EXIT_TIMEOUT
    assert execute_once(app, run_id) == "completed"
    done = cli("wait", run_id)
    assert done.exit_code == EXIT_COMPLETED
    assert '"ok": 1' in done.stdout
    failed = app.start("boom").run_id
    assert execute_once(app, failed) == "failed"
    told = cli("wait", failed, "--json")
    assert told.exit_code == EXIT_FAILED
    assert '"status": "failed"' in told.stdout
    check_error(cli("wait", "no-such-run"), 1, "no run with id")


def test_cairn_wait_blocks_until_a_worker_finishes_the_run(app: cairn.App) -> None:
    run_id = _waiting(app)
    app.signal(run_id, "approve", {"late": True})

    def finish() -> None:
        time.sleep(0.3)
        execute_once(app, run_id)

    thread = threading.Thread(target=finish)
    thread.start()
    result = cli("wait", run_id, "--finished", "--timeout", "20")
    thread.join()
    assert result.exit_code == EXIT_COMPLETED, result.stderr
    assert app.get_run(run_id).status is RunStatus.COMPLETED


def test_signal_data_and_names_full_of_markup_are_shown_as_text(app: cairn.App) -> None:
    @app.workflow(name="hostile")
    def hostile(ctx: cairn.Context) -> str:
        ctx.set_event("stage", HOSTILE)
        return str(ctx.wait_for_signal("[bold red]go[/]", type_=str))

    run_id = app.start("hostile").run_id
    assert execute_once(app, run_id) == "suspended"
    for args in (("show", run_id), ("wait", run_id), ("events", run_id)):
        result = cli(*args)
        assert result.exit_code in (0, EXIT_SUSPENDED), result.stderr
        for output in (result.stdout, result.stderr):
            for raw in RAW_CONTROL:
                assert raw not in output
            assert "Traceback" not in output
        assert "[bold red]go[/]" in result.stdout + result.stderr  # literal, not styled away
    sent = cli("signal", run_id, "[bold red]go[/]", "--data", '"' + HOSTILE.replace("\n", "\\n")
               .replace("\x1b", "\\u001b").replace("\x07", "\\u0007").replace("\x9b", "\\u009b")
               .replace("\u202e", "\\u202e") + '"')
    assert sent.exit_code == 0, sent.stderr
    assert execute_once(app, run_id) == "completed"
    shown = cli("show", run_id)
    assert shown.exit_code == 0
    for raw in RAW_CONTROL:
        assert raw not in shown.stdout
    assert "[/INST]" in shown.stdout
