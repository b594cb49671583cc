"""What Cairn's PostgreSQL step statement costs, part by part: ``python -m bench.pg_statement``.

The step on PostgreSQL is one autocommit statement (``insert_event_fenced``),
so its cost beyond the floor's ``INSERT`` commit is what that statement does
more. This sends, with bare psycopg on one connection of a fresh database
(``$CAIRN_BENCH_PG``, ``synchronous_commit=on``), alternated round by round:

* ``small INSERT``: ``bench.postgres``'s floor, a three-column journal row;
* ``fenced``: Cairn's statement as the store sends it (fence on the run's
  epoch with ``FOR SHARE``, the gap check on ``MAX(seq)``, the history
  trigger that keeps entry times monotonic);
* the same without ``FOR SHARE``, without the trigger, and without both;
* ``plain INSERT history``: the same row inserted with no fence, no gap
  check and no trigger, which is what the row's own shape (sixteen columns,
  the primary key) costs.

Each is a ratio to ``small INSERT`` of the same run. Cairn's own Python is
not in any of them (``bench.postgres`` measures the whole step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench import pgdb
from cairn.store.postgres import _Q, PostgresStore, _event_params
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload

_PAYLOAD = b'{"result": 12345}'
_PLAIN = ("INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, "
          "input_hash, attempt, started_at, payload, payload_ref, detail, tenant) VALUES (%(run_id)s, "
          "%(seq)s, %(event)s, %(at)s, %(event_epoch)s, %(worker)s, %(position)s, %(step_kind)s, %(name)s, "
          "%(input_hash)s, %(attempt)s, %(started_at)s, %(payload)s, %(payload_ref)s, %(detail)s, 'default')")


def measure(url: str, rounds: int, iterations: int) -> dict[str, list[float]]:
    store = PostgresStore(url)
    run = NewRun(run_id="r1", workflow="w", workflow_version="1", tenant="default", thread_id=None,
                 input=Payload(data=b"[]"))
    claim = store.create_claimed_run(run, "w1", 3600.0)
    assert claim is not None
    epoch, next_seq = claim.run.epoch, claim.next_seq
    schema = store.schema
    store.close()
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(psycopg.sql.SQL("SET search_path = {}").format(psycopg.sql.Identifier(schema)))
    conn.execute("CREATE TABLE bench_events (run_id text, seq bigint, payload bytea, "
                 "PRIMARY KEY (run_id, seq))")
    seq = {"history": next_seq, "small": 0}

    def params() -> dict[str, Any]:
        now = time.time()
        event = HistoryEvent(run_id="r1", seq=seq["history"], event=EventType.STEP_COMPLETED, at=now,
                             epoch=epoch, worker="w1", position=seq["history"], step_kind="step", name="s",
                             input_hash="abc123", attempt=1, started_at=now, payload=Payload(data=_PAYLOAD))
        seq["history"] += 1
        return {**_event_params(event), "run_id": "r1", "epoch": epoch, "event_epoch": epoch}

    def history(statement: str, trigger: bool) -> Callable[[], float]:
        def sample() -> float:
            switch = "ENABLE" if trigger else "DISABLE"
            conn.execute(f"ALTER TABLE history {switch} TRIGGER history_monotonic_at")
            start = time.perf_counter()
            for _ in range(iterations):
                if conn.execute(statement, params()).rowcount != 1:
                    raise RuntimeError("the fenced insert wrote nothing: the benchmark's run is not held")
            return (time.perf_counter() - start) / iterations * 1e6
        return sample

    def small() -> float:
        start = time.perf_counter()
        for _ in range(iterations):
            seq["small"] += 1
            conn.execute("INSERT INTO bench_events VALUES ('run-1', %s, %s)", (seq["small"], _PAYLOAD))
        return (time.perf_counter() - start) / iterations * 1e6

    fenced = _Q["insert_event_fenced"]
    unlocked = fenced.replace("FOR SHARE", "")
    if unlocked == fenced:
        raise RuntimeError("insert_event_fenced has no FOR SHARE to take out: update this benchmark")
    variants = {"small INSERT": small, "fenced": history(fenced, True),
                "no FOR SHARE": history(unlocked, True), "no trigger": history(fenced, False),
                "neither": history(unlocked, False), "plain INSERT history": history(_PLAIN, False)}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for round_ in range(rounds + 1):
            for name, sample in variants.items():
                value = sample()
                if round_:  # the first round warms the caches and the prepared statements up
                    samples[name].append(value)
    finally:
        conn.execute("ALTER TABLE history ENABLE TRIGGER history_monotonic_at")
        conn.close()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_statement", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args(argv)
    pgdb.wait_for_server()
    with pgdb.fresh_database("statement") as url:
        if pgdb.setting(url, "synchronous_commit") != "on":
            raise SystemExit("bench.pg_statement measures durable commits: synchronous_commit must be on")
        samples = measure(url, args.rounds, args.iterations)
    base = statistics.median(samples["small INSERT"])
    print(f"medians of {args.rounds} rounds x {args.iterations} statements, ratio to the small INSERT:")
    for name, values in samples.items():
        median = statistics.median(values)
        spread = (max(values) - min(values)) / median
        print(f"  {name:22s} {median:7.1f} µs  {median / base:5.2f}x  (spread {spread:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
