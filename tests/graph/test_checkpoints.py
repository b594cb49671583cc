"""Step 3 of graph workflows: checkpoints that grow with the data.

One checkpoint per super-step: an appended list stores its new items, an
unchanged field nothing, any other field its new value; the state at any
checkpoint reads by reference (no fold from the start); a large value goes
to the artifact store once; a stale holder's checkpoint is refused by the
fence, so a run's chain never forks."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import string
import threading
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

import cairn
from cairn.engine.executor import execute
from cairn.graph import checkpoints as format_
from cairn.store.records import EventType


class Chat(TypedDict):
    messages: Annotated[list[str], cairn.append]
    n: int
    big: str


def chat_graph(steps: int, size: int = 1024, seed: int = 7) -> cairn.Graph:
    g = cairn.Graph(Chat)
    rnd = random.Random(seed)

    @g.node
    def talk(state: Chat) -> dict[str, Any]:
        text = "".join(rnd.choice(string.ascii_letters) for _ in range(size))
        return {"messages": [text], "n": state["n"] + 1}

    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: cairn.END if s["n"] >= steps else "talk")
    return g


START_STATE: Chat = {"messages": [], "n": 0, "big": ""}


def records(app: cairn.App, run_id: str) -> dict[int, dict[str, Any]]:
    found = {}
    for entry in app.history(run_id):
        if entry.step_kind == format_.KIND and entry.event is EventType.STEP_COMPLETED:
            assert entry.payload is not None
            raw = app.runtime.payloads.raw(entry.payload, what="a checkpoint")
            found[int(str(entry.name).split()[1])] = json.loads(raw)
    return found


def test_a_checkpoint_stores_new_items_changed_values_and_nothing_unchanged(app: cairn.App) -> None:
    app.run(app.graph("chat", chat_graph(3, size=4)), START_STATE, run_id="c")
    stored = records(app, "c")
    assert sorted(stored) == [0, 1, 2, 3]
    assert stored[0]["set"] == {"messages": [], "n": 0, "big": ""}  # the input
    for step in (1, 2, 3):
        assert list(stored[step]["add"]) == ["messages"]
        assert len(stored[step]["add"]["messages"]) == 1  # only the new item
        assert stored[step]["set"] == {"n": step}  # 'big' did not change: stored nowhere
        assert stored[step]["versions"] == {"messages": [step, 0], "n": [step, step], "big": [0, 0]}
        assert stored[step]["parent"] == step - 1


class Pad(TypedDict):
    notes: Annotated[list[dict[str, int]], cairn.append]
    tags: list[str]
    n: int


def test_a_checkpoint_stores_a_value_as_a_router_left_it_and_encodes_a_new_text_once(
        app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint stores the record its values were validated from, not a
    second encoding of them, when they cannot have changed since (text, a
    number); a list or a dict a router changed in place (it sees the state)
    is encoded as it is when the checkpoint is written, as the run holds it."""
    from cairn.codec import values

    g = cairn.Graph(Pad)

    @g.node
    def write(state: Pad) -> dict[str, Any]:
        return {"notes": [{"n": state["n"]}], "tags": ["t"], "n": state["n"] + 1}

    def route(state: Pad) -> str:
        state["tags"].append("router")  # in place: the state's own list
        state["notes"][-1]["by"] = 1  # in place: the item just appended
        return cairn.END if state["n"] >= 2 else "write"

    g.edge(cairn.START, "write")
    g.route("write", route)
    encoded: list[Any] = []
    encode = values.encode

    def counting(value: Any, as_type: Any = None) -> bytes:
        encoded.append(value)
        return encode(value, as_type)

    monkeypatch.setattr(values, "encode", counting)
    app.run(app.graph("pad", g), {"notes": [], "tags": ["x", "y"], "n": 0}, run_id="p")
    stored = records(app, "p")
    assert stored[1]["set"]["tags"] == ["t", "router"]  # at 2 the same again: unchanged, not stored
    for step in (1, 2):
        assert stored[step]["add"]["notes"] == [{"n": step - 1, "by": 1}]
        assert stored[step]["set"]["n"] == step
    assert encoded.count(1) == encoded.count(2) == 1  # n: validated, then stored as validated
    assert app.graph_state("p") == {"notes": [{"n": 0, "by": 1}, {"n": 1, "by": 1}], "tags": ["t", "router"],
                                    "n": 2}


def test_the_state_at_every_checkpoint_and_the_history_newest_first(app: cairn.App) -> None:
    final = app.run(app.graph("chat", chat_graph(12, size=8)), START_STATE, run_id="c")
    for step in range(13):
        state = app.graph_state("c", step)
        assert state["messages"] == final["messages"][:step]
        assert state["n"] == step
    assert app.graph_state("c") == final
    page = app.checkpoints("c", limit=5)
    assert [c.step for c in page] == [12, 11, 10, 9, 8]
    assert [c.step for c in app.checkpoints("c", before=page[-1].step, limit=5)] == [7, 6, 5, 4, 3]
    assert [c.step for c in app.checkpoints("c", before=3)] == [2, 1, 0]
    assert (page[0].next, page[1].next, page[0].nodes) == ((), ("talk",), ("talk",))
    with pytest.raises(cairn.InvalidArgument, match="no checkpoint at super-step 99"):
        app.graph_state("c", 99)


def test_on_disk_storage_of_300_steps_appending_1kb_is_at_most_1_3x_the_logical_bytes(tmp_path: Path) -> None:
    """SQLite only: it measures the database file itself, after
    ``wal_checkpoint(TRUNCATE)`` and ``VACUUM``,
    plus artifacts, minus the same for a run of the same graph that
    appends nothing; the logical bytes are the 300 KiB of messages."""
    def on_disk(name: str, steps: int, size: int) -> int:
        path = tmp_path / name
        path.mkdir()
        app = cairn.App(db=f"sqlite:///{path}/cairn.db")
        try:
            app.run(app.graph("chat", chat_graph(steps, size), max_steps=1000), START_STATE, run_id="r")
        finally:
            app.close()
        db = sqlite3.connect(path / "cairn.db")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("VACUUM")
        db.close()
        return sum(os.path.getsize(Path(root) / f) for root, _, files in os.walk(path) for f in files)

    baseline = on_disk("empty", 1, 0)
    used = on_disk("full", 300, 1024) - baseline
    ratio = used / (300 * 1024)
    assert ratio <= 1.3, f"{used} bytes on disk for {300 * 1024} logical: {ratio:.2f}x"


def test_a_10_mb_value_goes_to_the_artifact_store_once(app: cairn.App) -> None:
    g = cairn.Graph(Chat)
    big = "x" * (10 * 1024 * 1024)

    @g.node
    def load(state: Chat) -> dict[str, Any]:
        return {"big": big} if state["n"] == 0 else {"n": state["n"] + 1}

    @g.node
    def count(state: Chat) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    g.edge(cairn.START, "load")
    g.edge("load", "count")
    g.route("count", lambda s: cairn.END if s["n"] >= 5 else "count")
    final = app.run(app.graph("big", g), START_STATE, run_id="big")
    assert final["big"] == big
    entries = [e for e in app.history("big") if e.step_kind == format_.KIND]
    by_reference = [e for e in entries if e.payload is not None and e.payload.ref is not None]
    assert len(by_reference) == 1  # the checkpoint that set it; the others do not copy it
    assert all(len(e.payload.data or b"") < 1024 for e in entries if e not in by_reference)
    assert app.graph_state("big", 2)["big"] == big


def test_a_stale_holders_checkpoint_is_refused_and_the_chain_never_forks(app: cairn.App) -> None:
    """w1 holds the run with a short lease and is inside super-step 2 when
    its lease runs out; w2 takes the run over and finishes it; then w1's
    node returns and w1 tries to commit checkpoint 2: refused by the fence."""
    inside, go_on = threading.Event(), threading.Event()
    runs: list[str] = []
    g = cairn.Graph(Chat)

    def talk(state: Chat) -> dict[str, Any]:
        who = threading.current_thread().name
        runs.append(f"{who}:{state['n']}")
        if who == "w1" and state["n"] == 1:
            inside.set()
            assert go_on.wait(30)
        return {"messages": [f"{who}:{state['n']}"], "n": state["n"] + 1}

    g.node(talk)
    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: cairn.END if s["n"] >= 4 else "talk")
    workflow = app.graph("fenced", g)
    app.start(workflow, START_STATE, run_id="f")
    store = app.store
    claim = store.claim_run("f", "w1", 0.5, 5)
    assert claim is not None
    outcome: list[str] = []
    w1 = threading.Thread(target=lambda: outcome.append(execute(app.runtime, claim, "w1").status), name="w1")
    w1.start()
    assert inside.wait(30)
    taken = None
    deadline = time.monotonic() + 30
    while taken is None and time.monotonic() < deadline:
        time.sleep(0.2)
        taken = store.claim_run("f", "w2", 30.0, 5)  # once w1's lease has expired
    assert taken is not None
    done: list[str] = []
    w2 = threading.Thread(target=lambda: done.append(execute(app.runtime, taken, "w2").status), name="w2")
    w2.start()
    w2.join(30)
    assert done == ["completed"]
    go_on.set()
    w1.join(30)
    assert outcome == ["lost"] or outcome == ["abandoned"]
    steps = [c.step for c in app.checkpoints("f")]
    assert steps == [4, 3, 2, 1, 0]  # one chain: no second checkpoint 2
    assert app.graph_state("f")["messages"] == ["w1:0", "w2:1", "w2:2", "w2:3"]
    assert "w1:1" in runs  # w1 did run the node: only its checkpoint was refused
    writers = {e.name: e.worker for e in app.history("f") if e.step_kind == format_.KIND}
    assert writers == {"step 0": "w1", "step 1": "w1", "step 2": "w2", "step 3": "w2", "step 4": "w2"}


def test_readers_without_the_graphs_code_read_plain_json(app: cairn.App) -> None:
    """The CLI and the HTTP API read checkpoints with no user code loaded:
    the versions alone say which fields are lists that grew."""
    final = app.run(app.graph("chat", chat_graph(4, size=4)), START_STATE, run_id="c")
    bare = cairn.App(store=app.store)  # registers nothing (shares the store: not closed here)
    assert [c.step for c in bare.checkpoints("c")] == [4, 3, 2, 1, 0]
    assert bare.graph_state_json("c") == (4, final)
    assert bare.graph_state_json("c", 2) == (2, {"messages": final["messages"][:2], "n": 2, "big": ""})
    with pytest.raises(cairn.InvalidArgument, match="not a run of a graph registered here"):
        bare.graph_state("c")  # the typed reader needs the state type
