"""Store contract: fencing: a holder that lost its lease cannot write; appends and the effect barrier."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cairn.errors import LeaseLost
from cairn.store.contract import Store
from cairn.store.records import (
    RunFilter,
    RunStatus,
)
from tests.store.contract.helpers import (
    FENCED_OPS,
    LOSS_SCENARIOS,
    ContractBase,
    FakeClock,
    _fenced_write,
    _lost_by_takeover,
    assert_gap_free,
    ev,
    held_state,
    intent,
    running,
)


class FencingContract(ContractBase):
    # -- fencing ------------------------------------------------------------------

    @pytest.mark.parametrize("op", FENCED_OPS)
    @pytest.mark.parametrize("scenario", list(LOSS_SCENARIOS))
    def test_fenced_write_is_rejected_and_changes_nothing(
        self, store: Store, clock: FakeClock, op: str, scenario: str
    ) -> None:
        """The fencing matrix: every holder write of the contract
        (``HOLDER_WRITES``, through ``HOLDER_CASES``) by every holder that
        lost its lease, or never had it."""
        run_id, epoch, seq = LOSS_SCENARIOS[scenario](store, clock)
        before = held_state(store, run_id)
        listed = store.list_runs(RunFilter(limit=1000))
        clock.advance(1)
        with pytest.raises(LeaseLost) as info:
            _fenced_write(op, store, clock, run_id, epoch, seq)
        assert info.value.run_id == run_id
        assert info.value.epoch == epoch
        assert held_state(store, run_id) == before
        assert store.list_runs(RunFilter(limit=1000)) == listed

    def test_lease_lost_escapes_except_exception(self, store: Store, clock: FakeClock) -> None:
        """A stale holder's user code may catch ``Exception``; ``LeaseLost`` must
        still get through to stop the worker."""
        run_id, epoch, seq = _lost_by_takeover(store, clock)

        def user_code() -> None:
            try:
                store.append(run_id, epoch, [ev(clock, run_id, seq, epoch)])
            except Exception:  # the mistake LeaseLost must survive
                return

        with pytest.raises(LeaseLost):
            user_code()

    def test_append_batch(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        batch = [ev(clock, "r1", c.next_seq + i, c.run.epoch, position=i) for i in range(3)]
        store.append("r1", c.run.epoch, batch)
        assert store.history("r1") == [*c.history, *batch]
        more = [ev(clock, "r1", c.next_seq + 3, c.run.epoch, position=3)]
        store.append("r1", c.run.epoch, more)
        assert store.history("r1")[-1] == more[0]
        assert store.get_run("r1").status is RunStatus.RUNNING  # type: ignore[union-attr]

    @pytest.mark.parametrize("offset", [-1, -3, 1])
    def test_append_with_wrong_seq_is_rejected(self, store: Store, clock: FakeClock, offset: int) -> None:
        """A taken ``seq`` means another writer appended; a gap would break the
        gap-free history. Both are refused with ``LeaseLost``, atomically."""
        c = running(store, clock)
        epoch = c.run.epoch
        with pytest.raises(LeaseLost):
            store.append("r1", epoch, [ev(clock, "r1", c.next_seq + offset, epoch)])
        # A bad entry later in a batch voids the whole batch.
        batch = [ev(clock, "r1", c.next_seq, epoch), ev(clock, "r1", c.next_seq + 1 + offset, epoch)]
        if offset == -1:
            batch[1] = replace(batch[1], seq=c.next_seq)  # the same seq twice
        with pytest.raises(LeaseLost):
            store.append("r1", epoch, batch)
        assert store.history("r1") == c.history
        assert store.get_run("r1") == c.run
        # The lease itself is untouched: the right seq still goes through.
        store.append("r1", epoch, [ev(clock, "r1", c.next_seq, epoch)])
        assert len(store.history("r1")) == len(c.history) + 1

    # the plain append's own test is test_append_with_wrong_seq_is_rejected; an
    # expiry with no pending request writes nothing (False), whatever seq its entry has;
    # storing workspace objects appends no entry (the step's entry names them after)
    @pytest.mark.parametrize("op", [op for op in FENCED_OPS if op not in ("append", "append_batch",
                                                                          "expire_approval",
                                                                          "put_workspace_objects")])
    def test_transition_with_taken_seq_is_rejected(self, store: Store, clock: FakeClock, op: str) -> None:
        c = running(store, clock)
        before = held_state(store, "r1")
        with pytest.raises(LeaseLost):
            _fenced_write(op, store, clock, "r1", c.run.epoch, c.next_seq - 1)
        assert held_state(store, "r1") == before
        assert store.get_run("r1") == c.run
        assert store.history("r1") == c.history

    def test_append_for_another_run_is_a_bug(self, store: Store, clock: FakeClock) -> None:
        a = running(store, clock, "a")
        running(store, clock, "b")
        with pytest.raises(ValueError, match="b"):
            store.append("a", a.run.epoch, [ev(clock, "b", a.next_seq, a.run.epoch)])
        assert store.history("a") == a.history

    # -- the effect barrier ----------------------------------------------------------

    @pytest.mark.parametrize("size", [1, 3])
    def test_barrier_append_appends_like_append(self, store: Store, clock: FakeClock, size: int) -> None:
        c = running(store, clock)
        e = c.run.epoch
        batch = [intent(clock, "r1", c.next_seq + i, e, position=i) for i in range(size)]
        store.append("r1", e, batch, barrier=True)
        assert store.history("r1") == [*c.history, *batch]
        assert store.get_run("r1") == c.run
        # The lease is untouched: plain and barrier appends go on from there.
        after = ev(clock, "r1", c.next_seq + size, e, position=0)
        store.append("r1", e, [after])
        again = intent(clock, "r1", c.next_seq + size + 1, e, position=1)
        store.append("r1", e, [again], barrier=True)
        assert store.history("r1")[-2:] == [after, again]
        assert_gap_free(store.history("r1"), "r1")

    def test_barrier_append_batch_is_atomic(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        e = c.run.epoch
        batch = [intent(clock, "r1", c.next_seq, e), intent(clock, "r1", c.next_seq + 2, e, position=1)]
        with pytest.raises(LeaseLost):
            store.append("r1", e, batch, barrier=True)
        assert store.history("r1") == c.history
        assert store.get_run("r1") == c.run
