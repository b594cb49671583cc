"""Issue 21 item 3: reads fetch what is asked for. ``GET /api/runs/{id}``
loaded the run's whole history to answer its usage and length (2 s on a
20,000-entry run, for 473 bytes), and each page of ``/history`` loaded all
of it again. Now usage is summed by the store and a page reads one page
(and one entry more, to know whether another follows). Both backends.

Counted, not timed: the store's ``history`` is wrapped to count the entries
it returns to the server."""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from cairn.api.views import model_call_json
from cairn.engine import modelcalls
from cairn.engine.journal import Journal

from .conftest import TENANT, Setup
from .workflows import drain


class Counted:
    def __init__(self, setup: Setup) -> None:
        self.original = setup.app.store.history
        self.entries = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        got = self.original(*args, **kwargs)
        self.entries += len(got)
        return got


def test_a_run_and_its_pages_read_only_what_they_answer(setup: Setup, client: httpx.Client,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    viewer = setup.headers("viewer")
    run_id = setup.app.start(setup.workflows["ticker"], 40, tenant=TENANT).run_id
    drain(setup.app)
    full = setup.app.history(run_id)
    assert len(full) > 40
    usage = Journal(full).usage
    spy = Counted(setup)
    monkeypatch.setattr(setup.app.store, "history", spy)
    path = f"/api/runs/{quote(run_id, safe='')}"

    shown = client.get(path, headers=viewer)
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["history_length"] == full[-1].seq
    assert body["usage"] == {"tokens": usage.tokens, "cost": usage.cost, "tool_calls": usage.tool_calls}
    # the history stayed in the database but for its first entry, the run.created that holds
    # a replayed or forked graph run's lineage (forked_from)
    assert spy.entries == 1

    seen: list[int] = []
    after: int | None = 0
    pages = 0
    while after is not None:
        spy.entries = 0
        page = client.get(f"{path}/history", params={"after": after, "limit": 10}, headers=viewer)
        assert page.status_code == 200, page.text
        events = page.json()["events"]
        assert len(events) <= 10
        assert spy.entries <= 11, spy.entries  # the page and one more entry, never the whole history
        seen.extend(e["seq"] for e in events)
        after = page.json()["next_after"]
        pages += 1
    assert seen == [e.seq for e in full]
    assert pages == -(-len(full) // 10)


def test_usage_of_model_calls_and_tools_matches_the_journal(setup: Setup, client: httpx.Client) -> None:
    viewer = setup.headers("viewer")
    chat = setup.app.start(setup.workflows["chat"], "hello", tenant=TENANT).run_id
    payer = setup.app.start(setup.workflows["payer"], "bob", tenant=TENANT).run_id
    drain(setup.app)
    for run_id in (chat, payer):
        usage = Journal(setup.app.history(run_id)).usage
        body = client.get(f"/api/runs/{quote(run_id, safe='')}", headers=viewer).json()
        assert body["usage"] == {"tokens": usage.tokens, "cost": usage.cost, "tool_calls": usage.tool_calls}
    page = client.get(f"/api/runs/{quote(chat, safe='')}/history", headers=viewer).json()
    models = [e for e in page["events"] if e.get("kind") == "model" and e["event"] == "step.completed"]
    assert models
    assert all("result_error" not in e and e["result"]["response"]["message"]["content"].startswith("answer ")
               for e in models), models


class CountedReads:
    """The entries the store hands the server, over every history read
    (``history``, ``history_at``, ``model_calls``)."""

    def __init__(self, setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entries = 0
        for name in ("history", "history_at", "model_calls"):
            monkeypatch.setattr(setup.app.store, name, self._counting(getattr(setup.app.store, name)))

    def _counting(self, read: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            got = read(*args, **kwargs)
            self.entries += len(got)
            return got
        return counted


def _model_calls_as_read_whole(setup: Setup, run_id: str) -> dict[int, Any]:
    history = setup.app.history(run_id)
    by_seq = {e.seq: e for e in history}
    return {seq: json.loads(json.dumps(model_call_json(by_seq[seq], record)))  # as the server sends it
            for seq, record in modelcalls.records(history, setup.app.runtime.payloads).items()}


def test_a_page_deep_in_a_long_run_reads_what_its_model_calls_need(
        setup: Setup, client: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page with model calls read the history from seq 0 to rebuild them
    (a page of 10 after seq 284 of this 300-entry run: 305 entries, seen
    failing); now the page, one
    entry more and the few entries its calls name as needed. Any page, at
    random boundaries, shows the calls the whole history rebuilds."""
    viewer = setup.headers("viewer")
    run_id = setup.app.start(setup.workflows["agent"], 150, tenant=TENANT).run_id
    drain(setup.app)
    whole = _model_calls_as_read_whole(setup, run_id)
    assert len(whole) == 150
    last = setup.app.history(run_id)[-1].seq
    spy = CountedReads(setup, monkeypatch)
    path = f"/api/runs/{quote(run_id, safe='')}"
    rng = random.Random(5)
    for after in [last - 20, 0, last // 2, *(rng.randrange(last) for _ in range(12))]:
        limit = rng.choice([1, 2, 5, 10])
        spy.entries = 0
        page = client.get(f"{path}/history", params={"after": after, "limit": limit}, headers=viewer)
        assert page.status_code == 200, page.text
        events = page.json()["events"]
        calls = [e for e in events if e.get("kind") == "model" and e["event"] == "step.completed"]
        # the page, one entry more, and per call the system prompt's carrier and the window's
        assert spy.entries <= limit + 1 + 6 * len(calls), (after, limit, spy.entries)
        for event in calls:
            assert event["result"]["request"] == whole[event["seq"]]["request"]
            assert event["result"]["response"]["message"] == whole[event["seq"]]["response"]


def test_model_calls_come_in_pages_read_in_the_database(
        setup: Setup, client: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """``/model-calls`` read the run's whole history for every request; now
    it reads a page of model entries (filtered in SQL, never the steps
    between) and what they need, and pages with ``after``/``next_after``
    (seen failing: the whole run's 150 calls in one answer, the query ignored)."""
    viewer = setup.headers("viewer")
    run_id = setup.app.start(setup.workflows["agent"], 150, tenant=TENANT).run_id
    drain(setup.app)
    whole = _model_calls_as_read_whole(setup, run_id)
    spy = CountedReads(setup, monkeypatch)
    path = f"/api/runs/{quote(run_id, safe='')}/model-calls"
    shown: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        spy.entries = 0
        got = client.get(path, params={"after": after, "limit": 20}, headers=viewer)
        assert got.status_code == 200, got.text
        body = got.json()
        assert "error" not in body, body
        assert len(body["model_calls"]) <= 20
        # 21 model entries, and the system prompt's carrier and the window's of the page's first call
        assert spy.entries <= 21 + 6, spy.entries
        shown.extend(body["model_calls"])
        after = body["next_after"]
    assert shown == [whole[seq] for seq in sorted(whole)]
    everything = client.get(path, params={"limit": 1000}, headers=viewer).json()  # the dashboard's page
    assert everything["model_calls"] == shown
    assert everything["next_after"] is None
