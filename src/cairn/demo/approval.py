"""A refund that waits for a person: the approval demo (``cairn demo approval``).

An agent reads a support ticket, a (scripted, offline) model drafts a refund,
and the refund goes through ``issue_refund``, a *protected* ``write`` tool:
refunds over 100.00 need approval. The run suspends before the tool's intent
with the exact arguments recorded, and waits for a person. The demo shows:

* the waiting run holds no worker slot: the worker (one slot) serves another,
  small refund, which needs no approval, while the first one waits;
* a worker killed (SIGKILL) during the wait loses nothing: the request is in
  the database, listed by ``cairn approvals``, and a fresh worker goes on;
* a person edits the amount (``cairn approve RUN REQUEST --edit JSON``, run
  for real) and the run pays exactly the edited amount, once: the bank (a
  separate process with its own ledger, deduplicating by idempotency key)
  holds one transfer of that amount, keyed by the tool call's operation id.

Everything comes from the environment for the worker processes: ``$CAIRN_DB``
(set by the demo) and ``$CAIRN_BANK_URL``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

import cairn
from cairn.demo.bank import BANK_URL_ENV, BankClient, BankProcess, BankRejected, Transfer
from cairn.demo.children import Worker, child_env
from cairn.models import Message, ModelRequest, ToolCall
from cairn.models.scripted import ScriptedModel

#: Built without arguments so the database comes from ``$CAIRN_DB``.
app = cairn.App()

WORKFLOW = "refund-with-approval"
APP_SPEC = "cairn.demo.approval:app"
MERCHANT = "acct_cairn_shop"
#: refunds above this many cents need a person's approval
APPROVAL_OVER = 10_000
LEASE = 1.0
DEADLINE = 45.0


def draft_policy(request: ModelRequest, n: int) -> Message:
    """The 'model': refund the ticket's order in full (the person may disagree)."""
    ticket = json.loads(request.messages[-1].text or "{}")
    arguments = {"to": ticket["account"], "amount_cents": ticket["amount_cents"],
                 "memo": f"refund {ticket['order']}: {ticket['complaint']}"}
    call = ToolCall(id=f"call-{n}", name="issue_refund", arguments=json.dumps(arguments))
    return Message(role="assistant", content="Drafted a full refund.", tool_calls=(call,))


MODEL = ScriptedModel(draft_policy, model_id="scripted-drafter-1")


def find_refund(op: cairn.Operation) -> cairn.Done[Transfer] | cairn.NotFound:
    """After a crash: did the bank commit the transfer keyed by this operation id?"""
    found = BankClient.from_env().transfer_by_key(op.operation_id)
    return cairn.Done(found) if found is not None else cairn.NotFound()


def needs_approval(arguments: dict[str, Any]) -> bool:
    """The policy: a person approves every refund over ``APPROVAL_OVER`` cents."""
    return int(arguments["amount_cents"]) > APPROVAL_OVER


def _issue_refund(op: cairn.Operation, to: str, amount_cents: int, memo: str) -> Transfer:
    try:
        return BankClient.from_env().create_transfer(idempotency_key=op.operation_id, from_account=MERCHANT,
                                                     to_account=to, amount_cents=amount_cents, memo=memo)
    except BankRejected as exc:
        raise cairn.EffectNotApplied(str(exc)) from exc


issue_refund = app.tool(effect="write", name="issue_refund", reconcile=find_refund,
                        approval=needs_approval)(_issue_refund)


def _refund(ctx: cairn.Context, ticket: dict[str, Any]) -> dict[str, Any]:
    """Draft a refund with the model, then issue it (approved first if large)."""
    reply = ctx.model(MODEL, [Message(role="system", content="Draft a refund for this ticket."),
                              Message(role="user", content=json.dumps(ticket))])
    (call,) = reply.message.tool_calls
    draft = call.parsed_arguments()
    try:
        transfer = issue_refund(str(draft["to"]), int(draft["amount_cents"]), str(draft["memo"]))
    except cairn.ApprovalRejected as exc:
        return {"paid": None, "refused": exc.decision.comment or exc.decision.status.value}
    return {"paid": transfer.amount_cents, "transfer": transfer.id}


refund = app.workflow(name=WORKFLOW)(_refund)


def open_app(db: str) -> cairn.App:
    """A fresh App on ``db`` serving the workflow (the module's ``app`` is bound at import)."""
    fresh = cairn.App(db, lease_seconds=LEASE)
    fresh.tool(effect="write", name="issue_refund", reconcile=find_refund, approval=needs_approval)(
        _issue_refund)
    fresh.workflow(name=WORKFLOW)(_refund)
    return fresh


BIG = {"order": "ORD-2077", "account": "acct_ana_lima", "amount_cents": 24_950,
       "complaint": "headphones arrived with one dead ear cup"}
SMALL = {"order": "ORD-2078", "account": "acct_ben_okafor", "amount_cents": 1_299,
         "complaint": "charger missing from the box"}
#: what the person approves instead: half the price (the customer keeps the headphones)
EDITED_CENTS = 12_475


class _ApprovalDemo:
    def __init__(self, console: Console, db_url: str, workdir: Path) -> None:
        self.console = console
        self.db_url = db_url
        self.workdir = workdir
        self.workers: list[Worker] = []
        self.bank: BankProcess | None = None

    def env(self) -> dict[str, str]:
        assert self.bank is not None
        env = child_env(drop=("CAIRN_FAULTS",))
        env.update({"CAIRN_DB": self.db_url, BANK_URL_ENV: self.bank.url, "PYTHONUNBUFFERED": "1"})
        return env

    def spawn(self, name: str) -> Worker:
        command = [sys.executable, "-m", "cairn", "worker", "--app", APP_SPEC, "--db", self.db_url,
                   "--worker-id", name, "--concurrency", "1", "--lease", f"{LEASE:g}", "--poll", "0.05"]
        worker = Worker.spawn(name, command, self.workdir, self.env())
        self.workers.append(worker)
        return worker

    def cleanup(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.bank is not None:
            self.bank.stop()

    def wait(self, what: str, condition: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + DEADLINE
        while True:
            value = condition()
            if value:
                return value
            for worker in self.workers:
                if worker.proc.poll() is not None and not getattr(worker, "killed", False):
                    raise RuntimeError(f"{worker.name} exited ({worker.proc.returncode}) while waiting for "
                                       f"{what}:\n{worker.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {DEADLINE:g} s waiting for {what}")
            time.sleep(0.05)

    def say(self, mark: str, style: str, text: str) -> None:
        self.console.print(Text(f"{mark} ", style=style) + Text(text))

    def run(self) -> int:
        self.bank = BankProcess.start(self.workdir / "bank.db")
        demo = open_app(self.db_url)
        try:
            return self._story(demo, self.bank)
        finally:
            demo.close()

    def _story(self, demo: cairn.App, bank_process: BankProcess) -> int:
        console = self.console
        started = time.monotonic()
        console.print(Text("Cairn demo: a refund that waits for a person, a worker killed while it waits, "
                           "an edited amount paid exactly once", style="bold"))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("bank", f"{bank_process.url}  (pid {bank_process.pid}, its own ledger)")
        grid.add_row("database", self.db_url)
        grid.add_row("policy", f"issue_refund is a protected tool: refunds over {APPROVAL_OVER / 100:.2f} "
                               "need approval")
        console.print(grid)
        console.print()

        first = self.spawn("approval-worker-1")
        self.say("▶", "cyan", f"started approval-worker-1 (pid {first.proc.pid}), one slot")
        big = demo.start(WORKFLOW, BIG).run_id
        self.say("▶", "cyan", f"run {big}: the model drafts a full refund of {_money(BIG['amount_cents'])} "
                              f"for {BIG['order']}")
        (request,) = self.wait("the approval request", lambda: demo.approvals(run_id=big))
        record = self.wait("the run to suspend", lambda: (r := demo.get_run(big)).status
                           is cairn.RunStatus.SUSPENDED and r)
        self.say("⏸", "yellow", f"approval requested: {request.request_id} ({request.action} "
                                f"{json.dumps(request.details, sort_keys=True)})")
        self.say(" ", "", f"the run is {record.status.value}, owner {record.owner or 'none'}: it holds no "
                          "worker, no slot, no thread")
        small = demo.start(WORKFLOW, SMALL).run_id
        served = demo.handle(small).result(timeout=DEADLINE)
        self.say("✓", "green", f"meanwhile the same one-slot worker paid a small refund of "
                               f"{int(served['paid']) / 100:.2f} (no approval needed): the waiting run "
                               "held no slot")

        first.proc.kill()
        first.proc.wait(timeout=10)
        first.killed = True  # type: ignore[attr-defined]
        self.say("✗", "bold red", f"SIGKILL approval-worker-1 (pid {first.proc.pid}) while the run waits")
        (still,) = demo.approvals(run_id=big)
        asked_at = time.strftime("%H:%M:%S", time.localtime(still.requested_at))
        self.say(" ", "", f"nothing lost: `cairn approvals` still lists {still.request_id} "
                          f"({still.status.value}, requested at {asked_at})")
        second = self.spawn("approval-worker-2")
        self.say("▶", "cyan", f"started approval-worker-2 (pid {second.proc.pid})")

        edit = {**request.details, "amount_cents": EDITED_CENTS}
        command = [sys.executable, "-m", "cairn", "approve", big, request.request_id, "--db", self.db_url,
                   "--edit", json.dumps(edit, sort_keys=True), "--comment", "half: the customer keeps them"]
        shown = shlex.join(["cairn", *command[3:]])
        console.print(Text(f"$ {shown}", style="bold"), soft_wrap=True)
        decided = subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=DEADLINE,
                                 check=False)
        console.print(Text((decided.stdout or decided.stderr).strip()), soft_wrap=True)
        if decided.returncode != 0:
            return 1
        result = demo.handle(big).result(timeout=DEADLINE)
        self.say("✓", "green", f"run {big} completed on approval-worker-2: paid {result['paid'] / 100:.2f}")
        return self._verdict(demo, big, bank_process, time.monotonic() - started)

    def _verdict(self, demo: cairn.App, run_id: str, bank_process: BankProcess, elapsed: float) -> int:
        console = self.console
        transfers = bank_process.client().transfers()
        ours = [t for t in transfers if t.to_account == BIG["account"]]
        intents = [e for e in demo.history(run_id) if e.event is cairn.EventType.OP_INTENT]
        keys = [str((e.detail or {}).get("operation_id")) for e in intents]
        decision = next(e for e in demo.history(run_id) if e.step_kind == "decision")
        table = Table(title="the bank's ledger (its own database)", title_justify="left", header_style="bold")
        table.add_column("transfer", no_wrap=True)
        table.add_column("idempotency key = operation id", no_wrap=True, min_width=36)
        for column in ("to", "amount", "memo"):
            table.add_column(column)
        for t in transfers:
            table.add_row(t.id, t.idempotency_key, t.to_account, f"{t.amount_cents / 100:.2f}", t.memo)
        console.print()
        console.print(table)
        detail = decision.detail or {}
        console.print(Text(f"the run's history records the decision: {detail.get('decision')} by "
                           f"{detail.get('sender')}, at position {decision.position}, before the intent at "
                           f"position {intents[0].position if intents else '?'}"))
        problems = []
        if [t.amount_cents for t in ours] != [EDITED_CENTS]:
            problems.append(f"the bank paid {[t.amount_cents for t in ours]} to {BIG['account']}, "
                            f"not exactly [{EDITED_CENTS}]")
        if [t.idempotency_key for t in ours] != keys:
            problems.append(f"the bank's keys {[t.idempotency_key for t in ours]} are not the journal's "
                            f"operation ids {keys}")
        ok = not problems
        message = (f"the bank holds exactly one refund to {BIG['account']}, of the edited "
                   f"{EDITED_CENTS / 100:.2f} (drafted: {_money(BIG['amount_cents'])}), keyed by its "
                   "operation id" if ok else "; ".join(problems))
        style = "bold green" if ok else "bold red"
        console.print(Text(f"done in {elapsed:.1f} s. ") + Text("verdict: " + message, style=style))
        console.print(Text(f"inspect: cairn show {run_id} --db {self.db_url}"))
        return 0 if ok else 1


def _money(cents: object) -> str:
    return f"{int(str(cents)) / 100:.2f}"


def _choose_db(db_url: str | None) -> str:
    if db_url is None:
        directory = Path(".cairn").resolve()
        directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return f"sqlite:///{directory / f'approval-{stamp}-{os.getpid()}.db'}"
    rest = db_url.removeprefix("sqlite://")
    path = Path(rest[1:] if db_url.startswith("sqlite://") else db_url)
    if (db_url.startswith("sqlite://") and not rest.startswith("/")) or "://" in str(path):
        raise ValueError(f"the approval demo needs a SQLite database file its worker processes can share, "
                         f"not {db_url!r}")
    return f"sqlite:///{path.resolve()}"


def run_approval_demo(db_url: str | None, console: Console) -> int:
    """``cairn demo approval``: 0 only if the run paid exactly the edited amount, once."""
    try:
        url = _choose_db(db_url)
    except ValueError as exc:
        console.print(Text(f"error: {exc}", style="red"))
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="cairn-approval-"))
    demo = _ApprovalDemo(console, url, workdir)
    code = 1
    try:
        code = demo.run()
    except KeyboardInterrupt:
        code = 130
    except (TimeoutError, RuntimeError) as exc:
        console.print(Text(f"error: {exc}", style="red"))
        for worker in demo.workers:
            console.print(Text(f"--- {worker.name} ---\n{worker.log_tail()}", style="dim"))
    finally:
        demo.cleanup()
    if code != 0:
        console.print(Text(f"bank ledger and worker logs kept in {workdir}"))
    return code
