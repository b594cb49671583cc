"""What a repeated read of a long graph run costs, in counts (decoded values,
checkpoints visited), never in time: a reader decodes a list's appended items
once and shares those no caller can change (text, numbers) between reads, so
a second read of any state neither decodes nor walks the run's checkpoints
again; items that can be changed (dicts) are decoded afresh for each read."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest

import cairn
from cairn.codec import values
from cairn.errors import LogicalFailure, RunSuspended
from cairn.graph import checkpoints
from cairn.graph import checkpoints as format_
from cairn.store.records import EventType

STEPS = 40


class Chat(TypedDict):
    messages: Annotated[list[str], cairn.append]
    log: Annotated[list[dict[str, int]], cairn.append]
    n: int


def chat_graph(steps: int) -> cairn.Graph:
    g = cairn.Graph(Chat)

    @g.node
    def talk(state: Chat) -> dict[str, Any]:
        n = state["n"]
        return {"messages": [f"message {n}"], "log": [{"n": n}], "n": n + 1}

    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: cairn.END if s["n"] >= steps else "talk")
    return g


def expected(step: int) -> dict[str, Any]:
    return {"messages": [f"message {n}" for n in range(step)], "log": [{"n": n} for n in range(step)],
            "n": step}


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of ``values.decode`` and of ``Chain.record`` (checkpoints visited) since the last reset."""
    found = {"decoded": 0, "visited": 0}
    decode, record = values.decode, checkpoints.Chain.record

    def counting_decode(*args: Any, **kwargs: Any) -> Any:
        found["decoded"] += 1
        return decode(*args, **kwargs)

    def counting_record(self: checkpoints.Chain, step: int) -> checkpoints.Record:
        found["visited"] += 1
        return record(self, step)

    monkeypatch.setattr(values, "decode", counting_decode)
    monkeypatch.setattr(checkpoints.Chain, "record", counting_record)
    return found


def reset(counts: dict[str, int]) -> None:
    counts.update(decoded=0, visited=0)


def test_a_repeated_typed_read_visits_a_few_checkpoints_not_the_run(app: cairn.App,
                                                                    counts: dict[str, int]) -> None:
    app.run(app.graph("chat", chat_graph(STEPS)), {"messages": [], "log": [], "n": 0}, run_id="c")
    assert app.graph_state("c") == expected(STEPS)  # the first read walks the run once
    for step in (STEPS, 7, STEPS - 1, 0, 23):
        reset(counts)
        assert app.graph_state("c", step) == expected(step)
        # the checkpoint, and per field its base and its last change; 'log' (dicts) decodes
        # its items again, one value per checkpoint, but never walks more than that
        assert counts["visited"] <= 5 + step, step
        assert counts["decoded"] <= 3 + step, step


def test_a_repeated_plain_json_read_decodes_no_shared_item_again(app: cairn.App,
                                                                 counts: dict[str, int]) -> None:
    app.run(app.graph("chat", chat_graph(STEPS)), {"messages": [], "log": [], "n": 0}, run_id="c")
    bare = cairn.App(store=app.store)  # no graph code: the CLI's and the HTTP API's reader
    assert bare.graph_state_json("c", 5) == (5, expected(5))  # decodes as far as the latest at once
    for step in (STEPS, 11, STEPS - 1, 0, 30):
        reset(counts)
        assert bare.graph_state_json("c", step) == (step, expected(step))
        # 'n', and the base value of each list; 'log' (dicts) decodes its items again
        assert counts["decoded"] <= 3 + step, step


def test_items_a_caller_can_change_are_never_shared_between_reads(app: cairn.App) -> None:
    app.run(app.graph("chat", chat_graph(5)), {"messages": [], "log": [], "n": 0}, run_id="c")
    bare = cairn.App(store=app.store)
    for read in (lambda: app.graph_state("c"), lambda: bare.graph_state_json("c")[1]):
        state = read()
        state["log"][0]["n"] = 99
        state["log"].append({"n": -1})
        state["messages"].append("mine")
        assert read() == expected(5)


def test_a_cold_history_page_fetches_the_payloads_of_the_page_not_the_run(
        app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    from cairn.graph import reader
    from cairn.store import rows

    steps = 3 * reader.WINDOW
    app.run(app.graph("chat", chat_graph(steps)), {"messages": [], "log": [], "n": 0}, run_id="c")
    unpacked = {"n": 0}
    unpack = rows.unpack_payload

    def counting(*args: Any, **kwargs: Any) -> Any:
        unpacked["n"] += 1
        return unpack(*args, **kwargs)

    monkeypatch.setattr(rows, "unpack_payload", counting)
    cold = cairn.App(store=app.store)  # has read nothing of the run
    assert [c.step for c in cold.checkpoints("c", limit=10)] == list(range(steps, steps - 10, -1))
    assert unpacked["n"] <= 11  # the page's payloads and its oldest's parent, not a window, nor the run
    assert cold.graph_state_json("c", steps // 2) == (steps // 2, expected(steps // 2))  # the rest, when read


def spy_index(monkeypatch: pytest.MonkeyPatch, store: Any) -> list[tuple[int, int | None, int]]:
    """Every ``history_index`` call on ``store``: (after_seq, last, entries returned)."""
    calls: list[tuple[int, int | None, int]] = []
    index = store.history_index

    def spying(run_id: str, after_seq: int = 0, last: int | None = None) -> Any:
        found = index(run_id, after_seq, last)
        calls.append((after_seq, last, len(found)))
        return found

    monkeypatch.setattr(store, "history_index", spying)
    return calls


def test_a_cold_first_page_reads_the_tail_of_the_index_not_every_entry(
        app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that has read nothing of a run lists its first page from the
    newest ``TAIL`` index entries; any other read takes in the whole index,
    and reads what a reader that took it in from the start reads."""
    from cairn.graph import reader

    steps = 2 * reader.TAIL
    app.run(app.graph("chat", chat_graph(steps)), {"messages": [], "log": [], "n": 0}, run_id="c")
    whole = cairn.App(store=app.store)
    assert whole.graph_state_json("c", 1) == (1, expected(1))  # took in the whole index
    first, older = whole.checkpoints("c", limit=10), whole.checkpoints("c", before=steps - 40, limit=10)
    every = whole.checkpoints("c", limit=steps + 1)
    calls = spy_index(monkeypatch, app.store)
    cold = cairn.App(store=app.store)
    assert cold.checkpoints("c", limit=10) == first
    assert [c.step for c in first] == list(range(steps, steps - 10, -1))
    assert calls == [(0, reader.TAIL, reader.TAIL)]  # the tail only
    assert cold.checkpoints("c", before=steps - 40, limit=10) == older  # beyond the tail: the whole index
    assert [c.step for c in older] == list(range(steps - 41, steps - 51, -1))
    # what is new since the tail (nothing), then every entry, once (created, claimed, started, finished)
    assert calls[1:] == [(steps + 5, None, 0), (0, None, steps + 5)]
    assert cold.graph_state_json("c", 7) == (7, expected(7))
    assert cold.checkpoints("c", limit=steps + 1) == every
    assert calls[3:] == [(steps + 5, None, 0)] * 2  # what is new since: nothing


@pytest.mark.parametrize("back", [3, 60])
def test_a_cold_first_page_after_a_rewind_lists_the_live_checkpoints(app: cairn.App, back: int) -> None:
    """A rewind voids the checkpoints after its point: a cold reader's first
    page lists the run's live checkpoints whether the rewind's cut is in the
    tail it reads (``back`` = 3) or before it (60: the tail is all after it)."""
    from cairn.graph import reader

    turn = reader.TAIL + 10
    g = cairn.Graph(Trip)

    @g.node
    def talk(state: Trip, ctx: cairn.Context) -> dict[str, Any]:
        again = bool(ctx.rewinds())
        n = state["n"]
        if n == turn and not again:
            raise LogicalFailure("the turn was wrong", rewind_to=format_.entry_name(turn - back))
        return {"messages": [f"{'again' if again else 'first'} {n}"], "n": n + 1, "again": again}

    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: cairn.END if s["n"] >= (turn - back + 80 if s["again"] else turn + 50)
            else "talk")
    app.run(app.graph("trip", g), {"messages": [], "n": 0, "again": False}, run_id="t")
    last = turn - back + 80
    cold = cairn.App(store=app.store)
    page = cold.checkpoints("t", limit=10)
    assert [c.step for c in page] == list(range(last, last - 10, -1))
    assert page == cairn.App(store=app.store).checkpoints("t", limit=last + 1)[:10]
    assert cold.graph_state_json("t")[1]["messages"][turn - back:turn - back + 1] == [f"again {turn - back}"]


class Notes(TypedDict):
    messages: Annotated[list[str], cairn.append]
    big: dict[str, str]
    n: int


def test_a_diff_of_one_run_reads_only_the_fields_whose_versions_differ(
        app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    g = cairn.Graph(Notes)

    @g.node
    def talk(state: Notes) -> dict[str, Any]:
        return {"messages": [f"m{state['n']}"], "n": state["n"] + 1}

    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: cairn.END if s["n"] >= 6 else "talk")
    app.run(app.graph("notes", g), {"messages": [], "big": {"k": "v" * 100}, "n": 0}, run_id="c")
    read: list[str] = []
    decode = values.decode

    def watching(*args: Any, what: Any = "payload", **kwargs: Any) -> Any:
        read.append(what() if callable(what) else what)
        return decode(*args, what=what, **kwargs)

    monkeypatch.setattr(values, "decode", watching)
    changes = app.graph_diff("c", 2, 5)
    assert [(c.path, c.kind) for c in changes] == [(("messages",), "appended"), (("n",), "replaced")]
    assert changes[0].new == ["m2", "m3", "m4"]
    assert not [w for w in read if "'big'" in w]  # the same versions in both: equal unread
    read.clear()
    assert app.graph_diff("c", 0, 5, other_run="c")  # the same run named twice: still one chain
    assert not [w for w in read if "'big'" in w]


def test_a_reader_follows_an_operator_retry_of_a_failed_graph_run(app: cairn.App) -> None:
    """A retry (a cut in the journal) makes the reader rebuild its checkpoints
    and drop what it shared: the states read after it are the retried run's."""
    failing = {"at": 3}
    g = cairn.Graph(Chat)

    @g.node
    def talk(state: Chat) -> dict[str, Any]:
        n = state["n"]
        if n == failing["at"]:
            raise RuntimeError("not now")
        return {"messages": [f"message {n}"], "log": [{"n": n}], "n": n + 1}

    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: cairn.END if s["n"] >= 6 else "talk")
    chat = app.graph("chat", g)
    with pytest.raises(cairn.RunFailed):
        app.run(chat, {"messages": [], "log": [], "n": 0}, run_id="c")
    assert [c.step for c in app.checkpoints("c")] == [3, 2, 1, 0]
    assert app.graph_state_json("c") == (3, expected(3))
    failing["at"] = -1
    app.retry("c")
    app.resume("c")
    assert [c.step for c in app.checkpoints("c")] == [6, 5, 4, 3, 2, 1, 0]
    for step in (6, 2, 4):
        assert app.graph_state_json("c", step) == (step, expected(step))
        assert app.graph_state("c", step) == expected(step)


class Trip(TypedDict):
    messages: Annotated[list[str], cairn.append]
    n: int
    again: bool


def test_a_reader_follows_a_rewind_that_shortens_the_run(app: cairn.App) -> None:
    """A node's ``LogicalFailure`` sends the run back to super-step 2: the
    checkpoints from 2 on are void, and the run, taking another path, ends
    at 3 where it had reached 4. A reader that read the long run reads the
    short one after: the rewind's cut rebuilds its checkpoints (without that
    it lists the void checkpoint 4 and reads the void states)."""
    g = cairn.Graph(Trip)

    @g.node
    def talk(state: Trip, ctx: cairn.Context) -> dict[str, Any]:
        again = bool(ctx.rewinds())
        n = state["n"]
        if n == 4 and not again:
            ctx.request_approval("a wrong turn?", {"n": n})  # the run waits here, checkpoints 0 to 4 written
            raise LogicalFailure("the turn was wrong", rewind_to=format_.entry_name(2))
        return {"messages": [f"{'again' if again else 'first'} {n}"], "n": n + 1, "again": again}

    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: cairn.END if s["n"] >= (3 if s["again"] else 8) else "talk")
    trip = app.graph("trip", g)
    with pytest.raises(RunSuspended):
        app.run(trip, {"messages": [], "n": 0, "again": False}, run_id="t")
    assert [c.step for c in app.checkpoints("t")] == [4, 3, 2, 1, 0]
    long = {"messages": ["first 0", "first 1", "first 2", "first 3"], "n": 4, "again": False}
    assert app.graph_state("t") == long
    assert app.graph_state_json("t", 3)[1]["messages"] == long["messages"][:3]

    [approval] = app.approvals(run_id="t")
    app.approve("t", approval.request_id)
    app.resume("t")
    assert [e.event for e in app.history("t")].count(EventType.RUN_REWOUND) == 1
    assert [c.step for c in app.checkpoints("t")] == [3, 2, 1, 0]
    short = {"messages": ["first 0", "again 1", "again 2"], "n": 3, "again": True}
    assert app.graph_state("t") == short
    assert app.graph_state_json("t") == (3, short)
    assert app.graph_state("t", 2) == {"messages": short["messages"][:2], "n": 2, "again": True}
    assert app.graph_state_json("t", 1) == (1, {"messages": ["first 0"], "n": 1, "again": False})
    with pytest.raises(cairn.InvalidArgument, match="no checkpoint at super-step 4"):
        app.graph_state("t", 4)


def test_app_run_returns_the_state_its_execution_committed_without_reading_it_back(
        app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process that finished a graph run has its final state: ``app.run``
    returns it instead of reading every checkpoint's appends back (the same
    value the readers read); a run finished elsewhere is read from the store."""
    read: list[int] = []
    state = checkpoints.Chain.state

    def watching(self: checkpoints.Chain, *args: Any, **kwargs: Any) -> Any:
        read.append(args[1])
        return state(self, *args, **kwargs)

    monkeypatch.setattr(checkpoints.Chain, "state", watching)
    chat = app.graph("chat", chat_graph(12))
    final = app.run(chat, {"messages": [], "log": [], "n": 0}, run_id="c")
    assert final == expected(12)
    assert read == []  # not read back
    assert app.graph_state("c") == final
    assert read == [12]
    assert app.handle("c").result() == final  # taken once: read from the store now
    assert read == [12, 12]

    elsewhere = cairn.App(store=app.store)  # has not run it: reads it
    elsewhere.graph("chat", chat_graph(12))
    assert elsewhere.handle("c").result() == final
    assert read == [12, 12, 12]
