"""Approvals across real crashes: worker processes SIGKILLed (at named fault
points, or by the test) before the wait is recorded, while it waits, while
the decision is being taken, and around the approved effect. Whatever dies
when, the request is made once, the decision is applied once, and the bank
(which deduplicates by operation id) holds exactly one refund of exactly the
approved or edited amount. SQLite and PostgreSQL."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests import processes
from tests.acceptance.harness import wait_until
from tests.backends import StoreBackend

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.approvals.refund_app"


@pytest.fixture
def world(backend: StoreBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    env = {"CAIRN_TEST_DB": backend.url, "CAIRN_TEST_LEDGER": str(tmp_path / "ledger.jsonl")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    sys.modules.pop(MODULE, None)
    cairn.App(db=backend.url).close()  # the schema exists before the children race to create it
    yield env
    module = sys.modules.pop(MODULE, None)
    if module is not None:
        module.app.close()


@pytest.fixture
def child(world: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``refund_app`` with arguments, optionally armed to die at a fault point."""
    spawned: list[subprocess.Popen[bytes]] = []

    def start(*args: str, fault: str | None = None) -> subprocess.Popen[bytes]:
        env = {**world, **({"CAIRN_FAULTS": fault} if fault is not None else {})}
        proc = processes.spawn(MODULE, args, env=env, log=tmp_path / f"child-{len(spawned)}.log")
        spawned.append(proc)
        return proc

    yield start
    for proc in spawned:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _died(proc: subprocess.Popen[bytes], point: str) -> None:
    code = proc.wait(timeout=60)
    assert code == -signal.SIGKILL, f"the child did not die at {point} (exit {code})"


def _here() -> ModuleType:
    return importlib.import_module(MODULE)


def _resume(module: ModuleType, run_id: str) -> Any:
    """Continue the run in this process once the dead child's lease expired."""
    time.sleep(0.6)
    try:
        return module.app.resume(run_id)
    except cairn.RunSuspended:
        return None


def _pending(module: ModuleType, run_id: str) -> cairn.ApprovalView:
    (view,) = module.app.approvals(run_id=run_id)
    return view


def _decisions(module: ModuleType, run_id: str) -> list[Any]:
    return [e for e in module.app.history(run_id)
            if e.event is EventType.STEP_COMPLETED and e.step_kind == "decision"]


def _paid_once(module: ModuleType, run_id: str, customer: str, cents: int) -> None:
    entries = module.ledger()
    key = cairn.operation_id(run_id, module.TOOL_POSITION)
    assert entries == [{"key": key, "customer": customer, "cents": cents}], entries
    assert module.app.get_run(run_id).status is RunStatus.COMPLETED
    assert module.app.handle(run_id).result(timeout=5) == entries[0]
    assert len(_decisions(module, run_id)) == 1
    assert len(module.app.approvals(run_id=run_id, pending=False)) == 1  # requested once


@pytest.mark.slow
@pytest.mark.parametrize("point", ["store.request_approval.before_commit",
                                   "store.request_approval.after_commit"])
def test_killed_while_recording_the_request(
    child: Callable[..., Any], world: dict[str, str], point: str
) -> None:
    _died(child("run", "r1", "ada", "5000", fault=point), point)
    module = _here()
    recorded = point.endswith("after_commit")
    assert len(module.app.approvals(run_id="r1")) == (1 if recorded else 0)  # both or neither
    assert _resume(module, "r1") is None  # asks (again, or for the first time) and waits
    view = _pending(module, "r1")
    assert view.request_id == cairn.operation_id("r1", 1)
    module.app.approve("r1", view.request_id, edit={"customer": "ada", "cents": 4200})
    module.app.resume("r1")
    _paid_once(module, "r1", "ada", 4200)


@pytest.mark.slow
def test_a_worker_killed_while_the_run_waits_loses_nothing_and_held_no_slot(
    child: Callable[..., Any], world: dict[str, str]
) -> None:
    module = _here()
    first = child("worker", "w1")
    waiting = module.app.start(module.refund_agent, "ada", 5000, run_id="big")
    wait_until(lambda: module.app.approvals(run_id="big"), 30, "the approval request")
    record = wait_until(lambda: (r := module.app.get_run("big")).status is RunStatus.SUSPENDED and r,
                        30, "the run to suspend")
    assert record.owner is None
    # the worker has one slot; the waiting run does not hold it: a small refund goes through meanwhile
    small = module.app.start(module.refund_agent, "bob", 300, run_id="small")
    assert small.result(timeout=30)["cents"] == 300
    first.kill()
    first.wait(timeout=30)
    view = _pending(module, "big")
    module.app.approve("big", view.request_id, edit={"customer": "ada", "cents": 1234}, by="cli:ada@desk")
    child("worker", "w2")
    assert waiting.result(timeout=30)["cents"] == 1234
    entries = [e for e in module.ledger() if e["customer"] == "ada"]
    assert entries == [{"key": cairn.operation_id("big", 3), "customer": "ada", "cents": 1234}]
    (decision,) = _decisions(module, "big")
    assert decision.detail["sender"] == "cli:ada@desk"


@pytest.mark.slow
@pytest.mark.parametrize("point", ["store.take_delivery.before_commit", "store.take_delivery.after_commit",
                                   "tool.after_intent", "tool.after_effect", "tool.after_record"])
def test_killed_after_the_decision(child: Callable[..., Any], world: dict[str, str], point: str) -> None:
    """Killed while taking the decision, or around the approved effect: the
    decision is consumed once and the edited amount is paid once."""
    module = _here()
    asked = child("run", "r2", "ada", "5000")
    assert asked.wait(timeout=60) == 3  # suspended, waiting
    module.app.approve("r2", _pending(module, "r2").request_id, edit={"customer": "ada", "cents": 2500})
    _died(child("resume", "r2", fault=point), point)
    _resume(module, "r2")
    _paid_once(module, "r2", "ada", 2500)


@pytest.mark.slow
def test_a_timeout_fires_after_every_worker_was_killed(
    child: Callable[..., Any], world: dict[str, str]
) -> None:
    """The deadline is in the journal: a worker started after the first one
    died expires the request at its time, and the refund is not paid."""
    module = _here()

    first = child("worker", "w1")
    module.app.start("timed_refund", "ada", 5000, run_id="t1")
    wait_until(lambda: module.app.approvals(run_id="t1"), 30, "the approval request")
    first.kill()
    first.wait(timeout=30)
    view = _pending(module, "t1")
    assert view.expires_at is not None
    child("worker", "w2")
    result = module.app.handle("t1").result(timeout=30)
    assert result == {"refused": "expired"}
    assert module.ledger() == []
    assert time.time() >= view.expires_at


@pytest.mark.slow
@pytest.mark.parametrize("point", ["store.expire_approval.before_commit",
                                   "store.expire_approval.after_commit"])
def test_killed_while_expiring(child: Callable[..., Any], world: dict[str, str], point: str) -> None:
    """Killed as the expiry commits: it is recorded once (or not yet, and
    then by the next execution), the refund is not paid, no decision is taken."""
    _died(child("run-timed", "t2", "ada", "5000", fault=point), point)
    module = _here()
    (request,) = module.app.approvals(run_id="t2", pending=False)
    assert request.status is (cairn.ApprovalStatus.EXPIRED if point.endswith("after_commit")
                              else cairn.ApprovalStatus.PENDING)
    assert _resume(module, "t2") == {"refused": "expired"}
    (request,) = module.app.approvals(run_id="t2", pending=False)
    assert request.status is cairn.ApprovalStatus.EXPIRED
    assert len(_decisions(module, "t2")) == 1
    assert module.ledger() == []
