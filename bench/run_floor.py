"""The SQL floor of a three-step run on SQLite: Cairn's own statements, replayed bare.

    python -m bench.run_floor            # 7 rounds of 1,000 runs each way, alternated
    python -m bench.run_floor --quick    # 3 rounds of 300

Issue 8 asks for 5,000 three-step runs per second. This measures what the
statements of such a run cost with no engine at all: one ``app.run(three)``
is recorded statement by statement (SQL text and parameters, through a
``sqlite3.Connection`` subclass), then replayed with plain ``sqlite3`` on a
fresh database of the same schema, a new run id per run (every parameter
equal to the recorded run id is replaced), the same connection settings
(WAL, ``synchronous=NORMAL``). Rounds alternate Cairn (``app.run``) and the
replay in one process, so both meet the same machine; the figures are the
median rounds, and the ratio says how much of a run is Cairn's Python.
A round is long enough to include WAL checkpoints (SQLite's auto-checkpoint
runs every 1,000 pages, about every 50 runs here), which cost both sides
alike; a third replay with checkpoints off shows their share.

A replay is the floor of this schema, not of every schema: fewer index
writes per run (each of the run row's indexes is written on create and
again on finish) would lower it.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Params = Sequence[Any] | Mapping[str, Any]


class _Recording(sqlite3.Connection):
    """A connection that records what it executes while ``log`` is a list."""

    log: list[tuple[str, Params]] | None = None

    def execute(self, sql: str, parameters: Params = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        if _Recording.log is not None:
            _Recording.log.append((sql, parameters))
        return super().execute(sql, parameters)


def record(path: Path) -> tuple[list[tuple[str, Params]], str, int]:
    """The statements of one ``app.run(three)`` (after a warm-up run), its run
    id and how many history entries it wrote."""
    from bench.cairn_workloads import build

    connect = sqlite3.connect

    def recording_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **{**kwargs, "factory": _Recording})
        return conn

    sqlite3.connect = recording_connect  # type: ignore[assignment]
    try:
        w = build(path)
        try:
            w.app.run(w.three)
            _Recording.log = []
            w.app.run(w.three)
            log, _Recording.log = _Recording.log, None
        finally:
            w.close()
    finally:
        sqlite3.connect = connect
    run_ids = {v for _, p in log for v in (p.values() if isinstance(p, Mapping) else p)
               if isinstance(v, str) and len(v) == 36 and v.count("-") == 4}
    writes = [(sql, p) for sql, p in log if not sql.lstrip().upper().startswith(("SELECT", "PRAGMA"))]
    if len(run_ids) != 1:
        raise RuntimeError(f"expected one run id in the recorded statements, found {sorted(run_ids)}")
    run_id = run_ids.pop()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        entries = conn.execute("SELECT count(*) FROM history WHERE run_id = ?", (run_id,)).fetchone()[0]
    return writes, run_id, entries


def _swap(params: Params, old: str, new: str) -> Params:
    if isinstance(params, Mapping):
        return {k: (new if v == old else v) for k, v in params.items()}
    return tuple(new if v == old else v for v in params)


def replay_runs_per_s(path: Path, statements: Sequence[tuple[str, Params]], run_id: str, entries_per_run: int,
                      runs: int, checkpoints: bool = True) -> float:
    """Runs per second of the bare replay. ``checkpoints=False`` turns WAL
    auto-checkpoints off: not a configuration (the WAL would grow without
    end), a measurement of what SQLite's checkpoints (two syncs every 1,000
    pages of WAL) take of the floor."""
    from cairn.store.sqlite import SQLiteStore

    SQLiteStore(path).close()  # the schema, by the store's migrations
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    if not checkpoints:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
    new_ids = [str(uuid.uuid4()) for _ in range(runs)]
    batches = [[(sql, _swap(p, run_id, new)) for sql, p in statements] for new in new_ids]
    started = time.perf_counter()
    for batch in batches:
        for sql, params in batch:
            conn.execute(sql, params)
    elapsed = time.perf_counter() - started
    try:
        check_replayed(conn, entries_per_run, new_ids)
    finally:
        conn.close()
    return runs / elapsed


def check_replayed(conn: sqlite3.Connection, entries_per_run: int, new_ids: Sequence[str]) -> None:
    """Refuse a replay that did less than the recorded run: every replayed
    run must end as the recorded one did, with as many history entries. (A
    replay that gave each statement a run id of its own once fenced every
    append and the finish out, and measured a floor of nothing.)"""
    placeholders = ",".join("?" * len(new_ids))
    statuses = dict(conn.execute(f"SELECT status, count(*) FROM runs WHERE run_id IN ({placeholders}) "
                                 "GROUP BY status", new_ids).fetchall())
    entries = conn.execute(
        f"SELECT count(*) FROM history WHERE run_id IN ({placeholders})", new_ids).fetchone()[0]
    if statuses != {"completed": len(new_ids)} or entries != entries_per_run * len(new_ids):
        raise RuntimeError(f"the replay did not redo the recorded runs: statuses {statuses}, "
                           f"{entries} history entries for {len(new_ids)} runs")


def cairn_runs_per_s(path: Path, runs: int) -> float:
    from bench.cairn_workloads import build

    w = build(path)
    try:
        w.app.run(w.three)
        started = time.perf_counter()
        for _ in range(runs):
            w.app.run(w.three)
        return runs / (time.perf_counter() - started)
    finally:
        w.close()


def floor_runs_per_s(runs: int) -> float:
    """One recording and one bare replay of ``runs`` runs: the floor
    ``bench.engine`` judges its runs/s figure against, in the same run."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        statements, run_id, entries = record(root / "recorded.db")
        return replay_runs_per_s(root / "bare.db", statements, run_id, entries, runs)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds, runs = (3, 300) if args.quick else (7, 1000)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        statements, run_id, entries = record(root / "recorded.db")
        print(f"one 3-step run: {len(statements)} statements, "
              f"{sum(1 for s, _ in statements if s.strip().upper() == 'COMMIT')} explicit COMMITs")
        cairn: list[float] = []
        bare: list[float] = []
        unchecked: list[float] = []
        for i in range(rounds):
            cairn.append(cairn_runs_per_s(root / f"cairn{i}.db", runs))
            bare.append(replay_runs_per_s(root / f"bare{i}.db", statements, run_id, entries, runs))
            unchecked.append(replay_runs_per_s(root / f"unchecked{i}.db", statements, run_id, entries, runs,
                                               checkpoints=False))
            print(f"round {i + 1}/{rounds}: cairn {cairn[-1]:,.0f} runs/s, bare replay {bare[-1]:,.0f}, "
                  f"bare replay without WAL checkpoints {unchecked[-1]:,.0f}")
    c, b, u = statistics.median(cairn), statistics.median(bare), statistics.median(unchecked)
    print(f"\nmedians of {rounds} rounds x {runs} runs: cairn {c:,.0f} runs/s, "
          f"bare SQL replay {b:,.0f} runs/s (cairn / floor {c / b:.2f}); target >= 5,000 runs/s")
    print(f"the replay without WAL checkpoints: {u:,.0f} runs/s (checkpoints take "
          f"{1e6 / b - 1e6 / u:,.0f} of the floor's {1e6 / b:,.0f} µs per run)")


if __name__ == "__main__":
    main()
