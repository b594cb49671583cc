"""What admitting a tenant role's claims at commit (migration 0027) costs, on PostgreSQL.

    python -m bench.pg_admission          # prints the figures; no results file

Three A/B pairs, each measured in one database, the two sides interleaved in
blocks (the machine is shared and noisy: only what alternates is compared):

* the owner's claim UPDATE of 8 runs (``claim_many``'s shape) with the
  admission triggers enabled and disabled: their ``WHEN`` is false for a
  role exempt from row-level security, so the owner's claim path should gain
  nothing;
* the owner's ``spend_queue_tokens`` against the body it had before 0027
  (which counted the transaction's moved rows by ``xmin``), with 8 and with
  1,000 runs of the queue running;
* a tenant role's UPDATE of 8 runs to running plus its COMMIT, on a queue
  with every limit, both rates and a share with a rate, with the admission
  trigger enabled and disabled: what ``admit_claim`` adds to its claim (its
  claims no longer call the three spending functions, which this omits).

The server is ``$CAIRN_BENCH_PG`` (``bench.pgdb``); the tenant's login role is
created there for the run and dropped after.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench import pgdb
from cairn.store.admission import QueueLimits, QueueShare, Rate
from cairn.store.postgres import PostgresStore
from cairn.store.records import NewRun, Payload

IDS = [f"r{i}" for i in range(8)]
CLAIM = ("UPDATE runs SET status = 'running', owner = 'w', epoch = runs.epoch + 1, lease_expires_at = %(t)s, "
         "runnable_at = %(t)s, wake_at = NULL, waiting_on = NULL, waiting_for = NULL, recoveries = c.r, "
         "updated_at = %(t)s FROM unnest(%(ids)s::text[], %(rs)s::bigint[]) AS c(run_id, r) "
         "WHERE runs.run_id = c.run_id")
BACK = "UPDATE runs SET status = 'pending', owner = NULL WHERE run_id = ANY(%(ids)s::text[])"


def _old_spend() -> str:
    """``spend_queue_tokens`` as migration 0006 defined it, renamed."""
    text = (resources.files("cairn.store") / "sql/postgres/migrations/0006_tenant_boundary.sql").read_text()
    start = text.index("CREATE FUNCTION spend_queue_tokens")
    end = text.index("$$;", text.index("$$", start) + 2) + 3
    return text[start:end].replace("spend_queue_tokens", "old_spend_queue_tokens", 1)


def _alternate(blocks: int, per_block: int, sides: dict[str, Callable[[], float]],
               switch: Callable[[str], None] | None = None) -> dict[str, float]:
    """Median µs of each side, run in alternating blocks."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for block in range(blocks):
        name = names[block % len(names)]
        if switch is not None:
            switch(name)
        samples[name].extend(sides[name]() for _ in range(per_block))
    return {name: statistics.median(values) for name, values in samples.items()}


def _timed(
    conn: psycopg.Connection[Any], *statements: tuple[str, dict[str, Any]], commit: bool = False
) -> float:
    t0 = time.perf_counter()
    for query, params in statements:
        conn.execute(query, params)
    if commit:
        conn.commit()
    return (time.perf_counter() - t0) * 1e6


def owner_figures(url: str) -> dict[str, float]:
    store = PostgresStore(url)
    try:
        for run_id in IDS:
            store.create_run(NewRun(run_id, "wf", "1", "t", None, Payload(data=b"[]")))
        store.set_queue(QueueLimits("default", rate=Rate(10**9, 1)))
        figures: dict[str, float] = {}
        with store._conn() as conn:  # bench only: statements the store has no method for
            conn.autocommit = True
            conn.execute(_old_spend())
            conn.execute(sql.SQL("ALTER FUNCTION old_spend_queue_tokens(TEXT[], BIGINT[], DOUBLE PRECISION) "
                                 "SET search_path = {}, pg_temp").format(sql.Identifier(store.schema)))
            params = {"t": time.time() + 30, "ids": IDS, "rs": [0] * len(IDS)}

            def claim() -> float:
                with conn.transaction():
                    took = _timed(conn, (CLAIM, params))
                    conn.execute(BACK, params)
                return took

            def switch(name: str) -> None:
                mode = "ENABLE" if name == "on" else "DISABLE"
                conn.execute(f"ALTER TABLE runs {mode} TRIGGER runs_admit_updated")

            medians = _alternate(30, 100, {"on": claim, "off": claim}, switch)
            switch("on")
            figures["owner claim UPDATE of 8 runs, admission trigger on"] = medians["on"]
            figures["owner claim UPDATE of 8 runs, admission trigger off"] = medians["off"]
            conn.execute("UPDATE runs SET status = 'running' WHERE run_id = ANY(%s)", (IDS,))
            for running in (8, 1000):
                if running > len(IDS):
                    conn.execute("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, "
                                 "created_at, updated_at) SELECT 'x' || i, 't', 'wf', '1', 'running', 0, 0 "
                                 "FROM generate_series(1, %s) AS i", (running - len(IDS),))

                def spend(name: str) -> Callable[[], float]:
                    def once() -> float:
                        with conn.transaction():
                            touch = "UPDATE runs SET updated_at = updated_at WHERE run_id = ANY(%s)"
                            conn.execute(touch, (IDS,))
                            call = f"SELECT {name}(ARRAY['default'], ARRAY[8]::bigint[], %(t)s)"
                            return _timed(conn, (call, {"t": time.time()}))
                    return once

                medians = _alternate(20, 50, {"new": spend("spend_queue_tokens"),
                                              "old": spend("old_spend_queue_tokens")})
                figures[f"owner spend_queue_tokens, {running} running (0027)"] = medians["new"]
                figures[f"owner spend_queue_tokens, {running} running (before 0027)"] = medians["old"]
        return figures
    finally:
        store.close()


def tenant_figures(url: str) -> dict[str, float]:
    role = f"cairnbench_tenant_{os.getpid()}"
    with psycopg.connect(pgdb.admin_url(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        store = PostgresStore(url)
        try:
            with store._conn() as conn:
                conn.execute("SELECT grant_tenant(%s, 'acme')", (role,))
                conn.commit()
            store.set_queue(QueueLimits("q", concurrency=10**6, tenant_concurrency=10**6, rate=Rate(10**9, 1),
                                        tenant_rate=Rate(10**9, 1)))
            store.set_queue_share(QueueShare("q", "acme", 10**6, Rate(10**9, 1)))
            for run_id in IDS:
                store.create_run(NewRun(run_id, "wf", "1", "acme", None, Payload(data=b"[]"), queue="q"))
            with (psycopg.connect(make_conninfo(url, user=role)) as conn,
                  psycopg.connect(url, autocommit=True) as owner):
                for c in (conn, owner):
                    c.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(store.schema)))
                conn.execute("SELECT set_config('cairn.tenant', 'acme', false)")
                conn.commit()

                def claim() -> float:
                    params = {"t": time.time(), "ids": IDS, "rs": [0] * len(IDS)}
                    took = _timed(conn, (CLAIM, params), commit=True)
                    conn.execute(BACK, params)
                    conn.commit()
                    return took

                def switch(name: str) -> None:
                    owner.execute(f"ALTER TABLE runs {'ENABLE' if name == 'on' else 'DISABLE'} "
                                  "TRIGGER runs_admit_updated")

                medians = _alternate(20, 50, {"on": claim, "off": claim}, switch)
                switch("on")
        finally:
            store.close()
        return {"tenant claim of 8 runs + commit, admit_claim on": medians["on"],
                "tenant claim of 8 runs + commit, admit_claim off": medians["off"]}
    finally:  # its grants live in the benchmark's database: revoke them there
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        with psycopg.connect(pgdb.admin_url(), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def main() -> int:
    figures: dict[str, float] = {}
    with pgdb.fresh_database("admission_owner") as url:
        figures.update(owner_figures(url))
    with pgdb.fresh_database("admission_tenant") as url:
        figures.update(tenant_figures(url))
    width = max(len(name) for name in figures)
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:>9,.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
