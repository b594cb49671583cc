"""Viewers of a long run against every other request: ``python -m bench.viewers``.

Issue 21: 8 viewers paging a 20,000-entry run raised every other request's
p50 from 2 to 199 ms (each page with a model call read the history from seq
0 to rebuild it, and ``/model-calls`` read all of it). Per backend this
builds a run of ``--entries`` entries (an agent loop: a model call sending a
system prompt and the last few messages, then a step), serves it with
``cairn serve``, and measures one client's ``GET /api/runs/{id}`` of a small
run back to back for ``--seconds`` twice in the same server: alone (the
baseline), then while ``--viewers``
threads page the long run's ``/history`` and ``/model-calls`` at random
cursors, each a page every ``--interval`` seconds (a person paging; 0: back
to back, which saturates the server whatever a page costs). It prints both
p50s and their ratio (loaded / alone), and the viewers' page p50. Figures
are this machine's; only the ratio travels.

PostgreSQL runs on a private throwaway cluster (``tests.pgcluster``), never
on a server of the machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

import cairn
from cairn.models import Message
from cairn.models.scripted import ScriptedModel

from .server import _free_port, _pct, _start

ROOT = Path(__file__).resolve().parents[1]
TENANT = "bench"
SYSTEM = Message(role="system", content="You are a careful agent. " * 20)

llm = ScriptedModel(lambda request, n: Message(role="assistant", content=f"answer {n}: " + "ok " * 60),
                    model_id="bench-model")


def register(app: cairn.App) -> cairn.Workflow[int]:
    @app.step
    def act(turn: int) -> int:
        return turn

    @app.workflow(name="long_agent")
    def long_agent(ctx: cairn.Context, turns: int) -> int:
        recent: list[Message] = []
        for turn in range(turns):
            recent = [*recent[-6:], Message(role="user", content=f"observation {turn}: " + "data " * 60)]
            recent.append(ctx.model(llm, [SYSTEM, *recent]).message)
            act(turn)
        return turns

    return long_agent


def build(db: str, entries: int) -> tuple[str, int, int]:
    """The long run (two entries a turn) and a small one; the long one's
    last seq and model call count."""
    app = cairn.App(db=db)
    try:
        agent = register(app)
        app.run(agent, max(1, entries // 2), run_id="long", tenant=TENANT)
        small = app.start(agent, 1, run_id="small", tenant=TENANT).run_id
        app.run(agent, 1, run_id=small, tenant=TENANT)
        last = app.usage("long").last_seq
        calls = sum(1 for e in app.history("long")  # no Store.model_calls: a "before" tree has none
                    if e.step_kind == "model" and e.event.value == "step.completed")
        token = app.tokens.mint(TENANT, "viewer", "bench").secret
    finally:
        app.close()
    return token, last, calls


def _requests(url: str, auth: dict[str, str], seconds: float) -> list[float]:
    """One client's ``GET /api/runs/{id}`` of the small run, back to back for ``seconds``."""
    got: list[float] = []
    with httpx.Client(base_url=url, headers=auth, timeout=300) as http:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until or len(got) < 20:
            started = time.perf_counter()
            response = http.get("/api/runs/small")
            got.append(time.perf_counter() - started)
            assert response.status_code == 200, response.text
    return got


def _viewer(url: str, auth: dict[str, str], last: int, stop: threading.Event, seed: int,
            pages: list[float], interval: float) -> None:
    """A viewer asking for a page every ``interval`` seconds (back to back
    when a page takes longer, or with ``interval`` 0)."""
    rng = random.Random(seed)
    next_at = time.perf_counter() + rng.random() * interval
    with httpx.Client(base_url=url, headers=auth, timeout=300) as http:
        while not stop.is_set():
            pause = next_at - time.perf_counter()
            if pause > 0:
                stop.wait(pause)
                continue
            next_at = max(next_at + interval, time.perf_counter())
            path = rng.choice(("/api/runs/long/history", "/api/runs/long/model-calls"))
            started = time.perf_counter()
            response = http.get(path, params={"after": rng.randrange(last), "limit": 100})
            pages.append(time.perf_counter() - started)
            assert response.status_code == 200, response.text


def measure(db: str, entries: int, viewers: int, seconds: float, interval: float) -> dict[str, Any]:
    built = time.perf_counter()
    token, last, calls = build(db, entries)
    built = time.perf_counter() - built
    # a PYTHONPATH given first: the same bench against another checkout's code (``before`` figures)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT), str(ROOT / "src")])}
    port = _free_port()
    server = _start([sys.executable, "-m", "cairn", "serve", "--app", "bench.server_app:app", "--db", db,
                     "--port", str(port), "--log-level", "warning"], port, env)
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
    try:
        _requests(url, auth, 1.0)  # warm
        alone = _requests(url, auth, seconds)
        stop, pages = threading.Event(), []  # type: ignore[var-annotated]
        threads = [threading.Thread(target=_viewer, args=(url, auth, last, stop, i, pages, interval),
                                    daemon=True)
                   for i in range(viewers)]
        for thread in threads:
            thread.start()
        time.sleep(1.0 + interval)  # the viewers are paging
        loaded = _requests(url, auth, seconds)
        stop.set()
        for thread in threads:
            thread.join(120)
    finally:
        server.terminate()
        server.wait(20)
    return {"entries": last, "model calls": calls, "build_seconds": round(built, 1),
            "GET /api/runs/{id} p50 ms alone": round(_pct(alone, 0.5) * 1000, 2),
            f"... p50 ms with {viewers} viewers, a page each every {interval} s":
                round(_pct(loaded, 0.5) * 1000, 2),
            "ratio (with viewers / alone)": round(_pct(loaded, 0.5) / _pct(alone, 0.5), 2),
            "requests alone / with viewers": [len(alone), len(loaded)],
            "viewer page p50 ms": round(_pct(pages, 0.5) * 1000, 2), "viewer pages": len(pages)}


@contextmanager
def postgres_db() -> Iterator[str]:
    """A new database of a private throwaway cluster, dropped after."""
    from tests import pgcluster
    from tests.backends import libpq_url

    admin = pgcluster.admin_url()
    name = f"cairn_bench_viewers_{os.getpid()}"
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield libpq_url(admin, name)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    finally:
        pgcluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--viewers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each phase is measured")
    parser.add_argument("--interval", type=float, default=0.5,
                        help="seconds between a viewer's pages (0: back to back, a closed loop)")
    parser.add_argument("--no-postgres", action="store_true", help="measure SQLite only")
    opts = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-viewers-") as tmp:
        results["sqlite"] = measure(f"sqlite:///{tmp}/cairn.db", opts.entries, opts.viewers, opts.seconds,
                                     opts.interval)
    if not opts.no_postgres:
        with postgres_db() as db:
            results["postgres"] = measure(db, opts.entries, opts.viewers, opts.seconds,
                                     opts.interval)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
