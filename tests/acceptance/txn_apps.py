"""The workflows the transactional-step crash tests run in worker subprocesses.

``orders(n)`` alternates a transactional step (``place``: one INSERT into the
user's ``orders`` table, in the store's own database) with a plain step, so a
random kill lands in every part of a transaction's life and between them.
The body appends a ``begin`` line to the effects file (``apps.append_effect``)
before its INSERT and then sleeps ``$CAIRN_TEST_SLOW_SECONDS`` (0 unless the
test gives a worker a slow body to freeze it in), so a test can tell that a
worker is inside a body. The ``orders`` table carries the pid and attempt of
the body that inserted each row; the tests compare it with the journal.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import cairn
from tests.acceptance.apps import DB_ENV, EFFECTS_ENV, SLOW_ENV, append_effect

ORDERS = "CREATE TABLE IF NOT EXISTS orders (run_id TEXT NOT NULL, position INTEGER NOT NULL, " \
         "attempt INTEGER NOT NULL, pid INTEGER NOT NULL)"


def build_app(
    db: str | os.PathLike[str] | None = None,
    effects: str | os.PathLike[str] | None = None,
    *,
    lease_seconds: float = 1.0,
    max_recoveries: int = 200,
) -> cairn.App:
    url = str(db if db is not None else os.environ[DB_ENV])
    if "://" not in url:
        url = f"sqlite:///{Path(url).resolve()}"
    effects_path = str(effects if effects is not None else os.environ[EFFECTS_ENV])
    app = cairn.App(db=url, lease_seconds=lease_seconds, max_recoveries=max_recoveries)

    @app.transaction(name="create-orders")
    def create_orders(tx: cairn.Tx) -> None:
        tx.execute(ORDERS)

    @app.workflow(name="setup-orders")
    def setup(ctx: cairn.Context) -> None:
        create_orders()

    @app.transaction(name="place")
    def place(tx: cairn.Tx, item: int) -> int:
        info = cairn.step_info()
        append_effect(effects_path, {"kind": "begin", "run_id": info.run_id, "position": info.position,
                                     "attempt": info.attempt, "pid": os.getpid(), "t0": time.time()})
        mark = "?" if tx.paramstyle == "qmark" else "%s"
        marks = ", ".join([mark] * 4)
        tx.execute(f"INSERT INTO orders (run_id, position, attempt, pid) VALUES ({marks})",
                   (info.run_id, info.position, info.attempt, os.getpid()))
        slow = float(os.environ.get(SLOW_ENV, "0"))
        if slow:
            time.sleep(slow)
        return item * 10

    @app.step(name="tick")
    def tick(item: int, pause: float) -> int:
        time.sleep(pause)
        return item

    @app.workflow(name="orders")
    def orders(ctx: cairn.Context, n: int, pause: float) -> int:
        total = 0
        for item in range(n):
            total += place(item)
            total += tick(item, pause)
        return total

    return app


def expected_orders(n: int) -> int:
    return sum(item * 11 for item in range(n))
