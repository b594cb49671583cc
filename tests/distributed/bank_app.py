"""The workflow the distributed tests run: every step moves money at the fake bank.

``build_app`` registers it on a fresh ``cairn.App`` bound to a PostgreSQL
database, so the test process (which starts and inspects runs) and the worker
subprocesses (which execute them) share it. Settings come from the
environment when not given:

* ``CAIRN_DIST_DB``: the PostgreSQL URL (``postgresql://...?schema=NAME``);
* ``CAIRN_DIST_BANK``: the base URL of the bank process (``cairn.demo.bank``);
* ``CAIRN_DIST_EFFECTS``: a JSON-lines file every tool body and reconciler
  appends to (one ``os.write`` on an ``O_APPEND`` descriptor per line);
* ``CAIRN_DIST_SLOW``: ``POSITION:SECONDS``: the tool body at that position
  sleeps that long *in this process* before it calls the bank (the fencing
  test freezes a worker there);
* ``CAIRN_DIST_WORKER``: this process's worker id, written into the effects;
* ``CAIRN_DIST_APP_NAME``: the ``application_name`` of this process's
  database connections (set by ``run_worker``);
* ``CAIRN_DIST_CUT_BEFORE_FINISH``: a marker file. The first run (in any
  process) whose workflow function gets to its ``return`` while the file does
  not exist creates it and terminates every server session of this process:
  the connection loss lands deterministically between the last recorded step
  and the run's final commit (a fault-injection device). The step of the
  ``blob`` workflow does the same before it returns its (large) result.

Run ``k`` of workflow ``transfers`` makes ``steps`` transfers, step ``i``
moving ``amount_cents(k, i)`` (distinct for every (run, step)) with the memo
``memo(k, i)``, through the ``write`` tool ``transfer``: its intent is
durable before the body runs, the body sends the call's operation id as the
bank's idempotency key, and ``find_transfer`` settles an uncertain call by
looking that key up at the bank.
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg

import cairn
from cairn.demo.bank import BankClient, Transfer
from cairn.engine.execution import current
from tests.acceptance.apps import append_effect

DB_ENV = "CAIRN_DIST_DB"
BANK_ENV = "CAIRN_DIST_BANK"
EFFECTS_ENV = "CAIRN_DIST_EFFECTS"
SLOW_ENV = "CAIRN_DIST_SLOW"
WORKER_ENV = "CAIRN_DIST_WORKER"
APP_NAME_ENV = "CAIRN_DIST_APP_NAME"
CUT_ENV = "CAIRN_DIST_CUT_BEFORE_FINISH"

WORKFLOW = "transfers"
BLOB_WORKFLOW = "blob"
PACED_WORKFLOW = "paced"
TOOL = "transfer"
PAYER = "acct_cairn_dist"


def amount_cents(run_index: int, step: int) -> int:
    """Distinct for every (run, step) with ``step < 100``."""
    return 100_000 + run_index * 100 + step


def memo(run_index: int, step: int) -> str:
    return f"run {run_index} step {step}"


def account(run_index: int) -> str:
    return f"acct_run_{run_index:05d}"


def expected_total(run_index: int, steps: int) -> int:
    return sum(amount_cents(run_index, step) for step in range(steps))


def _slow_seconds(position: int) -> float:
    spec = os.environ.get(SLOW_ENV, "")
    if not spec:
        return 0.0
    where, _, seconds = spec.partition(":")
    return float(seconds) if int(where) == position else 0.0


def _without_query(url: str, *names: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in names]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def cut_own_connections_once() -> None:
    """See ``CAIRN_DIST_CUT_BEFORE_FINISH`` above (a no-op without it)."""
    marker = os.environ.get(CUT_ENV)
    if not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return
    url = _without_query(os.environ[DB_ENV], "schema", "application_name")
    with psycopg.connect(url, autocommit=True, application_name="cairn-dist-cutter") as conn:
        # with a timeout, pg_terminate_backend waits for each backend to be gone
        conn.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND application_name = %s",
                     (os.environ[APP_NAME_ENV],))


def build_app(
    db: str | None = None,
    bank_url: str | None = None,
    effects: str | os.PathLike[str] | None = None,
    *,
    lease_seconds: float = 2.0,
    max_recoveries: int = 1000,
) -> cairn.App:
    url = db if db is not None else os.environ[DB_ENV]
    bank = BankClient(bank_url if bank_url is not None else os.environ[BANK_ENV], timeout=15.0)
    effects_path = str(effects if effects is not None else os.environ[EFFECTS_ENV])
    app = cairn.App(db=url, lease_seconds=lease_seconds, max_recoveries=max_recoveries)

    def effect(kind: str, op: cairn.Operation, **fields: Any) -> None:
        execution = current()
        record: dict[str, Any] = {
            "kind": kind, "run_id": op.run_id, "position": op.position, "operation_id": op.operation_id,
            "worker": os.environ.get(WORKER_ENV), "pid": os.getpid(),
            "epoch": execution.epoch if execution is not None else None,
        }
        record.update(fields)
        append_effect(effects_path, record)

    def find_transfer(op: cairn.Operation) -> cairn.Done[Transfer] | cairn.NotFound:
        found = bank.transfer_by_key(op.operation_id)
        effect("reconcile", op, t0=time.time(), found=found.id if found is not None else None)
        return cairn.Done(found) if found is not None else cairn.NotFound()

    def transfer(op: cairn.Operation, run_index: int, step: int) -> Transfer:
        t0 = time.time()
        effect("begin", op, t0=t0)
        pause = _slow_seconds(op.position)
        if pause:
            time.sleep(pause)
        sent = time.time()
        made = bank.create_transfer(idempotency_key=op.operation_id, from_account=PAYER,
                                    to_account=account(run_index), amount_cents=amount_cents(run_index, step),
                                    memo=memo(run_index, step))
        # created before this request was sent: the bank answered with an existing transfer
        effect("end", op, t0=t0, sent=sent, t1=time.time(), transfer_id=made.id,
               replayed=made.created_at < sent)
        return made

    transfer_tool: cairn.Tool[[int, int], Transfer] = app.tool(
        effect="write", name=TOOL, reconcile=find_transfer)(transfer)

    @app.workflow(name=WORKFLOW)
    def transfers(ctx: cairn.Context, run_index: int, steps: int) -> int:
        total = sum(transfer_tool(run_index, step).amount_cents for step in range(steps))
        cut_own_connections_once()
        return total

    @app.step(name="make_blob")
    def make_blob(size: int) -> str:
        cut_own_connections_once()
        return "x" * size

    @app.workflow(name=BLOB_WORKFLOW)
    def blob(ctx: cairn.Context, size: int) -> int:
        """One step whose result is larger than the inline limit: it is stored
        as an artifact (``put_artifact``) before the step is recorded."""
        return len(make_blob(size))

    @app.step(name="hold")
    def hold(tenant: str, seconds: float) -> None:
        """Occupy a slot for ``seconds``; the effects file gets when (in
        this process) the step began and ended, for the queue tests."""
        began = time.time()
        time.sleep(seconds)
        execution = current()
        assert execution is not None
        append_effect(effects_path, {"kind": "hold", "run_id": execution.run_id, "tenant": tenant,
                                     "began": began, "ended": time.time(), "pid": os.getpid()})

    @app.workflow(name=PACED_WORKFLOW)
    def paced(ctx: cairn.Context, tenant: str, seconds: float) -> None:
        """One step that holds its slot for ``seconds`` (queue limit tests)."""
        hold(tenant, seconds)

    return app
