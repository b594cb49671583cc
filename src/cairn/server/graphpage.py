"""The graph section of a run's dashboard page: the run's path through its
nodes, super-step by super-step, and the diff between two checkpoints.

Read without the graph's code (``Chain.state`` without a schema): the server need not
register the workflow, and a run whose state type changed since still
shows what it recorded. A page lists ``PAGE`` super-steps, newest first,
with links to older and newer pages (``?steps=<before>``), so a 3,000-step
run is never rendered whole; a diff (``?a=<step>&b=<step>``) shows at most
``MAX_CHANGES`` changes and cuts every value at ``MAX_VALUE`` characters
(a 10 MB value is one cut string, not a 10 MB page). Everything user-made
(node names, state values, paths) reaches the template as text, which
autoescapes it.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.datastructures import QueryParams

from cairn.api.app import App
from cairn.errors import InvalidArgument, PayloadError
from cairn.graph import diff as diffs
from cairn.graph.checkpoints import KIND
from cairn.graph.reader import GraphHistory
from cairn.server.errors import ApiError
from cairn.store.records import RunRecord

#: super-steps on a page of the path
PAGE = 50
#: changes a diff shows (the rest are counted)
MAX_CHANGES = 200
#: characters of one value a diff shows
MAX_VALUE = 2000


@dataclass(frozen=True, slots=True)
class Ran:
    """A node in a row of the path, a ``Send``'s fan-out counted once (``square x1000`` on the page)."""

    name: str
    count: int


def compact(nodes: tuple[str, ...]) -> list[Ran]:
    """``nodes`` with each run of the same name folded into one ``Ran``."""
    found: list[Ran] = []
    for name in nodes:
        if found and found[-1].name == name:
            found[-1] = Ran(name, found[-1].count + 1)
        else:
            found.append(Ran(name, 1))
    return found


def _number(params: QueryParams, key: str) -> int | None:
    given = params.get(key)
    if given is None or given == "":
        return None
    text = given.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise ApiError(400, "invalid", f"{key} must be a super-step number, not {given[:40]!r}")
    return int(text)


def _shown(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text) <= MAX_VALUE:
        return text
    return f"{text[:MAX_VALUE]}… ({len(text) - MAX_VALUE:,} more characters)"


def path_text(path: diffs.Path) -> str:
    """A diff path as one line: ``messages[3]``, ``profile.city``; a key
    that is not a plain name is quoted (``["a.b"]``), so paths stay distinct."""
    if not path:
        return "(the state)"
    parts = []
    for index, key in enumerate(path):
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif key.isidentifier():
            parts.append(key if index == 0 else f".{key}")
        else:
            parts.append(f"[{json.dumps(key, ensure_ascii=False)}]")
    return "".join(parts)


def is_graph_run(events: list[dict[str, Any]]) -> bool:
    """Whether a run's first page of history (``event_json`` entries) holds a
    checkpoint: a graph run writes its first before anything else it journals,
    so any other run is told apart without reading its whole history."""
    return any(event.get("kind") == KIND for event in events)


def graph_view(app: App, record: RunRecord, params: QueryParams) -> dict[str, Any] | None:
    """What the run page shows of graph run ``record`` (``None``: it has no checkpoint)."""
    history = app.graph_readers.of(record)
    steps = history.chain.steps
    if not steps:
        return None
    before = _number(params, "steps")
    a, b = _number(params, "a"), _number(params, "b")
    listed = history.checkpoints(before=before, limit=PAGE)
    base = f"/runs/{quote(record.run_id, safe='')}"

    def link(**query: int | None) -> str:  # numbers only: nothing to encode
        given = "&".join(f"{k}={v}" for k, v in query.items() if v is not None)
        return base + ("?" + given if given else "") + "#graph"

    rows = [{"step": c.step, "ran": compact(c.nodes), "next": compact(c.next), "at": c.at, "parent": c.parent,
             "diff": link(steps=before, a=c.parent, b=c.step) if c.parent is not None else None,
             "error": c.error}
            for c in listed]
    older = newer = None
    if listed and listed[-1].step > steps[0]:
        older = link(steps=listed[-1].step, a=a, b=b)
    if listed and listed[0].step < steps[-1]:
        top = bisect.bisect_right(steps, listed[0].step) + PAGE - 1  # the newest step of the newer page
        newer = link(steps=steps[top] + 1 if top < len(steps) - 1 else None, a=a, b=b)
    view: dict[str, Any] = {
        "rows": rows, "older": older, "newer": newer,
        "newest": link(a=a, b=b) if before is not None else None,
        "count": len(steps), "first": steps[0], "latest": steps[-1], "before": before,
        "a": a if a is not None else (steps[-2] if len(steps) > 1 else steps[-1]),
        "b": b if b is not None else steps[-1], "diff": None, "diff_error": None,
    }
    if a is not None or b is not None:
        try:
            view["diff"] = _diff(history, record.run_id, view["a"], view["b"])
        except (InvalidArgument, PayloadError, ValueError, TypeError) as exc:
            view["diff_error"] = str(exc)
    return view


def _diff(history: GraphHistory, run_id: str, a: int, b: int) -> dict[str, Any]:
    states = []
    for step in (a, b):
        if step not in history.entries:
            raise InvalidArgument(f"run {run_id!r} has no checkpoint at super-step {step}")
        states.append(history.chain.state(None, step, f"checkpoint {step} of run {run_id!r}"))
    changes = diffs.to_json(diffs.diff(states[0], states[1]))
    shown = [{"path": path_text(tuple(c["path"])), "kind": c["kind"],
              "old": None if c["old"] is None and c["kind"] in ("added", "appended", "inserted")
              else _shown(c["old"]),
              "new": None if c["new"] is None and c["kind"] in ("removed", "deleted") else _shown(c["new"])}
             for c in changes[:MAX_CHANGES]]
    return {"a": a, "b": b, "changes": shown, "more": max(0, len(changes) - MAX_CHANGES)}
