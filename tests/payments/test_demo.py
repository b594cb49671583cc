"""``run_payments_demo`` end to end, and the verdict it prints."""

from __future__ import annotations

import io
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console

from cairn.demo.bank import Transfer
from cairn.models import ModelRequest
from cairn.store.records import EventType, HistoryEvent


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_kills_a_worker_in_the_window_and_the_bank_holds_one_transfer_per_refund(
    payments: ModuleType, tmp_path: Path
) -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, highlight=False, soft_wrap=True, color_system=None)
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    code = payments.run_payments_demo(db, console)
    text = out.getvalue()
    assert code == 0, text
    assert "SIGKILL payments-worker-1" in text
    assert "tool.after_effect@6" in text  # 4 order lookups, then the 2nd refund
    assert "lease.taken_over" in text
    assert "reconciled: done" in text
    assert "verdict: the bank holds exactly 3 transfer(s), one per refund" in text
    assert "model asked 1 time(s) across both workers" in text

    app = payments.open_app(db)
    try:
        (run,) = app.list_runs()
        history = app.history(run.run_id)
        completed = [e for e in history if e.event is EventType.STEP_COMPLETED and e.name == "issue_refund"]
        assert [(e.detail or {}).get("reconciled") for e in completed] == [None, "done", None]
        workers = ["payments-worker-1", "payments-worker-2", "payments-worker-2"]
        assert [e.worker for e in completed] == workers
        report = app.handle(run.run_id).result(timeout=5)
        assert report.total_cents == 18_900 + 24_950 + 4_599
        assert report.skipped == ["ORD-1043"]
    finally:
        app.close()


def test_demo_refuses_a_database_workers_cannot_share(payments: ModuleType) -> None:
    out = io.StringIO()
    assert payments.run_payments_demo("memory://", Console(file=out, width=120)) == 2
    assert "SQLite database file" in out.getvalue()


def _intent(seq: int, position: int, key: str) -> HistoryEvent:
    return HistoryEvent("r", seq, EventType.OP_INTENT, 0.0, 1, "w", position, "tool", "issue_refund",
                        detail={"operation_id": key})


def _done(seq: int, position: int, key: str, reconciled: bool = False) -> HistoryEvent:
    detail = {"operation_id": key, **({"reconciled": "done"} if reconciled else {})}
    return HistoryEvent("r", seq, EventType.STEP_COMPLETED, 0.0, 1, "w", position, "tool", "issue_refund",
                        detail=detail)


def _transfer(key: str, to: str, amount: int) -> Transfer:
    return Transfer(id=f"tr_{key}", idempotency_key=key, from_account="shop", to_account=to,
                    amount_cents=amount, memo="", created_at=0.0)


HISTORY = [_intent(1, 5, "k1"), _done(2, 5, "k1"), _intent(3, 6, "k2"), _done(4, 6, "k2", reconciled=True)]


def test_verdict_holds_for_one_transfer_per_refund(payments: ModuleType) -> None:
    verdict = payments.judge_refunds(HISTORY, [_transfer("k1", "a", 1), _transfer("k2", "b", 2)],
                                     [("a", 1), ("b", 2)])
    assert verdict.ok, verdict.message
    assert verdict.crash_position == 6


@pytest.mark.parametrize(
    ("transfers", "problem"),
    [
        ([_transfer("k1", "a", 1), _transfer("k2", "b", 2), _transfer("k2", "b", 2)], "duplicate keys"),
        ([_transfer("k1", "a", 1), _transfer("k2", "b", 2), _transfer("k3", "b", 2)], "differ from the"),
        ([_transfer("k1", "a", 1)], "expected"),
        ([_transfer("k1", "a", 1), _transfer("k2", "b", 3)], "expected"),
    ],
)
def test_verdict_fails_when_the_bank_disagrees(
    payments: ModuleType, transfers: list[Transfer], problem: str
) -> None:
    verdict = payments.judge_refunds(HISTORY, transfers, [("a", 1), ("b", 2)])
    assert not verdict.ok
    assert problem in verdict.message


def test_verdict_fails_for_an_unsettled_operation(payments: ModuleType) -> None:
    history = [_intent(1, 5, "k1"), _done(2, 5, "k1"), _intent(3, 6, "k2")]
    verdict = payments.judge_refunds(history, [_transfer("k1", "a", 1), _transfer("k2", "b", 2)],
                                     [("a", 1), ("b", 2)])
    assert not verdict.ok
    assert "without a recorded result" in verdict.message


def test_the_model_would_decide_differently_if_asked_again(payments: ModuleType) -> None:
    request = ModelRequest(tuple(payments.refund_request(list(payments.DEMO_ORDERS))))
    first, second = payments.refund_policy(request, 0), payments.refund_policy(request, 1)
    assert len(first.tool_calls) == len(second.tool_calls) == 3  # same refunds...
    # ...with other memos
    assert [c.arguments for c in first.tool_calls] != [c.arguments for c in second.tool_calls]
    assert payments.refund_policy(request, 0) == first  # yet deterministic for one n


def test_counted_model_counts_asks_across_instances(payments: ModuleType, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    asks = tmp_path / "asks.jsonl"
    monkeypatch.setenv(payments.ASKS_ENV, str(asks))
    request = ModelRequest(tuple(payments.refund_request(list(payments.DEMO_ORDERS))))
    one = payments.CountedModel(payments.refund_policy).complete(request)
    two = payments.CountedModel(payments.refund_policy).complete(request)  # "another process"
    assert payments.count_asks(asks) == 2
    assert one.message == payments.refund_policy(request, 0)
    assert two.message == payments.refund_policy(request, 1)
