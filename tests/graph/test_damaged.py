"""Damaged checkpoints (both backends): a checkpoint row changed behind
Cairn's back (a bad restore, a disk, an attacker with SQL) is refused with
a one-line ``PayloadError`` naming the run and the checkpoint, never read
as a wrong state: a reader refuses the state that depends on it (and only
that: the states before it, and the other checkpoints of a history page,
still read), and a resumed run is parked ``incompatible``, never failed
for good, never run on from a wrong state.

Run ``a`` of the graph below pauses (an approval before ``finish``) after
checkpoint 5; one of its rows is damaged; then it is read and resumed."""

from __future__ import annotations

import json
import sqlite3
from typing import Annotated, Any, TypedDict

import psycopg
import pytest

import cairn
from cairn.errors import CairnError, PayloadError, RunSuspended
from cairn.graph import checkpoints as format_
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, RunStatus
from cairn.store.sqlite import SQLiteStore


class Chat(TypedDict):
    messages: Annotated[list[str], cairn.append]
    n: int
    big: str


def chat_graph() -> cairn.Graph:
    g = cairn.Graph(Chat)

    @g.node
    def talk(state: Chat) -> dict[str, Any]:
        return {"messages": [f"m{state['n']}:{state['big']}"], "n": state["n"] + 1}

    @g.node(interrupt_before=True)
    def finish(state: Chat) -> dict[str, Any]:
        return {"big": "done"}

    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: "finish" if s["n"] >= 5 else "talk")
    g.edge("finish", cairn.END)
    return g


def expected(step: int, big: str = "") -> dict[str, Any]:
    return {"messages": [f"m{n}:{big}" for n in range(step)], "n": step, "big": big}


class Rows:
    """Run ``a``'s checkpoint rows, read and changed behind the store's back."""

    def __init__(self, app: cairn.App, request: pytest.FixtureRequest) -> None:
        self.app = app
        self.store = app.store
        self.pg_url = request.getfixturevalue("pg_url") if isinstance(self.store, PostgresStore) else None

    def sql(self, statement: str, *params: Any) -> None:
        if isinstance(self.store, SQLiteStore):
            with sqlite3.connect(self.store.path) as conn:
                conn.execute(statement.replace("{t}", "").replace("%s", "?"), params)
            return
        assert isinstance(self.store, PostgresStore)
        assert self.pg_url is not None
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            conn.execute(f"SET search_path = {self.store.schema}")  # the store's triggers name tables bare
            conn.execute(statement.replace("{t}", f"{self.store.schema}."), params)

    def entry(self, run_id: str, step: int) -> Any:
        [found] = [e for e in self.app.history(run_id) if e.step_kind == format_.KIND
                   and e.event is EventType.STEP_COMPLETED and e.name == format_.entry_name(step)]
        return found

    def raw(self, run_id: str, step: int) -> bytes:
        entry = self.entry(run_id, step)
        return self.app.runtime.payloads.raw(entry.payload, what="a checkpoint")

    def record(self, run_id: str, step: int) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.raw(run_id, step))
        return found

    def write(self, step: int, payload: bytes | dict[str, Any], run_id: str = "a") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.sql("UPDATE {t}history SET payload = %s, payload_ref = NULL WHERE run_id = %s AND seq = %s",
                 data, run_id, self.entry(run_id, step).seq)

    def edit(self, step: int, change: Any) -> None:
        record = self.record("a", step)
        change(record)
        self.write(step, record)


def _set(record: dict[str, Any], key: str, value: Any) -> None:
    record[key] = value


def _version(record: dict[str, Any], field: str, value: Any) -> None:
    record["versions"][field] = value


def _duplicate(rows: Rows) -> None:
    """A copy of checkpoint 3's row at a new history position, as if written twice."""
    entries = rows.app.history("a")
    seq = max(e.seq for e in entries) + 1
    position = max(e.position or 0 for e in entries) + 1
    source = rows.entry("a", 3).seq
    columns = ("event, at, epoch, worker, step_kind, name, input_hash, attempt, started_at, payload, "
               "payload_ref, detail, tenant")
    rows.sql(f"INSERT INTO {{t}}history (run_id, seq, position, {columns}) "
             f"SELECT run_id, %s, %s, {columns} FROM {{t}}history WHERE run_id = %s AND seq = %s",
             seq, position, "a", source)


def _markup(record: dict[str, Any]) -> None:
    record["versions"]["<script>alert(1)</script>\n<b>"] = [9, 9]
    record["nodes"] = ["<img src=x onerror=alert(1)>"]


#: kind -> (how checkpoint rows of run ``a`` are damaged, what the error says, the damaged checkpoint)
DAMAGES: dict[str, tuple[Any, str, int]] = {
    "truncated": (lambda rows: rows.write(3, rows.raw("a", 3)[:40]), "cannot be read", 3),
    "wrong_types": (lambda rows: rows.edit(3, lambda r: _version(r, "n", "three")), "cannot be read", 3),
    "missing_field": (lambda rows: rows.edit(3, lambda r: r.pop("versions")), "cannot be read", 3),
    "points_forward": (lambda rows: rows.edit(5, lambda r: _version(r, "n", [9, 9])), "[9, 9]", 5),
    "points_backward": (lambda rows: rows.edit(5, lambda r: _version(r, "n", [2, 2])), "'n'", 5),
    "points_at_non_setting": (lambda rows: rows.edit(5, lambda r: _version(r, "big", [4, 4])), "'big'", 5),
    "points_at_nothing": (lambda rows: rows.edit(5, lambda r: _version(r, "big", [-1, -1])), "'big'", 5),
    "deleted_middle_row": (lambda rows: rows.sql("DELETE FROM {t}history WHERE run_id = %s AND seq = %s",
                                                 "a", rows.entry("a", 3).seq), "checkpoint 3", 4),
    "duplicated_row": (_duplicate, "twice", 3),
    "misplaced_row": (lambda rows: rows.write(4, rows.raw("a", 3)), "super-step 3", 4),
    "foreign_run_row": (lambda rows: rows.write(3, rows.raw("b", 3)), "run 'b'", 3),
    "wrong_parent": (lambda rows: rows.edit(4, lambda r: _set(r, "parent", 1)), "parent", 4),
    "markup": (lambda rows: rows.edit(5, _markup), "<script>", 5),
}


def one_line(exc: BaseException) -> str:
    message = str(exc)
    assert "\n" not in message, message
    assert len(message) < 600, message
    return message


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_a_damaged_checkpoint_is_refused_naming_it_and_parks_the_run(
        app: cairn.App, request: pytest.FixtureRequest, kind: str) -> None:
    damage, says, damaged = DAMAGES[kind]
    chat = app.graph("chat", chat_graph())
    for run_id, big in (("a", ""), ("b", "B")):
        with pytest.raises(RunSuspended):
            app.run(chat, {"messages": [], "n": 0, "big": big}, run_id=run_id)
    rows = Rows(app, request)
    damage(rows)

    reader = cairn.App(store=app.store)  # has read nothing of the run before the damage
    reader.graph("chat", chat_graph())
    for read in (lambda: reader.graph_state_json("a"), lambda: reader.graph_state("a"),
                 lambda: reader.graph_state_json("a", damaged), lambda: reader.graph_diff("a", 0, 5)):
        with pytest.raises(PayloadError) as raised:
            read()
        message = one_line(raised.value)
        assert f"checkpoint {damaged} of run 'a'" in message, message
        assert says in message, message
    # what does not depend on the damaged checkpoint still reads, from the same reader
    assert reader.graph_state_json("a", 2) == (2, expected(2))
    assert reader.graph_state("a", 1) == expected(1)
    page = reader.checkpoints("a")
    assert [c.step for c in page if c.error is None and c.step < 3] == [2, 1, 0]
    [bad] = [c for c in page if c.step == damaged]
    assert bad.error is not None
    assert f"checkpoint {damaged} of run 'a'" in one_line(PayloadError(bad.error))
    assert reader.graph_state_json("b") == (5, expected(5, "B"))  # another run of the same graph

    [approval] = app.approvals(run_id="a")
    app.approve("a", approval.request_id)
    with pytest.raises(CairnError) as raised:
        app.resume("a")
    assert f"checkpoint {damaged} of run 'a'" in one_line(raised.value)
    run = app.get_run("a")
    assert run.status is RunStatus.INCOMPATIBLE, (run.status, run.error)
    [parked] = [e for e in app.history("a") if e.event is EventType.RUN_INCOMPATIBLE]
    why = str((parked.detail or {}).get("why"))
    assert f"checkpoint {damaged} of run 'a'" in one_line(PayloadError(why)), why
    assert [e for e in app.history("a") if e.name == "step 6"] == []  # nothing written past the damage


class Pair(TypedDict):
    n: int
    big: str


def test_a_version_naming_a_checkpoint_that_did_not_change_the_field_is_refused() -> None:
    """Checkpoint 3 says field 'big' last changed at 1, which did not change it;
    its parent (2) is unreadable, so only following the version can tell."""
    from cairn.graph.state import Schema

    schema = Schema(Pair)
    versions: dict[str, list[int]] = {}
    raws: dict[int, bytes] = {}
    state: dict[str, Any] = {}
    for step in range(4):
        after = {"n": step, "big": ""}
        raws[step] = format_.write(schema, step, [], state, after, {}, [], versions,
                                   None if step == 0 else step - 1, "r")
        state = after
    raws[2] = b"{"
    third = json.loads(raws[3])
    third["versions"]["big"] = [1, 1]
    raws[3] = json.dumps(third).encode()

    def load(step: int) -> format_.Record:
        return format_.decode(raws[step], format_.what_of("r", step), step=step, run="r")

    chain = format_.Chain(list(raws), load, what=lambda step: format_.what_of("r", step))
    assert chain.state(schema, 1, "state 1") == {"n": 1, "big": ""}
    says = r"checkpoint 3 of run 'r' is damaged: field 'big' was last changed at super-step 1, but "
    with pytest.raises(PayloadError, match=says + r"checkpoint 1 says \[0, 0\]"):
        chain.state(schema, 3, "state 3")
