"""PostgreSQL's hot path computes a step's audit link in the client from the
link it wrote before (``PostgresStore._links``) and the statement stores it
only if the entry before still holds that link: a stale or wrong cache is
refused and the entry written by the statement that hashes in the server,
so the chain never forks (docs/design.md, "Audit chain")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cairn.store import postgres
from cairn.store.auditverify import verify_store
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    opened = PostgresStore(pg_url)
    yield opened
    opened.close()


def claimed(store: PostgresStore) -> tuple[int, int]:
    """A running run ``r``: its epoch and the seq of its next entry."""
    run = NewRun(run_id="r", workflow="w", workflow_version="1", tenant="default", thread_id=None,
                 input=Payload(b"null", None))
    claim = store.create_claimed_run(run, "worker", 60.0)
    assert claim is not None
    return claim.run.epoch, claim.next_seq


def step(seq: int, epoch: int, at: float | None = None) -> HistoryEvent:
    now = time.time() if at is None else at
    return HistoryEvent("r", seq, EventType.STEP_COMPLETED, now, epoch, "worker", seq, "step", "inc",
                        "0123456789abcdef", 1, now, Payload(b'"' + str(seq).encode() + b'"', None))


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of ``postgres.<name>`` (the store looks it up at each call)."""
    calls: list[int] = []
    inner: Callable[..., Any] = getattr(postgres, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return inner(*args, **kwargs)

    monkeypatch.setattr(postgres, name, counted)
    return calls


def history(store: PostgresStore) -> list[tuple[Any, ...]]:
    with store._conn() as conn:
        return conn.execute("SELECT seq, at, digest, link FROM history WHERE run_id = 'r' "
                            "ORDER BY seq").fetchall()


def test_the_next_step_is_linked_by_the_client_and_verifies(store: PostgresStore,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    epoch, seq = claimed(store)
    store.append("r", epoch, [step(seq, epoch)])  # not known yet: the server hashes, the store remembers
    linked, fenced = counting(monkeypatch, "_linked_params"), counting(monkeypatch, "_fenced_insert")
    for i in range(1, 4):
        store.append("r", epoch, [step(seq + i, epoch)])
    assert (len(linked), len(fenced)) == (3, 0)  # each stored by insert_event_linked, none refused
    rows = history(store)
    assert rows[-1][0] == seq + 3
    assert store._links["r"] == (epoch, seq + 3, rows[-1][1], bytes(rows[-1][3]))
    assert all(row[2] is None for row in rows if row[0] >= seq)  # no keyring: recomputed by the verifier
    chains = verify_store(store)
    assert chains.problems == []
    assert chains.entries == len(rows)


@pytest.mark.parametrize("wrong", ["link", "time"])
def test_a_wrong_cache_is_refused_and_the_chain_does_not_fork(store: PostgresStore, wrong: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The remembered link of the entry before forged (or its time, older
    than it is, with the new entry's earlier still): the linked statement
    stores nothing, the server-hashed one stores the entry, clamped and
    chained from the link really there, and the chain verifies."""
    epoch, seq = claimed(store)
    store.append("r", epoch, [step(seq, epoch)])
    cached = store._links["r"]
    if wrong == "link":
        store._links["r"] = (*cached[:3], bytes(32 * [7]))
        event = step(seq + 1, epoch)
    else:
        store._links["r"] = (*cached[:2], 0.0, cached[3])
        event = step(seq + 1, epoch, at=cached[2] - 100.0)  # earlier than the entry before
    fenced = counting(monkeypatch, "_fenced_insert")
    store.append("r", epoch, [event])
    assert len(fenced) == 1  # refused, then written by insert_event_fenced
    rows = history(store)
    assert [row[0] for row in rows[-2:]] == [seq, seq + 1]  # one entry, not two
    assert rows[-1][1] == cached[2] if wrong == "time" else rows[-1][1] == event.at
    assert verify_store(store).problems == []
    store.append("r", epoch, [step(seq + 2, epoch)])  # remembered again from what was stored
    assert store._links["r"][1] == seq + 2
    assert verify_store(store).problems == []
