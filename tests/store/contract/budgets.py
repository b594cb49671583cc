"""Store contract: per-run budgets: set_budget and budget suspensions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cairn.errors import InvalidRunState, RunNotFound
from cairn.store.contract import Store
from cairn.store.records import (
    EventType,
    RunFilter,
    RunStatus,
)
from tests.store.contract.helpers import (
    LEASE,
    WF,
    ContractBase,
    FakeClock,
    claim,
    claimable_ids,
    ev,
    new_run,
    park,
    put_in_state,
    running,
)


class BudgetsContract(ContractBase):
    # -- budgets ---------------------------------------------------------------------

    def test_set_budget_replaces_the_budget(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1", budget={"max_tokens": 100, "max_usd": 0.5}))
        history = store.history("r1")
        clock.advance(4)
        record = store.set_budget("r1", {"max_tokens": 500, "tools": ("search",)})
        normalised = {"max_tokens": 500, "tools": ["search"]}
        assert record.budget == normalised
        assert (record.status, record.epoch, record.updated_at) == (RunStatus.PENDING, 0, clock())
        assert store.get_run("r1") == record
        full = store.history("r1")
        assert full[:-1] == history
        last = full[-1]
        assert (last.event, last.detail, last.epoch, last.at, last.worker) == (
            EventType.RUN_BUDGET_CHANGED,
            {"budget": normalised},
            0,
            clock(),
            None,
        )
        assert claimable_ids(store) == {"r1"}

    def test_set_budget_refuses_running_runs(self, store: Store, clock: FakeClock) -> None:
        """Only the holder may append to a running run's history, and it reads
        its limits at claim time: a running run's budget cannot change under it."""
        c = running(store, clock)
        before = (store.get_run("r1"), store.history("r1"))
        with pytest.raises(InvalidRunState, match="running"):
            store.set_budget("r1", {"max_tool_calls": 3})
        assert (store.get_run("r1"), store.history("r1")) == before
        assert store.renew_leases("w1", {"r1": c.run.epoch}, LEASE) == set()
        store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)])  # the holder goes on

    @pytest.mark.parametrize("parked", ["timer", "child", "needs_attention"])
    def test_set_budget_wakes_only_budget_suspensions(
        self, store: Store, clock: FakeClock, parked: str
    ) -> None:
        c = running(store, clock)
        store.create_run(new_run("broke"))
        park(store, clock, claim(store, "broke", "w2"))
        if parked == "timer":
            park(store, clock, c, wake_at=clock() + 100)
        elif parked == "child":
            store.start_child("r1", c.run.epoch, ev(clock, "r1", c.next_seq, c.run.epoch), new_run("kid"))
            park(store, clock, c, waiting_on="kid", seq=c.next_seq + 1)
        else:
            park(store, clock, c, RunStatus.NEEDS_ATTENTION)
        before = store.get_run("r1")
        assert before is not None
        clock.advance(1)
        for rid in ("r1", "broke"):
            store.set_budget(rid, {"max_tokens": 1_000_000})
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.wake_at, record.waiting_on) == (
            before.status,
            before.wake_at,
            before.waiting_on,
        )
        assert store.claim_run("r1", "w3", LEASE, 3) is None
        expected = {"broke", "kid"} if parked == "child" else {"broke"}
        assert {x.run.run_id for x in store.claim_runs("w3", [WF], 10, LEASE, 3)} == expected
        if parked == "timer":  # the timer still fires when it is due
            clock.advance(100)
            assert claim(store, "r1", "w3").history[-1].event is EventType.RUN_WOKEN

    @pytest.mark.parametrize("state", ["completed", "cancelled"])
    def test_set_budget_refuses_a_run_that_will_not_run_again(
        self, store: Store, clock: FakeClock, state: str
    ) -> None:
        put_in_state(store, clock, "r1", state)
        before = store.get_run("r1")
        with pytest.raises(InvalidRunState, match="will not run again"):
            store.set_budget("r1", {"max_tokens": 1})
        assert store.get_run("r1") == before

    @pytest.mark.parametrize("state", ["killed", "halted"])
    def test_set_budget_does_not_revive_a_finished_run(
        self, store: Store, clock: FakeClock, state: str
    ) -> None:
        put_in_state(store, clock, "r1", state)
        before = store.get_run("r1")
        assert before is not None
        record = store.set_budget("r1", {"max_tokens": 1})
        assert (record.status, record.epoch) == (before.status, before.epoch)
        assert record.budget == {"max_tokens": 1}
        clock.advance(LEASE * 10)
        assert store.claim_run("r1", "w2", LEASE, 3) is None

    def test_set_budget_unknown_run(self, store: Store) -> None:
        with pytest.raises(RunNotFound):
            store.set_budget("ghost", {"max_tokens": 1})

    @pytest.mark.parametrize("how", ["create_run", "create_claimed_run", "start_child"])
    def test_budget_round_trips_as_json(self, store: Store, clock: FakeClock, how: str) -> None:
        """Stored and returned as JSON would keep it: tuples read back as lists."""
        budget = {"max_tokens": 1000, "max_usd": 2.5, "tools": ("search", "fetch"), "wall": None}
        normalised = {"max_tokens": 1000, "max_usd": 2.5, "tools": ["search", "fetch"], "wall": None}
        spec = new_run("r1", budget=budget)
        if how == "create_run":
            returned = store.create_run(spec)[0]
        elif how == "create_claimed_run":
            got = store.create_claimed_run(spec, "w1", LEASE)
            assert got is not None
            returned = got.run
        else:
            p = running(store, clock, "parent")
            event = ev(clock, "parent", p.next_seq, p.run.epoch)
            returned = store.start_child("parent", p.run.epoch, event, spec)
        assert returned.budget == normalised
        assert store.get_run("r1") == returned
        assert [r for r in store.list_runs(RunFilter()) if r.run_id == "r1"] == [returned]

    def test_budget_is_none_unless_given(self, store: Store, clock: FakeClock) -> None:
        assert store.create_run(new_run("r1"))[0].budget is None
        assert store.get_run("r1").budget is None  # type: ignore[union-attr]
        assert store.create_run(new_run("r1", budget={"max_tokens": 1}))[1] is False
        assert store.get_run("r1").budget is None  # type: ignore[union-attr]

    def test_budget_values_are_copies(self, store: Store, clock: FakeClock) -> None:
        budget: dict[str, Any] = {"max_tokens": 10, "tools": ["a"]}
        returned = store.create_run(new_run("r1", budget=budget))[0]
        budget["tools"].append("changed by caller")
        budget["max_tokens"] = 0
        assert returned.budget == {"max_tokens": 10, "tools": ["a"]}
        got = store.get_run("r1")
        assert got is not None
        assert got.budget == {"max_tokens": 10, "tools": ["a"]}
        got.budget["tools"].append("changed again")
        store.list_runs(RunFilter())[0].budget["max_tokens"] = 99  # type: ignore[index]
        new_budget: dict[str, Any] = {"max_tokens": 20}
        changed = store.set_budget("r1", new_budget)
        new_budget["max_tokens"] = 0
        changed.budget["max_tokens"] = 1  # type: ignore[index]
        assert store.get_run("r1").budget == {"max_tokens": 20}  # type: ignore[union-attr]
        assert store.history("r1")[-1].detail == {"budget": {"max_tokens": 20}}

    # -- usage, summed by the store ------------------------------------------------------

    def test_usage_is_summed_in_the_store_as_the_journal_sums_it(self, store: Store,
                                                                 clock: FakeClock) -> None:
        """``run_usage`` is what ``Journal(history).usage`` makes of the whole
        history, and the last ``seq``, without the history leaving the
        database (a read of a 20,000-entry run loaded all of it to answer
        three numbers)."""
        from cairn.engine.journal import Journal

        c = running(store, clock)
        epoch, seq = c.run.epoch, c.next_seq
        model = {"usage": {"total_tokens": 120, "prompt_tokens": 100}, "cost": 0.25}
        entries = [
            ev(clock, "r1", seq, epoch, position=0, step_kind="model", detail=model),
            ev(clock, "r1", seq + 1, epoch, position=1, step_kind="model",
               detail={"usage": {"total_tokens": 7}, "cost": 0.5}),
            ev(clock, "r1", seq + 2, epoch, position=2, step_kind="model", detail={"usage": None}),
            ev(clock, "r1", seq + 3, epoch, EventType.STEP_RETRIED, position=3, step_kind="tool"),
            ev(clock, "r1", seq + 4, epoch, EventType.STEP_FAILED, position=3, step_kind="tool"),
            ev(clock, "r1", seq + 5, epoch, position=4, step_kind="tool"),
            ev(clock, "r1", seq + 6, epoch, EventType.STEP_FAILED, position=5, step_kind="model",
               detail={"usage": {"total_tokens": 1000}, "cost": 9.0}),  # a failed call is not counted
            ev(clock, "r1", seq + 7, epoch, position=6),
        ]
        store.append("r1", epoch, entries)
        usage = Journal(store.history("r1")).usage
        assert (usage.tokens, usage.cost, usage.tool_calls) == (127, 0.75, 3)
        totals = store.run_usage("r1")
        assert (totals.tokens, totals.cost, totals.tool_calls) == (127, 0.75, 3)
        assert totals.last_seq == seq + 7
        empty = store.run_usage("nobody")
        assert (empty.tokens, empty.cost, empty.tool_calls, empty.last_seq) == (0, 0.0, 0, 0)

    def test_history_at_and_model_calls_read_only_the_entries_asked(self, store: Store,
                                                                    clock: FakeClock) -> None:
        """``history_at`` answers the entries at the seqs given (those that
        exist, in order) and ``model_calls`` a page of recorded model calls
        filtered in the database: what a page of a long run's model calls
        reads instead of its whole history."""
        import random

        from cairn.store.records import Payload

        c = running(store, clock)
        epoch, seq = c.run.epoch, c.next_seq
        # hex of random bytes: packed, still over what a SQLite row keeps (it is spilled)
        big = Payload(data=f'"{random.Random(3).randbytes(2000).hex()}"'.encode())
        entries = [
            ev(clock, "r1", seq, epoch, position=0, step_kind="model", payload=big),
            ev(clock, "r1", seq + 1, epoch, position=1),
            ev(clock, "r1", seq + 2, epoch, EventType.STEP_FAILED, position=2, step_kind="model"),
            ev(clock, "r1", seq + 3, epoch, position=3, step_kind="model", payload=None),
            ev(clock, "r1", seq + 4, epoch, position=4, step_kind="model"),
            ev(clock, "r1", seq + 5, epoch, position=5, step_kind="tool"),
            ev(clock, "r1", seq + 6, epoch, position=6, step_kind="model"),
        ]
        store.append("r1", epoch, entries)
        whole = {e.seq: e for e in store.history("r1")}
        asked = store.history_at("r1", {seq + 6, seq, seq + 4, 10_000})
        assert asked == [whole[s] for s in (seq, seq + 4, seq + 6)]
        assert store.history_at("r1", []) == []
        assert store.history_at("nobody", [seq]) == []
        # the headers: every entry after the seq asked, as history has it, with no payload
        headers = store.history_headers("r1", seq)
        assert [e.seq for e in headers] == [s for s in sorted(whole) if s > seq]
        assert all(e.payload is None for e in headers)
        assert [replace(e, payload=None) for e in store.history("r1")] == store.history_headers("r1")
        assert store.history_headers("nobody") == []
        # the index: the same entries, as their seq, type, position, kind, name and time
        index = store.history_index("r1", seq)
        assert [(e.seq, e.event, e.position, e.step_kind, e.name, e.at) for e in index] == [
            (e.seq, e.event.value, e.position, e.step_kind, e.name, e.at) for e in headers]
        assert len(store.history_index("r1")) == len(whole)
        assert store.history_index("nobody") == []
        # the newest entries only, still in order (a cold reader's first page of a graph run)
        assert store.history_index("r1", seq, last=2) == index[-2:]
        assert store.history_index("r1", last=len(whole) + 5) == store.history_index("r1")
        assert store.history_index("r1", last=0) == []
        assert whole[seq].payload == big  # the spilled payload comes back whole
        assert store.model_calls("r1") == [whole[s] for s in (seq, seq + 4, seq + 6)]
        assert store.model_calls("r1", seq, 1) == [whole[seq + 4]]
        assert store.model_calls("r1", seq + 6) == []
