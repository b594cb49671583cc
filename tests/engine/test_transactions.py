"""Transactional steps (``@app.transaction``) on both backends: the body's
rows and the step's record commit together or not at all; a failure rolls
the rows back and goes to the retry policy; replay never runs the body; the
handle refuses what only Cairn may do in its transaction.

The user's table lives in the store's own database (``orders``), created by
a transactional step of its own; ``sql`` writes a statement in the
placeholders of the backend it runs on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.engine.transactions import KIND
from cairn.store.records import EventType
from tests.engine.conftest import Calls, execute_once


def sql(tx: cairn.Tx, statement: str) -> str:
    """``statement`` written with ``?`` placeholders, in ``tx``'s paramstyle."""
    return statement if tx.paramstyle == "qmark" else statement.replace("?", "%s")


def make_orders(app: cairn.App) -> None:
    @app.transaction(name="create-orders")
    def create(tx: cairn.Tx) -> None:
        tx.execute("CREATE TABLE IF NOT EXISTS orders (item TEXT NOT NULL UNIQUE, attempt INTEGER)")

    @app.workflow(name="setup-orders")
    def setup(ctx: cairn.Context) -> None:
        create()

    app.run(setup)


def orders(app: cairn.App) -> list[tuple[Any, ...]]:
    @app.transaction(name="read-orders")
    def read(tx: cairn.Tx) -> list[list[Any]]:
        return [list(row) for row in tx.execute("SELECT item, attempt FROM orders ORDER BY item")]

    @app.workflow(name="read-orders")
    def reader(ctx: cairn.Context) -> list[list[Any]]:
        return read()

    return [tuple(row) for row in app.run(reader)]


def transaction_entries(app: cairn.App, run_id: str) -> list[cairn.HistoryEvent]:
    return [e for e in app.store.history(run_id) if e.step_kind == KIND]


def test_the_rows_and_the_record_commit_together(app: cairn.App, calls: Calls) -> None:
    make_orders(app)

    @app.transaction
    def place(tx: cairn.Tx, item: str) -> str:
        calls.hit("place")
        info = cairn.step_info()
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, ?)"), (item, info.attempt))
        return f"{item}@{info.position}"

    @app.workflow(name="shop")
    def shop(ctx: cairn.Context) -> list[str]:
        return [place("book"), place("pen")]

    handle = app.start(shop)
    assert app.resume(handle.run_id) == ["book@0", "pen@1"]
    assert orders(app) == [("book", 1), ("pen", 1)]
    entries = transaction_entries(app, handle.run_id)
    assert [(e.event, e.name, e.position) for e in entries] == [
        (EventType.STEP_COMPLETED, "place", 0), (EventType.STEP_COMPLETED, "place", 1)]
    assert calls["place"] == 2


def test_replay_returns_the_record_without_running_the_body(app: cairn.App, calls: Calls) -> None:
    make_orders(app)

    @app.transaction
    def place(tx: cairn.Tx, item: str) -> dict[str, int]:
        calls.hit("place")
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), (item,))
        return {"count": int(tx.execute("SELECT count(*) FROM orders").scalar())}

    @app.step(retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))
    def flaky() -> None:
        calls.hit("flaky")
        if calls["flaky"] == 1:
            raise RuntimeError("first attempt fails")

    @app.workflow(name="replayed")
    def replayed(ctx: cairn.Context) -> dict[str, int]:
        placed = place("book")
        flaky()  # the retry suspends the run: the next execution replays ``place``
        return placed

    run_id = app.start(replayed).run_id
    assert execute_once(app, run_id) == "suspended"
    assert app.resume(run_id) == {"count": 1}
    assert calls["place"] == 1  # the body ran once; replay decoded its record
    assert orders(app) == [("book", 1)]


def test_a_body_that_raises_rolls_its_rows_back_and_retries(app: cairn.App, calls: Calls) -> None:
    make_orders(app)

    @app.transaction(retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0, jitter=0))
    def place(tx: cairn.Tx, item: str) -> int:
        calls.hit("place")
        attempt = cairn.step_info().attempt
        insert = sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, ?)")
        tx.execute(insert, (f"{item}-{attempt}", attempt))
        if attempt < 3:
            raise RuntimeError(f"attempt {attempt} fails after its insert")
        return attempt

    @app.workflow(name="retried")
    def retried(ctx: cairn.Context) -> int:
        return place("book")

    run_id = app.start(retried).run_id
    assert app.resume(run_id) == 3
    assert calls["place"] == 3
    assert orders(app) == [("book-3", 3)]  # the rows of the failed attempts were rolled back
    events = [(e.event, e.attempt) for e in transaction_entries(app, run_id)]
    assert events == [(EventType.STEP_RETRIED, 1), (EventType.STEP_RETRIED, 2), (EventType.STEP_COMPLETED, 3)]


def test_a_body_that_fails_for_good_leaves_no_rows(app: cairn.App) -> None:
    make_orders(app)

    @app.transaction
    def place(tx: cairn.Tx) -> None:
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), ("book",))
        raise OSError("the body's own OSError is its failure, not the database's")

    @app.workflow(name="failing")
    def failing(ctx: cairn.Context) -> str:
        try:
            place()
        except cairn.StepFailed as exc:
            return f"{exc.error_type}: {exc.attempts}"
        return "placed"

    assert app.run(failing) == "OSError: 1"
    assert orders(app) == []


def test_a_failed_statement_rolls_back_even_when_the_body_catches_it(app: cairn.App) -> None:
    make_orders(app)

    @app.transaction
    def place(tx: cairn.Tx) -> str:
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), ("book",))
        with contextlib.suppress(cairn.SQLError):
            tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 2)"), ("book",))  # UNIQUE
        return "went on"

    @app.workflow(name="caught")
    def caught(ctx: cairn.Context) -> str:
        try:
            return place()
        except cairn.StepFailed as exc:
            return exc.error_type

    assert app.run(caught) == "SQLError"
    assert orders(app) == []


@pytest.mark.parametrize("statement", [
    "COMMIT", "rollback", "  /* sneaky */ END", "-- a comment\nROLLBACK", "SAVEPOINT s1", "RELEASE s1",
    "BEGIN", "START TRANSACTION", "ABORT", "PREPARE TRANSACTION 'x'", "SET search_path TO public",
    "RESET ALL", "PRAGMA journal_mode = DELETE", "ATTACH DATABASE 'x.db' AS x", "DETACH x",
    "CREATE TEMP TABLE history (x INTEGER)", "create temporary table runs (x integer)", "VACUUM",
])
def test_the_handle_refuses_transaction_control(app: cairn.App, statement: str) -> None:
    make_orders(app)

    @app.transaction(retry=cairn.RetryPolicy(max_attempts=5, initial_delay=0))
    def hostile(tx: cairn.Tx) -> None:
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), ("book",))
        tx.execute(statement)

    @app.workflow(name="hostile")
    def workflow(ctx: cairn.Context) -> str:
        try:
            hostile()
        except cairn.StepFailed as exc:
            return f"{exc.error_type} after {exc.attempts}: {exc.message}"
        return "ran"

    outcome = app.run(workflow)
    assert outcome.startswith("TransactionMisuse after 1: ")  # never retried: the same code does it again
    assert "refused in a transactional step" in outcome
    assert orders(app) == []


# SQLite only: a temporary trigger on a main table is SQLite's (PostgreSQL has no
# temporary triggers; its temporary relations are checked by tests/store/test_transact.py)
@pytest.mark.parametrize("app", ["sqlite"], indirect=True)
@pytest.mark.parametrize("statement", [
    "CREATE TRIGGER temp.swallow BEFORE INSERT ON main.history BEGIN SELECT RAISE(IGNORE); END",
    "create trigger temp.late after insert on main.history begin delete from history "
    "where run_id = new.run_id and seq = new.seq; end",
])
def test_a_body_cannot_leave_a_temporary_trigger_behind(app: cairn.App, statement: str) -> None:
    """A trigger in the temporary schema outlives the transaction on the
    store's connection, as a temporary table would: one that drops history
    rows made a later run's step record vanish (and ``app.run`` wait forever).
    The step fails with ``TransactionMisuse``, rolled back with its trigger,
    and a later run's steps are recorded."""

    @app.transaction
    def hostile(tx: cairn.Tx) -> None:
        tx.execute(statement)

    @app.workflow(name="hostile")
    def workflow(ctx: cairn.Context) -> str:
        try:
            hostile()
        except cairn.StepFailed as exc:
            return f"{exc.error_type}: {exc.message}"
        return "ran"

    @app.step(name="later_step")
    def later_step() -> int:
        return 7

    @app.workflow(name="later")
    def later(ctx: cairn.Context) -> int:
        return int(later_step())

    first = app.start(workflow).run_id
    assert execute_once(app, first) == "completed"
    outcome = app.handle(first).result(timeout=5)
    assert outcome.startswith("TransactionMisuse: "), outcome
    assert "temporary" in outcome
    second = app.start(later).run_id
    assert execute_once(app, second) == "completed"
    assert [e.name for e in app.history(second) if e.event is EventType.STEP_COMPLETED] == ["later_step"]
    assert app.handle(second).result(timeout=5) == 7


@pytest.mark.parametrize("how", ["execute", "execute-with-params", "executemany"])
def test_two_statements_in_one_call_cannot_smuggle_a_commit(app: cairn.App, how: str) -> None:
    make_orders(app)

    @app.transaction
    def smuggle(tx: cairn.Tx) -> None:
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), ("book",))
        if how == "execute":
            tx.execute("SELECT 1; COMMIT")
        elif how == "execute-with-params":
            tx.execute(sql(tx, "SELECT ?; COMMIT"), (1,))
        else:
            tx.executemany(sql(tx, "SELECT ?; COMMIT"), [(1,), (2,)])

    @app.workflow(name="smuggle")
    def workflow(ctx: cairn.Context) -> str:
        try:
            smuggle()
        except cairn.StepFailed as exc:
            return exc.error_type
        return "ran"

    assert app.run(workflow) == "SQLError"  # both drivers refuse a second statement
    assert orders(app) == []


def test_a_handle_kept_past_its_body_is_dead(app: cairn.App) -> None:
    make_orders(app)
    kept: list[cairn.Tx] = []

    @app.transaction
    def keep(tx: cairn.Tx) -> None:
        kept.append(tx)

    @app.workflow(name="keep")
    def workflow(ctx: cairn.Context) -> None:
        keep()

    app.run(workflow)
    with pytest.raises(cairn.TransactionMisuse, match="has ended"):
        kept[0].execute("SELECT 1")
    assert "ended" in repr(kept[0])


def _in_this_thread(call: Callable[[], None]) -> None:
    call()


def _in_a_thread_of_the_body(call: Callable[[], None]) -> None:
    """The body hands the call to a thread of its own, with its context
    (as ``asyncio.to_thread`` or ``copy_context().run`` would), and waits:
    that thread must be refused too, not left waiting for the lock the
    body holds (a deadlock)."""
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(context.run, call).result(timeout=30)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("where", [_in_this_thread, _in_a_thread_of_the_body],
                         ids=["same-thread", "body-thread"])
def test_no_journaled_call_may_run_inside_the_body(
    app: cairn.App, calls: Calls, where: Callable[[Callable[[], None]], None]
) -> None:
    make_orders(app)

    @app.step
    def inner() -> None:
        calls.hit("inner")

    @app.transaction(retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0))
    def nesting(tx: cairn.Tx) -> None:
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), ("book",))
        where(inner)

    @app.workflow(name="nesting")
    def workflow(ctx: cairn.Context) -> str:
        try:
            nesting()
        except cairn.StepFailed as exc:
            return f"{exc.error_type} {exc.attempts}"
        return "ran"

    assert app.run(workflow) == "TransactionMisuse 1"
    assert calls["inner"] == 0
    assert orders(app) == []


def test_a_result_that_cannot_be_recorded_rolls_the_rows_back(app: cairn.App) -> None:
    make_orders(app)

    @app.transaction
    def place(tx: cairn.Tx) -> float:
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), ("book",))
        return float("nan")  # refused by the codec

    @app.workflow(name="nan")
    def workflow(ctx: cairn.Context) -> str:
        try:
            place()
        except cairn.StepFailed as exc:
            return exc.error_type
        return "recorded"

    assert app.run(workflow) == "PayloadError"
    assert orders(app) == []


def test_an_async_workflow_calls_a_transaction(app: cairn.App, calls: Calls) -> None:
    make_orders(app)

    @app.transaction
    def place(tx: cairn.Tx, item: str) -> str:
        calls.hit("place")
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), (item,))
        return item

    @app.workflow(name="async-shop")
    async def shop(ctx: cairn.Context) -> list[str]:
        await asyncio.sleep(0)
        return [place("book"), place("pen")]

    assert app.run(shop) == ["book", "pen"]
    assert orders(app) == [("book", 1), ("pen", 1)]


def test_bodies_that_cannot_be_transactions_are_refused_at_decoration(app: cairn.App) -> None:
    with pytest.raises(TypeError, match="must be sync"):
        @app.transaction
        async def body(tx: cairn.Tx) -> None: ...

    with pytest.raises(TypeError, match="first parameter"):
        @app.transaction
        def no_handle() -> None: ...

    with pytest.raises(TypeError, match="SecretValue"):
        @app.transaction
        def secret(tx: cairn.Tx, token: cairn.SecretValue) -> None: ...


def test_outside_a_workflow_it_says_what_to_do(app: cairn.App) -> None:
    @app.transaction
    def place(tx: cairn.Tx) -> None: ...

    with pytest.raises(cairn.CairnError, match=r"outside a workflow.*\.fn\(tx"):
        place()


def test_results_come_back_as_replay_decodes_them(app: cairn.App) -> None:
    make_orders(app)

    @app.transaction
    def place(tx: cairn.Tx) -> tuple[str, int]:
        tx.execute(sql(tx, "INSERT INTO orders (item, attempt) VALUES (?, 1)"), ("book",))
        row = tx.execute("SELECT item, attempt FROM orders").fetchone()
        assert row is not None
        return (str(row[0]), int(row[1]))

    @app.workflow(name="typed")
    def typed(ctx: cairn.Context) -> str:
        value = place()
        return type(value).__name__ + repr(value)

    assert app.run(typed) == "tuple('book', 1)"


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Transactional steps"):]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None
    script = tmp_path / "shop.py"
    script.write_text(found.group(1), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["1"]
    rows = sqlite3.connect(tmp_path / "shop.db").execute("SELECT id, item FROM orders").fetchall()
    assert rows == [(1, "book")]
