"""The workflows the acceptance tests run in worker subprocesses.

``build_app`` registers everything on a fresh ``cairn.App`` bound to one
store (a SQLite file or a PostgreSQL database), so the test process (which
starts and inspects runs) and the worker subprocesses (which execute them)
share it. Settings come from the environment when not given:

* ``CAIRN_TEST_DB``: the store URL (``sqlite:///...``, ``postgresql://...``)
  or the path of a SQLite file;
* ``CAIRN_TEST_EFFECTS``: the external effects file every step body appends to;
* ``CAIRN_TEST_SLOW_SECONDS``: how long the ``slow`` step sleeps *in this
  process* (the fencing test gives its first worker a long sleep and its
  second worker none, so the takeover finishes quickly).

Every step body appends two JSON lines to the effects file with one
``os.write`` each on an ``O_APPEND`` descriptor: a ``begin`` line when the
body starts and an ``end`` line (with ``t0`` and ``t1``) when it is done. A
body killed in between leaves only its ``begin`` line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import cairn

DB_ENV = "CAIRN_TEST_DB"
EFFECTS_ENV = "CAIRN_TEST_EFFECTS"
SLOW_ENV = "CAIRN_TEST_SLOW_SECONDS"


def append_effect(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one JSON line to ``path`` with a single write on an O_APPEND descriptor."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def expected_fifty(n: int) -> int:
    return sum(i * 2 for i in range(n))


def expected_short(k: int) -> int:
    return sum(k * 10 + p for p in range(3))


def expected_fenced(k: int) -> int:
    return k + 1 + k * 100 + k + 3


def build_app(
    db: str | os.PathLike[str] | None = None,
    effects: str | os.PathLike[str] | None = None,
    *,
    lease_seconds: float = 1.0,
    max_recoveries: int = 50,
) -> cairn.App:
    url = str(db if db is not None else os.environ[DB_ENV])
    if "://" not in url:
        url = f"sqlite:///{Path(url).resolve()}"
    effects_path = str(effects if effects is not None else os.environ[EFFECTS_ENV])
    app = cairn.App(db=url, lease_seconds=lease_seconds, max_recoveries=max_recoveries)

    def effect(kind: str, t0: float, t1: float | None = None) -> None:
        info = cairn.step_info()
        record: dict[str, Any] = {
            "kind": kind, "run_id": info.run_id, "position": info.position, "attempt": info.attempt,
            "step": info.step, "pid": os.getpid(), "t0": t0,
        }
        if t1 is not None:
            record["t1"] = t1
        append_effect(effects_path, record)

    def body(pause: float, value: int) -> int:
        t0 = time.time()
        effect("begin", t0)
        time.sleep(pause)
        t1 = time.time()
        effect("end", t0, t1)
        return value

    @app.step()
    def work(i: int, pause: float) -> int:
        return body(pause, i * 2)

    @app.workflow(name="fifty")
    def fifty(ctx: cairn.Context, n: int, pause: float) -> int:
        return sum(work(i, pause) for i in range(n))

    @app.step()
    def short_step(k: int, p: int, pause: float) -> int:
        return body(pause, k * 10 + p)

    @app.workflow(name="short")
    def short(ctx: cairn.Context, k: int, pause: float) -> int:
        return sum(short_step(k, p, pause) for p in range(3))

    @app.step()
    def quick(x: int) -> int:
        return body(0.0, x)

    @app.step()
    def slow(x: int) -> int:
        return body(float(os.environ.get(SLOW_ENV, "0")), x * 100)

    @app.workflow(name="fenced")
    def fenced(ctx: cairn.Context, k: int) -> int:
        return quick(k + 1) + slow(k) + quick(k + 3)

    @app.step()
    def poison() -> int:
        """Kills whatever worker runs it, every time (a segfaulting library, an OOM)."""
        effect("begin", time.time())
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    async def async_body(pause: float, value: int) -> int:
        t0 = time.time()
        effect("begin", t0)
        await asyncio.sleep(pause)
        effect("end", t0, time.time())
        return value

    @app.step()
    async def long_async(pause: float) -> int:
        return await async_body(pause, 1000)

    @app.step()
    async def tick(i: int, pause: float) -> int:
        return await async_body(pause, i)

    @app.workflow(name="siblings")
    async def siblings(ctx: cairn.Context, n: int, pause: float, long_pause: float) -> int:
        """A long step and a chain of short ones, side by side (``gather``)."""
        async def chain() -> int:
            total = 0
            for i in range(n):
                total += await tick(i, pause)
            return total

        long_value, chained = await asyncio.gather(long_async(long_pause), chain())
        return long_value + chained

    @app.workflow(name="poisoned")
    def poisoned(ctx: cairn.Context) -> int:
        return quick(1) + poison()

    # -- memory written with the step (issue 14; tests/acceptance/test_memory_kill.py) --------

    def remember(i: int) -> dict[str, int]:
        """Every tier, from the step body; the value names the process."""
        info = cairn.step_info()
        mark = {"i": i, "pid": os.getpid(), "attempt": info.attempt}
        info.memory.put(("mem", info.run_id), f"s{i}", mark, index=f"step {i}")
        info.memory.run.put(f"s{i}", mark)
        info.memory.thread(info.run_id).append(mark)
        return mark

    @app.step()
    def mem_step(i: int, pause: float) -> dict[str, int]:
        t0 = time.time()
        effect("begin", t0)
        mark = remember(i)
        time.sleep(pause)
        effect("end", t0, time.time())
        return mark

    @app.step()
    async def mem_step_async(i: int, pause: float) -> dict[str, int]:
        t0 = time.time()
        effect("begin", t0)
        mark = remember(i)
        await asyncio.sleep(pause)
        effect("end", t0, time.time())
        return mark

    @app.step()
    def mem_slow(k: int) -> dict[str, int]:
        """Writes memory first, then sleeps (SLOW_ENV): a worker frozen here holds buffered writes."""
        t0 = time.time()
        effect("begin", t0)
        mark = remember(k)
        time.sleep(float(os.environ.get(SLOW_ENV, "0")))
        effect("end", t0, time.time())
        return mark

    @app.workflow(name="memfenced")
    def memfenced(ctx: cairn.Context, k: int) -> int:
        mem_slow(k)
        return k

    @app.workflow(name="memfifty")
    def memfifty(ctx: cairn.Context, n: int, pause: float) -> int:
        for i in range(n):
            mem_step(i, pause)
            if i % 5 == 4:  # a write of the workflow's own: a journaled call
                ctx.memory.put(("wf", ctx.run_id), f"w{i}", i)
        return n

    @app.workflow(name="amemfifty")
    async def amemfifty(ctx: cairn.Context, n: int, pause: float) -> int:
        for i in range(n):
            await mem_step_async(i, pause)
            if i % 5 == 4:
                ctx.memory.put(("wf", ctx.run_id), f"w{i}", i)
        return n

    return app
