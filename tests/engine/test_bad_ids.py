"""Issue 30 item 1, issue 21 item 3: one rule for ids, on every path and backend.

A run id (and a thread id, a queue) with a NUL, a line break or
another control character, ``.`` or ``..``, empty or over-long is refused
where the run is created, by ``App.start`` and ``ctx.start_child`` alike,
with one ``InvalidArgument`` naming the problem, and nothing is stored. (A
NUL in an id used to stop every SQLite worker: the claim of the batch
holding it failed an assert, every poll; on PostgreSQL the id was a
"database failure" and its parent was dropped and retaken forever. A line
break forged events in the tenant's SSE stream; ``.``/``..`` could not be
opened from the dashboard.)
"""

from __future__ import annotations

import pytest

import cairn
from cairn.errors import InvalidArgument
from cairn.store.records import RunFilter, RunStatus
from tests.engine.conftest import execute_once

BAD_IDS = {
    "nul": "bad\x00id",
    "crlf": "forged\r\nevent: run.completed",
    "trailing-lf": "x\n",
    "cr": "a\rb",
    "tab": "a\tb",
    "c1-nel": "a\x85b",
    "del": "a\x7f",
    "dot": ".",
    "dotdot": "..",
    "empty": "",
    "too-long": "x" * 201,
}


def _workflow(app: cairn.App) -> cairn.Workflow[str]:
    @app.workflow(name="echo")
    def echo(ctx: cairn.Context, text: str) -> str:
        return text

    return echo


@pytest.mark.parametrize("bad", list(BAD_IDS), ids=list(BAD_IDS))
def test_a_bad_run_id_is_refused_at_start_with_nothing_stored(app: cairn.App, bad: str) -> None:
    echo = _workflow(app)
    with pytest.raises(InvalidArgument, match="run id"):
        app.start(echo, "hi", run_id=BAD_IDS[bad])
    with pytest.raises(InvalidArgument, match="run id"):
        app.start_json("echo", {"text": "hi"}, run_id=BAD_IDS[bad])
    assert app.store.list_runs(RunFilter()) == []


@pytest.mark.parametrize("field", ["thread_id", "queue"])
def test_bad_thread_ids_and_queues_are_refused_too(app: cairn.App, field: str) -> None:
    echo = _workflow(app)
    for bad in ("a\x00b", "a\nb", ".."):
        with pytest.raises(InvalidArgument, match=field.replace("_", " ")):
            app.start(echo, "hi", **{field: bad})
    assert app.store.list_runs(RunFilter()) == []


def test_a_tenant_is_free_text_but_for_a_nul(app: cairn.App) -> None:
    """A tenant is shown escaped wherever it is shown (``cairn runs``,
    metrics labels); a NUL, which PostgreSQL's text cannot hold, is refused
    on both backends alike."""
    echo = _workflow(app)
    with pytest.raises(InvalidArgument, match="tenant"):
        app.start(echo, "hi", tenant="a\x00b")
    assert app.store.list_runs(RunFilter()) == []
    assert app.start(echo, "hi", tenant="line\nbreak [/]").created


def test_the_longest_allowed_id_and_ordinary_punctuation_are_accepted(app: cairn.App) -> None:
    echo = _workflow(app)
    for good in ("x" * 200, "...", ".a", "a/b c:d", "é€😀", "schedule-like:but-not"):
        assert app.start(echo, "hi", run_id=good).created
        assert app.get_run(good).run_id == good


@pytest.mark.parametrize("bad", ["nul", "crlf", "dotdot", "too-long"])
def test_a_bad_child_id_fails_the_step_not_the_worker(app: cairn.App, bad: str) -> None:
    """``ctx.start_child(run_id=...)`` refuses the id in the workflow (which
    may catch it): no child is created and the parent is not treated as a
    database failure to be dropped and retaken."""
    echo = _workflow(app)

    @app.workflow(name="parent")
    def parent(ctx: cairn.Context) -> str:
        try:
            ctx.start_child(echo, "kid", run_id=BAD_IDS[bad])
        except InvalidArgument as exc:
            return f"refused: {exc}"
        return "started"

    app.start(parent, run_id="p")
    assert execute_once(app, "p") == "completed"
    record = app.get_run("p")
    assert record.status is RunStatus.COMPLETED
    result = app.handle("p").result(timeout=5)
    assert result.startswith("refused: run id")
    assert [r.run_id for r in app.store.list_runs(RunFilter())] == ["p"]
