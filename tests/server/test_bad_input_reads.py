"""Issue 21 item 3: reads fetch what is asked for. ``GET /api/runs/{id}``
loaded the run's whole history to answer its usage and length (2 s on a
20,000-entry run, for 473 bytes), and each page of ``/history`` loaded all
of it again. Now usage is summed by the store and a page reads one page
(and one entry more, to know whether another follows). Both backends.

Counted, not timed: the store's ``history`` is wrapped to count the entries
it returns to the server."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest

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
    assert spy.entries == 0  # the history stayed in the database

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
