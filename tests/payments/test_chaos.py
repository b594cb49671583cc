"""Money moved at most once, whatever happens to the workers.

The refund agent (``cairn.demo.payments``) issues 30 refunds through a
``write`` tool with ``reconcile`` to a bank that is a separate process with
its own database. Workers are real processes, killed with real SIGKILLs (at
random instants, or at named fault points), frozen with SIGSTOP, and fenced by
the kill switch. Afterwards the bank's ledger is compared with the journal.

``CAIRN_PAYMENTS_SEED`` replays a random-kill schedule; the seed is named in
every failure of that test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

import cairn
from cairn.demo.bank import Transfer
from cairn.engine import modelcalls
from cairn.models import ModelRecord, ModelRequest
from cairn.store.records import EventType, HistoryEvent, RunStatus
from tests.acceptance.harness import format_history
from tests.payments.conftest import World, wait_until

pytestmark = pytest.mark.slow

TRANSFERS = 30
WORKFLOW = "refund-agent"
SEED = int(os.environ.get("CAIRN_PAYMENTS_SEED", "8675309"))

MakeWorld = Callable[..., World]


# -- reading the journal ---------------------------------------------------------------------


def refund_intents(history: list[HistoryEvent]) -> dict[int, str]:
    """position -> operation id of every ``issue_refund`` intent."""
    intents: dict[int, str] = {}
    for event in history:
        if event.event is EventType.OP_INTENT and event.name == "issue_refund":
            assert event.position is not None
            intents[event.position] = str((event.detail or {})["operation_id"])
    return intents


def refund_outcomes(history: list[HistoryEvent]) -> dict[int, HistoryEvent]:
    return {e.position: e for e in history
            if e.event is EventType.STEP_COMPLETED and e.name == "issue_refund" and e.position is not None}


def reconciliations(history: list[HistoryEvent]) -> Counter[str]:
    """How uncertain refunds were settled: ``done`` (found at the bank) and
    ``not_found`` (absent, then sent with the same key)."""
    counts: Counter[str] = Counter()
    for event in history:
        detail = event.detail or {}
        if event.event is EventType.STEP_COMPLETED and detail.get("reconciled") == "done":
            counts["done"] += 1
        elif event.event is EventType.OP_RECONCILED:
            counts[str(detail.get("outcome"))] += 1
    return counts


def recorded_decision(app: cairn.App, history: list[HistoryEvent]) -> ModelRecord:
    decisions = [e for e in history if e.step_kind == "model" and e.event is EventType.STEP_COMPLETED]
    assert len(decisions) == 1, f"expected one recorded model decision, found {len(decisions)}"
    return modelcalls.record_of(history, decisions[0], app.runtime.payloads)


def assert_bank_holds_exactly(world: World, app: cairn.App, run_id: str, n: int, context: str = "") -> None:
    """The bank holds exactly ``n`` transfers: amounts 100..100+n-1, no key
    twice, keys = the operation ids of the run's intents, memos = the single
    recorded model decision, and the run's result names the same transfers."""
    history = app.history(run_id)
    transfers = world.transfers()
    where = f"{context}\nhistory:\n{format_history(history)}"
    keys = Counter(t.idempotency_key for t in transfers)
    assert [k for k, c in keys.items() if c > 1] == [], f"duplicate keys at the bank {where}"
    assert len(transfers) == n, f"bank holds {len(transfers)} transfers, expected {n} {where}"
    assert sorted(t.amount_cents for t in transfers) == [100 + i for i in range(n)], where
    intents = refund_intents(history)
    assert set(keys) == set(intents.values()), f"bank keys differ from the intents' operation ids {where}"
    for position, op_id in intents.items():
        assert op_id == cairn.operation_id(run_id, position)
    decision = recorded_decision(app, history)
    memos = sorted(json.loads(call.arguments)["memo"] for call in decision.response.message.tool_calls)
    assert sorted(t.memo for t in transfers) == memos, f"transfers differ from the recorded decision {where}"
    report = app.handle(run_id).result(timeout=5)
    assert sorted(t.id for t in report.refunds) == sorted(t.id for t in transfers)
    assert report.total_cents == sum(100 + i for i in range(n))
    assert fencing_problems(history) == [], where


_ENDS_LEASE = frozenset({EventType.RUN_SUSPENDED, EventType.RUN_RELEASED, EventType.RUN_COMPLETED,
                         EventType.RUN_FAILED, EventType.RUN_NEEDS_ATTENTION})


def fencing_problems(history: list[HistoryEvent]) -> list[str]:
    """``seq`` is gap-free, and every entry a worker wrote (journal, ``op.*``,
    lifecycle) carries the epoch and id of the lease current at that point."""
    problems = [f"seq {e.seq} at index {i}" for i, e in enumerate(history, 1) if e.seq != i]
    holder: tuple[int, str | None] | None = None
    for event in history:
        where = f"seq {event.seq} {event.event.value} (epoch {event.epoch}, worker {event.worker})"
        if event.event in (EventType.LEASE_CLAIMED, EventType.LEASE_TAKEN_OVER):
            holder = (event.epoch, event.worker)
        elif event.event is EventType.LEASE_LOST:
            holder = None
        elif event.worker is not None:
            if (event.epoch, event.worker) != holder:
                problems.append(f"{where}: written outside the current lease {holder}")
            if event.event in _ENDS_LEASE:
                holder = None
    return problems


def wait_terminal(app: cairn.App, run_id: str, timeout: float, what: str) -> cairn.RunRecord:
    def ended() -> cairn.RunRecord | None:
        record = app.get_run(run_id)
        return record if record.status.terminal else None

    record = wait_until(ended, timeout,
                        lambda: f"run {run_id} to end ({what}); it is {app.get_run(run_id).status.value}")
    assert record is not None
    return record


def bank_replays(world: World) -> int:
    """POSTs the bank answered with an existing transfer (its own dedupe)."""
    return sum(1 for line in world.bank.log_tail(100_000).splitlines()
               if '"POST /transfers' in line and '" 200 ' in line)


# -- random kills ------------------------------------------------------------------------------

#: kills that must land while a worker holds the run and the run is unfinished
MID_RUN_KILLS = 50
#: every EARLY_EVERY-th kill is timed from the spawn (start-up, reclaim, claim, replay)
EARLY_EVERY = 6
#: entries that show a worker doing new work (not replaying) on the run
WORK_EVENTS = frozenset({EventType.OP_INTENT, EventType.OP_RECONCILED, EventType.STEP_COMPLETED})
#: the bank's latency before the commit, and between the commit and the reply: a kill 10-120 ms
#: after the worker starts new work mostly lands before the commit (the bank drops the request of a
#: caller that hung up: reconciled not_found), sometimes after it (reconciled done). The run
#: advances about one refund per four kills (7-16 refunds after 50 kills over six seeds), so it is
#: still unfinished after 50 of them.
BANK_DELAY_MS = 100
BANK_REPLY_DELAY_MS = 150


@pytest.mark.timeout(600)
def test_random_sigkills_never_move_money_twice(make_world: MakeWorld, payments: ModuleType) -> None:
    rng = random.Random(SEED)
    started = time.monotonic()
    world = make_world(delay_ms=BANK_DELAY_MS, reply_delay_ms=BANK_REPLY_DELAY_MS)
    order_ids = world.write_orders(TRANSFERS)
    app = world.app()
    run_id = app.start(WORKFLOW, order_ids=order_ids).run_id
    context = f"(seed {SEED}; replay with CAIRN_PAYMENTS_SEED={SEED})"

    kills = mid_run = 0
    progress: list[int] = []  # refunds recorded at each mid-run kill
    epoch = app.get_run(run_id).epoch
    worker_id = "chaos-0"
    # No budget in seconds: every kill but the early ones waits for the worker to do new work on
    # the run, so each lands mid-run (asserted below) and the loop ends after a known number
    while mid_run < MID_RUN_KILLS:
        if kills % 2 == 0:  # a new id: the dead worker's lease must expire first (takeover)
            worker_id = f"chaos-{kills}"  # else: the same id reclaims its run at once
        lease = rng.choice((0.5, 0.75, 1.0))
        worker = world.chaos_worker(worker_id, lease=lease)
        early = kills % EARLY_EVERY == EARLY_EVERY - 1
        if early:  # somewhere in start-up, reclaim, claim, replay or the first steps
            time.sleep(rng.uniform(0.0, 0.35))
        else:
            seen = app.history(run_id)[-1].seq

            def working(w: str = worker_id, e: int = epoch, after: int = seen) -> bool:
                """It claimed the run, replayed the journal and started new work."""
                record = app.get_run(run_id)
                if record.status.terminal:
                    return True
                return record.owner == w and record.epoch > e and any(
                    event.worker == w and event.event in WORK_EVENTS for event in app.history(run_id, after))

            what = f"{worker_id} (pid {worker.pid}) to take up the run (kill {kills}) {context}"
            wait_until(working, 20, what, interval=0.005)
            assert not app.get_run(run_id).status.terminal, \
                f"the run finished after only {mid_run} mid-run kills: slow the bank down {context}"
            # the random kill point itself: some land while the bank processes the POST (the bank
            # drops it: not_found), some after its commit (done), a few between two refunds
            time.sleep(rng.uniform(0.010, 0.120))
        worker.kill()
        kills += 1
        record = app.get_run(run_id)
        assert record.status in (RunStatus.RUNNING, RunStatus.PENDING), \
            f"run is {record.status.value} after kill {kills} {context}: {record.error}"
        if not early:
            assert record.epoch > epoch, f"kill {kills} did not land while the worker held the run {context}"
            mid_run += 1  # it held the run and the run is still unfinished after the kill
            progress.append(len(refund_outcomes(app.history(run_id))))
        epoch = record.epoch

    survivor = world.chaos_worker("chaos-final", lease=0.5)
    record = wait_terminal(app, run_id, 120, f"after {kills} kills {context}")
    survivor.send(signal.SIGTERM)
    survivor.wait_exit(15)
    assert record.status is RunStatus.COMPLETED, f"{record.status.value}: {record.error} {context}"

    assert_bank_holds_exactly(world, app, run_id, TRANSFERS, context)
    history = app.history(run_id)
    settled = reconciliations(history)
    replays = bank_replays(world)
    # Cairn's ledger, not the bank's dedupe, kept the money straight: nothing was resent blindly
    assert replays == 0, f"{replays} POSTs reused a key {context}"
    assert world.asks() >= 1
    elapsed = time.monotonic() - started
    print(f"\nrandom kills {context}: {kills} SIGKILLs ({mid_run} while a worker held the unfinished run), "
          f"landing after {min(progress)}..{max(progress)} recorded refunds ({len(set(progress))} distinct "
          f"positions), recoveries {record.recoveries}, "
          f"reconciliations {dict(settled)}, model asked {world.asks()}x, bank replays {replays}, "
          f"{elapsed:.1f}s")
    assert sum(settled.values()) > 0, f"no kill ever landed in an uncertain window {context}"


# -- deterministic windows -----------------------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nth", [1, 7, 30])
@pytest.mark.parametrize("point", ["tool.after_intent", "tool.after_effect", "tool.after_record"])
def test_sigkill_at_a_named_point(make_world: MakeWorld, payments: ModuleType, point: str, nth: int) -> None:
    world = make_world()
    order_ids = world.write_orders(TRANSFERS)
    app = world.app()
    run_id = app.start(WORKFLOW, order_ids=order_ids).run_id
    # order lookups are tools too: they pass tool.after_effect/after_record, not tool.after_intent
    hit = nth if point == "tool.after_intent" else payments.refund_tool_hits(TRANSFERS, nth)
    doomed = world.cli_worker("doomed", faults=f"{point}@{hit}")
    assert doomed.wait_exit(60) == -signal.SIGKILL, f"did not die at {point}@{hit}:\n{doomed.log_tail()}"

    # it died exactly where it was told to
    history = app.history(run_id)
    intents, outcomes = refund_intents(history), refund_outcomes(history)
    in_bank = len(world.transfers())
    assert len(intents) == nth
    assert in_bank == (nth - 1 if point == "tool.after_intent" else nth)
    assert len(outcomes) == (nth if point == "tool.after_record" else nth - 1)
    crash_position = max(intents)
    uncertain = [op["position"] for op in app.operations(run_id) if op["status"] == "uncertain"]
    assert uncertain == ([] if point == "tool.after_record" else [crash_position])

    rescuer_id = "doomed" if nth == 7 else "rescuer"  # same id reclaims at once; a new one takes over
    rescuer = world.cli_worker(rescuer_id)
    record = wait_terminal(app, run_id, 60, f"{point}@{hit}")
    rescuer.send(signal.SIGTERM)
    rescuer.wait_exit(15)
    assert record.status is RunStatus.COMPLETED, record.error
    assert_bank_holds_exactly(world, app, run_id, TRANSFERS, f"{point}@{hit}")

    history = app.history(run_id)
    settled = reconciliations(history)
    detail = refund_outcomes(history)[crash_position].detail or {}
    if point == "tool.after_intent":  # nothing reached the bank: reconciled as absent, sent with the same key
        assert settled == Counter({"not_found": 1})
        assert detail.get("reconciled") is None
    elif point == "tool.after_effect":  # the bank committed: found by key, recorded, not resent
        assert settled == Counter({"done": 1})
        assert detail.get("reconciled") == "done"
    else:  # recorded before the crash: plain replay
        assert settled == Counter()
    assert bank_replays(world) == 0
    assert world.asks() == 1  # the model decided once; recovery replayed the decision


# -- semantic rollback: the decision is replayed, not re-asked ------------------------------------


@pytest.fixture
def semantic(payments: ModuleType) -> Any:
    """``tests.payments.semantic_app``, imported after ``payments`` set ``$CAIRN_DB``."""
    import importlib
    import sys

    sys.modules.pop("tests.payments.semantic_app", None)
    module = importlib.import_module("tests.payments.semantic_app")
    yield module
    module.app.close()
    sys.modules.pop("tests.payments.semantic_app", None)


SEMANTIC_SPEC = "tests.payments.semantic_app:app"


@pytest.mark.timeout(120)
def test_recovery_replays_the_model_decision_instead_of_asking_again(
    make_world: MakeWorld, semantic: Any
) -> None:
    world = make_world()
    app = semantic.register(cairn.App(world.db_url))
    world.apps.append(app)
    run_id = app.start(semantic.WORKFLOW, "INV-77", "acct_supplier", 98_765).run_id

    doomed = world.cli_worker("doomed", faults="tool.after_effect", app_spec=SEMANTIC_SPEC)
    assert doomed.wait_exit(60) == -signal.SIGKILL, doomed.log_tail()
    assert len(world.transfers()) == 1  # the bank committed; Cairn had not recorded it
    assert world.asks() == 1

    rescuer = world.cli_worker("rescuer", app_spec=SEMANTIC_SPEC)
    record = wait_terminal(app, run_id, 60, "semantic rollback")
    rescuer.send(signal.SIGTERM)
    rescuer.wait_exit(15)
    assert record.status is RunStatus.COMPLETED, record.error

    transfers = world.transfers()
    assert len(transfers) == 1, transfers  # not duplicated
    assert world.asks() == 1  # asked once in total, across both processes: the decision was replayed
    result: Transfer = app.handle(run_id).result(timeout=5)
    assert result == transfers[0]
    assert transfers[0].idempotency_key == "INV-77-pay-0"
    settled = [e.detail for e in app.history(run_id)
               if e.event is EventType.STEP_COMPLETED and e.name == "pay"]
    assert settled == [{"operation_id": cairn.operation_id(run_id, 1), "reconciled": "done"}]

    # The contrast: asked again, the model would have chosen another reference, which the bank
    # has never seen; its deduplication would have let a second payment through.
    request = ModelRequest(tuple(semantic.invoice_request("INV-77", "acct_supplier", 98_765)))
    again = json.loads(semantic.invoice_policy(request, 1).tool_calls[0].arguments)
    assert again["reference"] != transfers[0].idempotency_key
    assert world.client().transfer_by_key(again["reference"]) is None


@pytest.mark.timeout(120)
def test_divergent_replay_at_an_uncertain_write_is_caught(make_world: MakeWorld, semantic: Any) -> None:
    world = make_world()
    app = semantic.register(cairn.App(world.db_url))
    world.apps.append(app)
    run_id = app.start(semantic.UNJOURNALED, "INV-88", "acct_supplier", 1_234).run_id
    doomed = world.cli_worker("doomed", faults="tool.after_effect", app_spec=SEMANTIC_SPEC)
    assert doomed.wait_exit(60) == -signal.SIGKILL, doomed.log_tail()
    assert [t.idempotency_key for t in world.transfers()] == ["INV-88-pay-0"]

    rescuer = world.cli_worker("rescuer", app_spec=SEMANTIC_SPEC)
    record = wait_terminal(app, run_id, 60, "divergent replay")
    rescuer.send(signal.SIGTERM)
    rescuer.wait_exit(15)
    # The re-asked model chose reference INV-88-pay-1 for the same journal position. Whatever the
    # engine does about it (fail with NonDeterminismError, or reconcile with the recorded
    # arguments), it must not pay the invoice twice.
    keys = [t.idempotency_key for t in world.transfers()]
    assert keys == ["INV-88-pay-0"], f"paid twice: {keys}; run {record.status.value}"
    # the engine refuses to reconcile a different call than the one it recorded
    assert record.status is RunStatus.FAILED
    assert record.error is not None
    assert record.error["type"] == "NonDeterminismError", record.error


# -- the kill switch against a frozen worker ------------------------------------------------------


@pytest.mark.timeout(180)
def test_kill_switch_fences_a_frozen_worker(make_world: MakeWorld) -> None:
    # the bank holds each reply for a while after its commit: the worker is caught in that window
    world = make_world(reply_delay_ms=600)
    order_ids = world.write_orders(TRANSFERS)
    app = world.app()
    run_id = app.start(WORKFLOW, order_ids=order_ids).run_id
    stale = world.cli_worker("stale", lease=1.0)

    frozen = False
    for target in (3, 5, 7):  # freeze it just after the bank committed transfer `target`
        def committed(t: int = target) -> bool:
            return len(world.transfers()) >= t

        wait_until(committed, 60, f"{target} transfers at the bank", interval=0.005)
        stale.stop_outside_write_lock(world.db_path)
        intents = refund_intents(app.history(run_id))
        outcomes = refund_outcomes(app.history(run_id))
        if len(world.transfers()) == len(intents) == len(outcomes) + 1:
            frozen = True  # frozen while waiting for the bank's reply to its latest refund
            break
        stale.send(signal.SIGCONT)  # caught elsewhere: try again on a later transfer
    assert frozen, "could not freeze the worker inside a bank call"
    before = world.transfers()

    killed_at = time.time()
    app.kill(run_id, reason="kill switch test")
    kill_seq = max(e.seq for e in app.history(run_id) if e.event is EventType.RUN_KILLED)
    stale.send(signal.SIGCONT)
    # it wakes up, gets the bank's reply, and tries to record it: the fence rejects the write
    wait_until(lambda: " lost: " in stale.log_text() or " abandoned: " in stale.log_text(), 15,
               lambda: f"the stale worker to notice it was fenced out:\n{stale.log_tail()}")
    time.sleep(1.5)  # room for anything else it might still try (a lease renewal, a next intent)

    history = app.history(run_id)
    after = [e for e in history if e.seq > kill_seq]
    assert [e for e in after if e.event is EventType.OP_INTENT] == [], format_history(after)
    assert after == [], f"entries accepted after the kill:\n{format_history(after)}"
    assert app.get_run(run_id).status is RunStatus.KILLED
    transfers = world.transfers()
    assert transfers == before, "the bank received something after the kill"
    assert all(t.created_at < killed_at for t in transfers)
    assert stale.alive()  # not crashed: fenced, and idle
