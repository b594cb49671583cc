"""The PostgreSQL store never sends a pipeline.

``idle_in_transaction_session_timeout`` is what frees the run rows of a
worker frozen inside a transaction (SIGSTOP, a stalled VM): it fires only
while the server waits for the client's next command after a Sync. Inside a
pipeline the server stays ``active`` between commands, where no timeout of
PostgreSQL 15 applies, so a client frozen in the middle of one keeps its
locks for as long as it is frozen, and claims (``SKIP LOCKED``) pass over
those runs for good. psycopg's ``executemany`` is a pipeline; CI caught a
worker frozen inside the audit chain's ``executemany`` of unlinked entries
wedging a run for 310 s (tests/distributed/test_pg_fencing.py). The frozen-
worker test finds such a window only when its SIGSTOP happens to land in it,
so this check pins the rule where it is written."""

from __future__ import annotations

import re
from pathlib import Path

import cairn
import cairn.store.postgres

PIPELINED = re.compile(r"\.executemany\(|\.pipeline\(|_pipeline_nolock\(")


def test_the_postgres_store_sends_no_pipeline() -> None:
    source = Path(cairn.store.postgres.__file__).read_text(encoding="utf-8")
    found = [f"line {n}: {line.strip()}" for n, line in enumerate(source.splitlines(), 1)
             if PIPELINED.search(line) and not line.lstrip().startswith("#")]
    assert found == [], "a pipeline in the PostgreSQL store: " + "; ".join(found)


def test_no_other_module_talks_to_postgresql() -> None:
    """The rule is checked in one file because only that file holds psycopg
    connections: a second one would need the same check."""
    root = Path(cairn.__file__).parent
    imports = re.compile(r"^\s*(import|from) psycopg", re.MULTILINE)
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if imports.search(p.read_text(encoding="utf-8")))
    assert users == ["store/postgres.py"], users
