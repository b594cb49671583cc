"""``cairn approvals``, ``cairn approve``, ``cairn reject`` and the pending
approval in ``cairn show``: through the operator (the decider is the
``cli:user@host`` identity), bad input one line with exit 2 and nothing
stored, user text never markup or terminal control."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from cairn.api.operator import cli_actor
from cairn.store.records import ApprovalStatus
from tests.approvals.conftest import one_pass
from tests.cli.test_cli import check_error, cli
from tests.cli.test_hostile_text import HOSTILE, RAW_CONTROL


@dataclasses.dataclass
class Refund:
    cents: int
    note: str


@pytest.fixture
def app(tmp_path: Path) -> Iterator[cairn.App]:
    application = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")

    @application.workflow(name="ask")
    def ask(ctx: cairn.Context, action: str, cents: int, note: str) -> dict[str, object]:
        decision = ctx.request_approval(action, {"cents": cents, "note": note}, type_=Refund)
        data = dataclasses.asdict(decision.data) if decision.data is not None else None
        return {"status": decision.status.value, "data": data, "by": decision.decided_by,
                "comment": decision.comment}

    yield application
    application.close()


def _waiting(app: cairn.App, run_id: str = "r1", *, action: str = "refund", note: str = "dup charge",
             tenant: str = "default") -> str:
    app.start("ask", action, 5000, note, run_id=run_id, tenant=tenant)
    assert one_pass(app, run_id) == "suspended"
    return app.approvals(run_id=run_id)[0].request_id


def _db(app: cairn.App) -> str:
    assert app.db_url is not None
    return app.db_url


def test_listing(app: cairn.App) -> None:
    empty = cli("approvals", "--db", _db(app))
    assert empty.exit_code == 0
    assert "no pending approval requests" in empty.stderr
    first = _waiting(app, "r1")
    second = _waiting(app, "r2", tenant="acme")
    table = cli("approvals", "--db", _db(app))
    assert table.exit_code == 0, table.stderr
    assert first in table.stdout
    assert second in table.stdout
    assert "refund" in table.stdout
    narrow = cli("approvals", "--db", _db(app), columns=80)  # a block per request: ids never cut
    assert narrow.exit_code == 0
    assert first in narrow.stdout
    assert "run r2  pending" in narrow.stdout
    lines = cli("approvals", "--db", _db(app), "--json", "--tenant", "acme").stdout.splitlines()
    (only,) = [json.loads(line) for line in lines]
    assert (only["run_id"], only["request_id"], only["tenant"]) == ("r2", second, "acme")
    assert only["details"] == {"cents": 5000, "note": "dup charge"}
    assert only["status"] == "pending"


def test_show_names_the_pending_approval_and_how_to_decide(app: cairn.App) -> None:
    request_id = _waiting(app)
    shown = cli("show", "r1", "--db", _db(app))
    assert shown.exit_code == 0, shown.stderr
    assert f"approval pending: request {request_id} (refund)" in shown.stdout
    assert f"waiting   approval '{request_id}'" in shown.stdout
    assert f"cairn approve r1 {request_id}" in shown.stdout
    events = cli("events", "r1", "--db", _db(app))
    assert f"waiting for approval '{request_id}'" in events.stdout
    as_json = json.loads(cli("show", "r1", "--db", _db(app), "--json").stdout)
    assert [a["request_id"] for a in as_json["approvals"]] == [request_id]


def test_approve_with_an_edit_and_a_comment(app: cairn.App, tmp_path: Path) -> None:
    request_id = _waiting(app)
    edit = tmp_path / "edit.json"
    edit.write_text('{"cents": 1200, "note": "partial"}')
    done = cli("approve", "r1", request_id, "--db", _db(app), "--edit", f"@{edit}", "--comment", "half")
    assert done.exit_code == 0, done.stderr
    assert f"approved with edits request {request_id}" in done.stdout
    assert cli_actor() in done.stdout
    one_pass(app, "r1")
    assert app.handle("r1").result(timeout=5) == {
        "status": "edited", "data": {"cents": 1200, "note": "partial"}, "by": cli_actor(), "comment": "half"}
    again = cli("reject", "r1", request_id, "--db", _db(app))
    check_error(again, 1, "run 'r1' is completed")


def test_reject_and_a_second_decision(app: cairn.App) -> None:
    request_id = _waiting(app)
    assert cli("reject", "r1", request_id, "--db", _db(app), "--comment", "no").exit_code == 0
    check_error(cli("approve", "r1", request_id, "--db", _db(app)), 1, "is rejected by", "decided once")
    (view,) = app.approvals(pending=False)
    assert (view.status, view.decided_by, view.comment) == (ApprovalStatus.REJECTED, cli_actor(), "no")


def test_bad_input_is_one_line_exit_2_and_stores_nothing(app: cairn.App, tmp_path: Path) -> None:
    request_id = _waiting(app)
    db = _db(app)
    check_error(cli("approve", "r1", request_id, "--db", db, "--edit", "{bad"), 2,
                "'--edit': --edit is not valid JSON")
    check_error(cli("approve", "r1", request_id, "--db", db, "--edit", "NaN"), 2, "not valid JSON")
    check_error(cli("approve", "r1", request_id, "--db", db, "--edit", '{"cents": "many", "note": "x"}'), 2,
                "does not fit", "'many' is not of type 'integer'")
    check_error(cli("approve", "r1", request_id, "--db", db, "--edit", '{"note": "x"}'), 2, "'cents'")
    check_error(cli("approve", "r1", request_id, "--db", db, "--edit", f"@{tmp_path / 'missing.json'}"), 2,
                "cannot read")
    check_error(cli("approve", "r1", "no-such-request", "--db", db), 1, "has no approval request")
    check_error(cli("reject", "no-such-run", request_id, "--db", db), 1, "no run with id 'no-such-run'")
    check_error(cli("approve", "r1", "--db", db), 2, "REQUEST")
    assert app.store.deliveries("r1") == []
    assert app.approvals()[0].status is ApprovalStatus.PENDING


def test_hostile_text_is_printed_as_text(app: cairn.App) -> None:
    request_id = _waiting(app, action=f"refund {HOSTILE}", note=HOSTILE)
    db = _db(app)
    outputs = [cli("approvals", "--db", db), cli("approvals", "--db", db, "--json"),
               cli("show", "r1", "--db", db),
               cli("approve", "r1", request_id, "--db", db, "--comment", HOSTILE),
               cli("approvals", "--db", db, "--all")]
    for result in outputs:
        assert result.exit_code == 0, result.stderr
        for raw in RAW_CONTROL:
            assert raw not in result.stdout
            assert raw not in result.stderr
    assert "[/INST]" in outputs[0].stdout  # shown literally, not parsed as markup
    decoded = json.loads(outputs[1].stdout.splitlines()[0])
    assert decoded["details"]["note"] == HOSTILE  # JSON output escapes and decodes to the same text
    assert "[bold red]red[/]" in outputs[2].stdout
    one_pass(app, "r1")
    assert app.handle("r1").result(timeout=5)["comment"] == HOSTILE  # stored as given
