"""A refund agent that moves real (fake) money: the exactly-once demo.

The agent reviews a batch of orders, asks a model which ones deserve a refund,
and issues each refund through the bank (``cairn.demo.bank``, a separate
process with its own database). ``issue_refund`` is a ``write`` tool: before
it runs, its intent (operation id and arguments) is committed behind an fsync
barrier; it sends the operation id as the bank's idempotency key; and after a
crash between "the bank committed" and "Cairn recorded it", its ``reconcile``
function looks the transfer up *by that key* instead of sending it again.

Two things make that work, and neither is enough alone:

* the bank deduplicates keys, but only the *same* key: an agent that asked its
  model again after a crash would get another decision (another memo, another
  reference) and could well build another request. The model call is
  journaled, so recovery replays the recorded decision instead;
* the operation id is derived from the run and the call's position, so it is
  the same key on every worker and after every crash, and the ledger knows the
  effect is uncertain (intent without result) and asks the bank what happened.

``run_payments_demo`` (``cairn demo payments``) proves it end to end: a worker
is SIGKILLed exactly between the bank committing the 2nd refund and Cairn
recording it; a fresh worker takes over; the bank ends up with exactly one
transfer per refund.

Configuration comes from the environment (the CLI's ``--db`` sets the first):
``$CAIRN_DB`` (the Cairn database), ``$CAIRN_BANK_URL`` (the bank),
``$CAIRN_PAYMENTS_ORDERS`` (optional JSON file of orders replacing the demo's
order book) and ``$CAIRN_PAYMENTS_ASKS`` (optional file that counts model
calls across processes, so "asked again" really means a different answer).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

import cairn
from cairn.demo.bank import BANK_URL_ENV, BankClient, BankProcess, BankRejected, Transfer
from cairn.demo.children import Worker, child_env
from cairn.models import Message, ModelRequest, ModelResponse, ScriptedModel, ToolCall
from cairn.models.scripted import Policy

#: Built without arguments so the database comes from ``$CAIRN_DB``.
app = cairn.App()

WORKFLOW = "refund-agent"
APP_SPEC = "cairn.demo.payments:app"
ORDERS_ENV = "CAIRN_PAYMENTS_ORDERS"
ASKS_ENV = "CAIRN_PAYMENTS_ASKS"
#: The shop's account at the bank: every refund is paid from it.
MERCHANT_ACCOUNT = "acct_cairn_shop"
MODEL_ID = "scripted-refunds-1"


class Order(msgspec.Struct, frozen=True, kw_only=True):
    order_id: str
    customer: str
    account: str  # the customer's bank account, where a refund goes
    item: str
    amount_cents: int
    status: str  # "delivered", "refund_requested", ...
    note: str = ""


DEMO_ORDERS: tuple[Order, ...] = (
    Order(order_id="ORD-1041", customer="Ana Lima", account="acct_ana_lima", item="espresso grinder",
          amount_cents=18_900, status="refund_requested", note="arrived with a cracked hopper"),
    Order(order_id="ORD-1042", customer="Ben Okafor", account="acct_ben_okafor",
          item="noise-cancelling headphones", amount_cents=24_950, status="refund_requested",
          note="wrong colour shipped; returned unopened"),
    Order(order_id="ORD-1043", customer="Chen Wei", account="acct_chen_wei", item="hiking boots",
          amount_cents=13_400, status="delivered", note="asked about sizing; no refund requested"),
    Order(order_id="ORD-1044", customer="Dara Novak", account="acct_dara_novak", item="desk lamp",
          amount_cents=4_599, status="refund_requested", note="never delivered: the carrier lost it"),
)


class RefundReport(msgspec.Struct, frozen=True, kw_only=True):
    refunds: list[Transfer]
    skipped: list[str]
    total_cents: int
    summary: str


def load_orders() -> dict[str, Order]:
    """The order book: ``$CAIRN_PAYMENTS_ORDERS`` (a JSON list of orders) if
    set, else the demo's four orders."""
    path = os.environ.get(ORDERS_ENV)
    orders = (msgspec.json.decode(Path(path).read_bytes(), type=list[Order]) if path
              else list(DEMO_ORDERS))
    return {order.order_id: order for order in orders}


# -- the model ------------------------------------------------------------------------------------


def refund_reference(n: int, order_id: str) -> str:
    """The reference the model writes into a refund memo on its ``n``-th
    answer: stable for one answer, different for the next (like a sampled LLM
    reply that invents an id)."""
    return "RF-" + hashlib.sha256(f"{n}:{order_id}".encode()).hexdigest()[:6].upper()


def refund_policy(request: ModelRequest, n: int) -> Message:
    """Refund every order whose customer asked for it, in full; skip the rest."""
    orders = msgspec.json.decode((request.messages[-1].text or "{}").encode())["orders"]
    calls: list[ToolCall] = []
    skipped: list[str] = []
    for order in orders:
        if order["status"] != "refund_requested":
            skipped.append(order["order_id"])
            continue
        memo = f"Refund {order['order_id']} ({order['note']}) ref {refund_reference(n, order['order_id'])}"
        arguments = {"to": order["account"], "amount_cents": order["amount_cents"], "memo": memo}
        calls.append(ToolCall(id=f"call_{n}_{len(calls)}", name="issue_refund",
                              arguments=json.dumps(arguments)))
    text = f"Refunding {len(calls)} order(s) in full; no refund for {', '.join(skipped) or 'none'}."
    return Message(role="assistant", content=text, tool_calls=tuple(calls))


class CountedModel:
    """A ``ScriptedModel`` whose call count survives processes.

    With ``$<asks_env>`` naming a file, every ask appends one line to it (under
    a file lock) and the policy's ``n`` is the number of asks before this one,
    in *any* process. So a worker that re-asked after a crash would get a
    different answer, as from a real LLM, and tests can count the asks.
    """

    def __init__(self, policy: Policy, model_id: str = MODEL_ID, asks_env: str = ASKS_ENV) -> None:
        self.model_id = model_id
        self.policy = policy
        self.asks_env = asks_env
        self._scripted = ScriptedModel(policy, model_id)
        self._lock = threading.Lock()

    def complete(self, request: ModelRequest) -> ModelResponse:
        path = os.environ.get(self.asks_env)
        with self._lock:
            if path:
                self._scripted.calls = record_ask(Path(path))
            return self._scripted.complete(request)


def record_ask(path: Path) -> int:
    """Append one ask to ``path``; return how many were recorded before it."""
    with path.open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.seek(0)
            before = sum(1 for line in fh if line.strip())
            fh.write(json.dumps({"pid": os.getpid(), "at": time.time()}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return before


def count_asks(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


MODEL = CountedModel(refund_policy)

SYSTEM_PROMPT = ("You are a refunds agent for a small shop. Issue a refund with the issue_refund tool for "
                 "each order whose customer asked for one; explain what you skip.")
REFUND_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "issue_refund",
        "description": "Pay money back to a customer's account.",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "amount_cents": {"type": "integer"},
                           "memo": {"type": "string"}},
            "required": ["to", "amount_cents", "memo"],
        },
    },
}


def refund_request(orders: Sequence[Order]) -> list[Message]:
    """The conversation the agent sends the model for ``orders``."""
    payload = json.dumps({"orders": [msgspec.to_builtins(order) for order in orders]})
    return [Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=payload)]


# -- tools, a step and the workflow ---------------------------------------------------------------


def _lookup_order(order_id: str) -> Order:
    order = load_orders().get(order_id)
    if order is None:
        raise cairn.TerminalError(f"no order {order_id!r} in the order book")
    return order


#: Reading the order book changes nothing: after a crash it simply runs again.
lookup_order: cairn.Tool[[str], Order] = app.tool(effect="read", name="lookup_order")(_lookup_order)


def find_refund(op: cairn.Operation) -> cairn.Done[Transfer] | cairn.NotFound:
    """Reconcile an uncertain refund: did the bank commit the transfer whose
    idempotency key is this operation's id? (Raising means "cannot tell yet":
    Cairn asks again later.)"""
    transfer = BankClient.from_env().transfer_by_key(op.operation_id)
    return cairn.Done(transfer) if transfer is not None else cairn.NotFound()


def _issue_refund(op: cairn.Operation, to: str, amount_cents: int, memo: str) -> Transfer:
    try:
        return BankClient.from_env().create_transfer(
            idempotency_key=op.operation_id, from_account=MERCHANT_ACCOUNT, to_account=to,
            amount_cents=amount_cents, memo=memo)
    except BankRejected as exc:  # refused before it was applied: a definite failure
        raise cairn.EffectNotApplied(str(exc)) from exc


#: Moves money: at most once, keyed by the operation id, reconciled by key.
issue_refund: cairn.Tool[[str, int, str], Transfer] = app.tool(
    effect="write", name="issue_refund", reconcile=find_refund)(_issue_refund)


def _write_report(orders: list[Order], refunds: list[Transfer], note: str) -> RefundReport:
    refunded = {t.to_account for t in refunds}
    skipped = [o.order_id for o in orders if o.account not in refunded]
    total = sum(t.amount_cents for t in refunds)
    summary = f"{len(refunds)} refund(s), {total / 100:.2f} in total; skipped {len(skipped)}. {note}"
    return RefundReport(refunds=refunds, skipped=skipped, total_cents=total, summary=summary)


write_report = app.step(name="write_report")(_write_report)


def _refund_agent(ctx: cairn.Context, order_ids: list[str]) -> RefundReport:
    """Look the orders up, let the model decide, issue the refunds, report."""
    orders = [lookup_order(order_id) for order_id in order_ids]
    reply = ctx.model(MODEL, refund_request(orders), tools=[REFUND_TOOL_SCHEMA])
    refunds: list[Transfer] = []
    for call in reply.message.tool_calls:
        if call.name != "issue_refund":
            raise cairn.TerminalError(f"the model asked for an unknown tool {call.name!r}")
        arguments = call.parsed_arguments()
        refunds.append(issue_refund(str(arguments["to"]), int(arguments["amount_cents"]),
                                    str(arguments["memo"])))
    return write_report(orders, refunds, reply.message.text)


refund_agent = app.workflow(name=WORKFLOW)(_refund_agent)


def open_app(db: str, **options: Any) -> cairn.App:
    """A fresh App on ``db`` serving the refund agent (the module's ``app`` is
    bound to ``$CAIRN_DB`` as it was at import)."""
    fresh = cairn.App(db, **options)
    fresh.workflow(name=WORKFLOW)(_refund_agent)
    return fresh


def refund_tool_hits(order_count: int, nth_refund: int) -> int:
    """Which hit of the ``tool.after_effect`` / ``tool.after_record`` fault
    points is the ``nth_refund``-th refund: every order lookup (a tool too)
    passes them first. (``tool.after_intent`` only counts write tools.)"""
    return order_count + nth_refund


# -- the demo -------------------------------------------------------------------------------------

DEMO_LEASE = 1.0
DEADLINE = 45.0
POLL = 0.05
CRASH_AT_REFUND = 2


def _sqlite_file(url: str) -> Path | None:
    if url.startswith("sqlite://"):
        rest = url.removeprefix("sqlite://")
        return Path(rest[1:]) if rest.startswith("/") and len(rest) > 1 else None
    return None if "://" in url else Path(url)


@dataclass
class _PaymentsDemo:
    console: Console
    db_url: str
    workdir: Path
    workers: list[Worker] = field(default_factory=list)
    bank: BankProcess | None = None
    seen_seq: int = 0

    def env(self, bank_url: str, faults: str | None) -> dict[str, str]:
        env = child_env(drop=("CAIRN_FAULTS", ORDERS_ENV))
        env.update({"CAIRN_DB": self.db_url, BANK_URL_ENV: bank_url, ASKS_ENV: str(self.asks_path),
                    "PYTHONUNBUFFERED": "1"})
        if faults:
            env["CAIRN_FAULTS"] = faults
        return env

    @property
    def asks_path(self) -> Path:
        return self.workdir / "model-asks.jsonl"

    def spawn(self, name: str, bank_url: str, faults: str | None = None) -> Worker:
        command = [sys.executable, "-m", "cairn", "worker", "--app", APP_SPEC, "--db", self.db_url,
                   "--worker-id", name, "--lease", f"{DEMO_LEASE:g}"]
        worker = Worker.spawn(name, command, self.workdir, self.env(bank_url, faults))
        self.workers.append(worker)
        return worker

    def cleanup(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.bank is not None:
            self.bank.stop()

    # -- the story -------------------------------------------------------------------------------

    def run(self) -> int:
        self.bank = BankProcess.start(self.workdir / "bank.db")
        demo_app = open_app(self.db_url, lease_seconds=DEMO_LEASE)
        try:
            return self._run(demo_app, self.bank)
        finally:
            demo_app.close()

    def _run(self, demo_app: cairn.App, bank_process: BankProcess) -> int:
        console = self.console
        order_ids = [order.order_id for order in DEMO_ORDERS]
        expected = [(o.account, o.amount_cents) for o in DEMO_ORDERS if o.status == "refund_requested"]
        hit = refund_tool_hits(len(order_ids), CRASH_AT_REFUND)
        faults = f"tool.after_effect@{hit}"
        run_id = demo_app.start(WORKFLOW, order_ids=order_ids).run_id

        console.print(Text("Cairn demo: a refund agent, a worker killed after the bank moved the money "
                           "but before Cairn recorded it", style="bold"))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("bank", f"{bank_process.url}  (pid {bank_process.pid}, its own SQLite ledger)")
        grid.add_row("database", self.db_url)
        grid.add_row("run", f"{run_id} ({WORKFLOW}: {len(order_ids)} orders, {len(expected)} refunds due)")
        grid.add_row("plan", f"payments-worker-1 runs with CAIRN_FAULTS={faults}: it SIGKILLs itself right "
                             f"after refund #{CRASH_AT_REFUND} returns from the bank ({len(order_ids)} "
                             "order lookups pass that point first); then payments-worker-2 takes over")
        console.print(grid)
        console.print()

        started = time.monotonic()
        first = self.spawn("payments-worker-1", bank_process.url, faults)
        console.print(f"[cyan]▶[/] started payments-worker-1 (pid {first.pid})")
        def died() -> bool:
            return first.proc.poll() is not None or demo_app.get_run(run_id).status.terminal

        self._follow(demo_app, run_id, until=died, started=started)
        code = first.proc.poll()
        if code != -signal.SIGKILL:
            first.stop()
            console.print(f"[red]error:[/] payments-worker-1 did not die at the fault point (exit {code}); "
                          "its log:")
            console.print(first.log_tail(), markup=False)
            return 1
        at_crash = bank_process.client().transfers()
        uncertain = [op for op in demo_app.operations(run_id) if op["status"] == "uncertain"]
        console.print()
        console.print(f"[bold red]✗ SIGKILL[/] payments-worker-1 (pid {first.pid}) died at "
                      f"tool.after_effect: the bank holds {len(at_crash)} transfer(s), but the journal has "
                      f"{len(uncertain)} uncertain operation(s) (an intent without a result):")
        for op in uncertain:
            console.print(f"    position {op['position']} {op['tool']}  operation_id {op['operation_id']}")
        console.print("  A blind retry would pay twice. Instead the next worker reconciles: it asks the bank "
                      "for the transfer with that idempotency key.")
        console.print()

        second = self.spawn("payments-worker-2", bank_process.url)
        console.print(f"[cyan]▶[/] started payments-worker-2 (pid {second.pid}); it takes the run over once "
                      f"the dead worker's {DEMO_LEASE:g} s lease expires")

        def finished() -> bool:
            return demo_app.get_run(run_id).status.terminal or second.proc.poll() is not None

        self._follow(demo_app, run_id, until=finished, started=started)
        elapsed = time.monotonic() - started
        second.stop()
        return self._summarize(demo_app, run_id, bank_process, expected, elapsed)

    def _follow(
        self, demo_app: cairn.App, run_id: str, *, until: Callable[[], bool], started: float
    ) -> None:
        """Narrate new history entries until ``until()`` holds (or the deadline)."""
        while True:
            done = until()
            for event in demo_app.store.history(run_id, self.seen_seq):
                self.seen_seq = event.seq
                self._narrate(event)
            if done:
                return
            if time.monotonic() - started > DEADLINE:
                raise TimeoutError(f"the demo did not finish within {DEADLINE:g} s")
            time.sleep(POLL)

    def _narrate(self, event: cairn.HistoryEvent) -> None:
        kind, detail = event.event, event.detail or {}
        out = self.console.print
        if kind is cairn.EventType.OP_INTENT:
            out(f"  [blue]•[/] #{event.position:<2} op.intent      {event.name}  "
                f"key {detail.get('operation_id')}  [dim](durable before the bank is called)[/]")
        elif kind is cairn.EventType.STEP_COMPLETED:
            label = event.name if event.step_kind in ("tool", "step") else f"ctx.{event.step_kind}()"
            note = "  [bold yellow]reconciled: done (found at the bank by key; not sent again)[/]" \
                if detail.get("reconciled") == "done" else ""
            out(f"  [green]✓[/] #{event.position:<2} step.completed {label}  [dim]{event.worker}[/]{note}")
        elif kind is cairn.EventType.OP_RECONCILED:
            out(f"  [yellow]?[/] #{event.position:<2} op.reconciled  {event.name}: {detail.get('outcome')}")
        elif kind is cairn.EventType.LEASE_LOST:
            out(f"  [yellow]⚑[/] lease.lost        {detail.get('worker')} (epoch {detail.get('epoch')})")
        elif kind is cairn.EventType.LEASE_TAKEN_OVER:
            out(f"  [yellow]⚑[/] lease.taken_over  by {event.worker} (epoch {event.epoch}: the dead "
                "worker is fenced out)")
        elif kind in (cairn.EventType.RUN_STARTED, cairn.EventType.RUN_COMPLETED, cairn.EventType.RUN_FAILED,
                      cairn.EventType.RUN_QUARANTINED, cairn.EventType.RUN_NEEDS_ATTENTION):
            out(f"  [cyan]▶[/] {kind.value}  [dim]{event.worker or ''}[/]")

    def _summarize(
        self, demo_app: cairn.App, run_id: str, bank_process: BankProcess,
        expected: list[tuple[str, int]], elapsed: float,
    ) -> int:
        console = self.console
        record = demo_app.get_run(run_id)
        history = demo_app.history(run_id)
        verdict = judge_refunds(history, bank_process.client().transfers(), expected)
        console.print()
        table = Table(title="the bank's ledger (its own database)", title_justify="left", header_style="bold")
        table.add_column("transfer", no_wrap=True)
        table.add_column("idempotency key = operation id", no_wrap=True, min_width=36)
        for column in ("to", "amount", "memo", "journal"):
            table.add_column(column)
        for transfer in verdict.transfers:
            position = verdict.positions.get(transfer.idempotency_key)
            how = verdict.how.get(transfer.idempotency_key, "not in the journal!")
            table.add_row(transfer.id, transfer.idempotency_key, transfer.to_account,
                          f"{transfer.amount_cents / 100:.2f}", transfer.memo,
                          Text(f"#{position} {how}", style="yellow" if "reconciled" in how else "green"))
        console.print(table)
        console.print()

        console.print(Text("the run's history around the crash", style="bold"))
        crash = verdict.crash_position
        for event in history:
            if crash is None or (event.position not in (None, crash) or event.event in _BORING):
                continue
            if event.event is cairn.EventType.LEASE_LOST:
                console.print("    [red]✗ (crash: SIGKILL between the bank's commit and Cairn's record)[/]")
            shown = {k: v for k, v in (event.detail or {}).items() if k in ("operation_id", "reconciled",
                                                                             "worker", "from_worker")}
            console.print(f"    seq {event.seq:<3} {event.event.value:<17} "
                          f"{event.name or '':<13} {event.worker or '-':<18} {json.dumps(shown)}")
        console.print()

        asks = count_asks(self.asks_path)
        decision = next((e for e in history if e.step_kind == "model" and e.event is
                         cairn.EventType.STEP_COMPLETED), None)
        if decision is not None:
            orders = list(DEMO_ORDERS)
            again = refund_policy(ModelRequest(tuple(refund_request(orders))), asks)
            recorded = [t.memo for t in verdict.transfers]
            other = [json.loads(call.arguments)["memo"] for call in again.tool_calls]
            changed = [memo for memo in other if memo not in recorded]
            console.print(f"model asked {asks} time(s) across both workers: the recorded decision was "
                          "replayed.")
            if changed:
                console.print(f"  asked again, it would have decided differently ({len(changed)} other "
                              f"memo(s), e.g. {changed[0]!r}): replaying the journaled decision keeps the "
                              "recovered run identical to what the bank already holds.")
        console.print(f"run {run_id} [bold]{record.status.value}[/] in {elapsed:.1f} s "
                      f"(epoch {record.epoch}, recoveries {record.recoveries})")
        ok = verdict.ok and record.status is cairn.RunStatus.COMPLETED
        style = "bold green" if ok else "bold red"
        console.print(Text("verdict: ", style=style) + Text(verdict.message, style=style))
        console.print(f"inspect: cairn events {run_id} --db {self.db_url}", markup=False)
        return 0 if ok else 1


_BORING = frozenset({cairn.EventType.RUN_CREATED})


@dataclass(frozen=True)
class RefundVerdict:
    ok: bool
    message: str
    transfers: list[Transfer]
    #: idempotency key -> journal position of its intent
    positions: dict[str, int]
    #: idempotency key -> how the journal settled it ("recorded", "reconciled: done", ...)
    how: dict[str, str]
    #: the position whose result was settled by reconciliation, if any
    crash_position: int | None


def judge_refunds(
    history: Sequence[cairn.HistoryEvent], transfers: Sequence[Transfer], expected: Sequence[tuple[str, int]]
) -> RefundVerdict:
    """Does the bank hold exactly the expected refunds, one per intent, keyed by
    the operation ids the journal recorded?"""
    intents = {str((e.detail or {})["operation_id"]): int(e.position or 0) for e in history
               if e.event is cairn.EventType.OP_INTENT and e.name == "issue_refund"}
    how: dict[str, str] = {}
    crash: int | None = None
    for event in history:
        if event.event is cairn.EventType.STEP_COMPLETED and event.name == "issue_refund":
            key = str((event.detail or {}).get("operation_id"))
            if (event.detail or {}).get("reconciled") == "done":
                how[key] = "reconciled: done"
                crash = event.position
            else:
                how[key] = "recorded"
    keys = Counter(t.idempotency_key for t in transfers)
    problems: list[str] = []
    duplicates = sorted(k for k, n in keys.items() if n > 1)
    if duplicates:
        problems.append(f"duplicate keys at the bank: {duplicates}")
    if set(keys) != set(intents):
        problems.append(f"bank keys {sorted(keys)} differ from the journal's operation ids {sorted(intents)}")
    got = sorted((t.to_account, t.amount_cents) for t in transfers)
    if got != sorted(expected):
        problems.append(f"bank holds {got}, expected {sorted(expected)}")
    unsettled = sorted(set(intents) - set(how))
    if unsettled:
        problems.append(f"operations without a recorded result: {unsettled}")
    if problems:
        message = "; ".join(problems)
    else:
        message = (f"the bank holds exactly {len(transfers)} transfer(s), one per refund, each keyed by its "
                   "operation id" + (f"; the one in the crash window (#{crash}) was reconciled, not resent"
                                     if crash is not None else ""))
    return RefundVerdict(not problems, message, list(transfers), intents, how, crash)


def _choose_db(db_url: str | None) -> tuple[str, Path]:
    if db_url is None:
        directory = Path(".cairn").resolve()
        directory.mkdir(parents=True, exist_ok=True)
        file = directory / f"payments-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.db"
        return f"sqlite:///{file}", file
    found = _sqlite_file(db_url)
    if found is None:
        raise ValueError(f"the payments demo needs a SQLite database file its worker processes can share, "
                         f"not {db_url!r}")
    return f"sqlite:///{found.resolve()}", found.resolve()


def _exit_on(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into SystemExit so the demo's children are always stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _exit_on) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_payments_demo(db_url: str | None, console: Console) -> int:
    """``cairn demo payments``: 0 only if the bank ends with exactly the
    expected transfers (one per refund, none twice) and the run completed."""
    try:
        url, _ = _choose_db(db_url)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="cairn-payments-"))
    demo = _PaymentsDemo(console, url, workdir)
    code = 1
    try:
        with _signals_raise():
            code = demo.run()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the demo's bank and workers[/]")
        code = 130
    except (TimeoutError, RuntimeError) as exc:
        console.print(f"[red]error:[/] {exc}")
        for worker in demo.workers:
            console.print(f"--- {worker.name} ---\n{worker.log_tail()}", markup=False, style="dim")
        code = 1
    finally:
        demo.cleanup()
    if code == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        console.print(f"bank ledger, model asks and worker logs kept in {workdir}", markup=False)
    return code
