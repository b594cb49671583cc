"""Store contract: the memory tiers (issue 14), for every backend.

Writes made with a journal entry (``append_memory``) are fenced and atomic
with it; retention (TTL, refresh on read) is decided by the store's clock;
deletion by item, namespace prefix, thread, run and tenant leaves nothing
behind: no row, no outbox row, and (after pruning) no offloaded value.
"""

from __future__ import annotations

import dataclasses

import pytest

from cairn.errors import InvalidArgument, LeaseLost, PayloadError
from cairn.store.contract import ARTIFACT_GRACE_SECONDS, Store
from cairn.store.memrecords import (
    ItemDelete,
    ItemPut,
    MemoryScope,
    Provenance,
    RunPut,
    ThreadAppend,
    ThreadCompact,
)
from cairn.store.namespaces import encode_namespace, encode_prefix
from cairn.store.records import EventType, Payload, RunStatus
from tests.store.contract import FakeClock, claim, ev, finish, new_run

NS = encode_namespace(("users", "u1", "prefs"))
OTHER = encode_namespace(("users", "u10"))  # "users/u1" is not a prefix of it
OP = Provenance(actor="cli:test")
BIG = b'"' + b"x" * 300_000 + b'"'  # above the inline limit: stored as an artifact


def _v(text: str) -> Payload:
    return Payload(data=f'"{text}"'.encode())


def _put(key: str, text: str, *, ns: str = NS, index: str | None = None, ttl: float | None = None) -> ItemPut:
    return ItemPut(ns, key, _v(text), {"lang": "en"}, index, ttl)


def _keys(store: Store, tenant: str | None = "t1", prefix: str = "") -> list[tuple[str, str]]:
    return [(i.namespace, i.key) for i in store.memory_items(tenant, prefix)]


def _outbox(store: Store) -> list[tuple[object, ...]]:
    return store._select("select_all_memory_outbox", {})  # type: ignore[attr-defined, no-any-return]


class MemoryContract:
    # -- writes committed with the step --------------------------------------------------

    def test_writes_commit_with_the_entry_and_carry_its_provenance(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.create_run(new_run("r1", tenant="t1", thread_id="th"))
        c = claim(store, "r1")
        entry = ev(clock, "r1", c.next_seq, c.run.epoch, position=3)
        origin = Provenance("r1", 3, "op-3")
        store.append_memory("r1", c.run.epoch, [entry], [
            _put("k", "dark", index="likes dark mode"), RunPut("note", _v("n1")),
            ThreadAppend("th", (_v("hello"), _v("world")), None)], origin)
        assert store.history("r1")[-1].position == 3
        item = store.memory_item("t1", NS, "k")
        assert item is not None
        assert item.tenant == "t1"  # the run's, read by the store
        assert (item.value, item.metadata, item.version) == (_v("dark"), {"lang": "en"}, 1)
        assert item.provenance == Provenance("r1", 3, "op-3", None)
        [note] = store.run_memory("r1")
        assert (note.key, note.value, note.provenance.position) == ("note", _v("n1"), 3)
        assert [m.value for m in store.thread_messages("t1", "th")] == [_v("hello"), _v("world")]
        assert [(o[0], o[1], o[2], o[3]) for o in _outbox(store)] == [("t1", NS, "k", 1)]

    def test_a_stale_holder_writes_no_memory(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1", tenant="t1", thread_id="th"))
        stale = claim(store, "r1", "w1")
        clock.advance(31)  # the lease expires; another worker takes the run over
        claim(store, "r1", "w2")
        entry = ev(clock, "r1", stale.next_seq, stale.run.epoch)
        with pytest.raises(LeaseLost):
            store.append_memory("r1", stale.run.epoch, [entry], [
                _put("k", "v"), RunPut("note", _v("n")), ThreadAppend("th", (_v("m"),), None)],
                Provenance("r1", 0, "op"))
        assert store.memory_items(None) == []
        assert store.run_memory("r1") == []
        assert store.thread_messages("t1", "th") == []
        assert _outbox(store) == []

    def test_a_refused_write_rolls_back_the_entry(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1", tenant="t1", thread_id="th"))
        c = claim(store, "r1")
        entry = ev(clock, "r1", c.next_seq, c.run.epoch)
        before = store.history("r1")
        with pytest.raises(InvalidArgument, match="compact"):  # beyond the thread's end
            store.append_memory("r1", c.run.epoch, [entry], [
                _put("k", "v"), ThreadCompact("th", 5, _v("s"))], Provenance("r1", 0, "op"))
        assert store.history("r1") == before
        assert store.memory_items(None) == []
        store.append_memory("r1", c.run.epoch, [entry], [_put("k", "v")], Provenance("r1", 0, "op"))
        assert _keys(store) == [(NS, "k")]

    def test_run_memory_takes_the_run_tenant_and_not_another(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1", tenant="t1"))
        with pytest.raises(InvalidArgument, match="no run"):
            store.write_memory("t2", [RunPut("k", _v("v"))], Provenance("r1", actor="op"))
        store.write_memory("t1", [RunPut("k", _v("v"))], Provenance("r1", actor="op"))
        assert store.run_memory("r1", tenant="t2") == []
        assert [m.key for m in store.run_memory("r1", tenant="t1")] == ["k"]

    # -- long-term items ------------------------------------------------------------------

    def test_puts_count_versions_and_prefixes_are_labels(self, store: Store, clock: FakeClock) -> None:
        store.write_memory("t1", [_put("k", "a"), _put("k2", "b", ns=OTHER)], OP)
        clock.advance(1)
        store.write_memory("t1", [_put("k", "c")], OP)
        item = store.memory_item("t1", NS, "k")
        assert item is not None
        assert (item.version, item.value, item.updated_at - item.created_at) == (2, _v("c"), 1)
        assert _keys(store, prefix=encode_prefix(("users", "u1"))) == [(NS, "k")]
        assert _keys(store, prefix=encode_prefix(("users",))) == [(NS, "k"), (OTHER, "k2")]  # label order
        assert store.memory_item("t2", NS, "k") is None
        assert store.memory_items("t2") == []

    def test_a_put_without_index_text_leaves_nothing_to_embed(self, store: Store) -> None:
        store.write_memory("t1", [_put("k", "a", index="text")], OP)
        store.write_memory("t1", [_put("k", "b", index="text 2")], OP)
        assert sorted(o[3] for o in _outbox(store)) == [1, 2]
        store.write_memory("t1", [_put("k", "c")], OP)
        assert _outbox(store) == []

    def test_markup_and_odd_unicode_round_trip(self, store: Store) -> None:
        labels = ("<script>alert(1)</script>", "ü\u200b🙂", "'; DROP TABLE memory_items; --", "%_")
        ns = encode_namespace(labels)
        value = Payload(data='{"html": "<b onclick=\\"x\\">&amp;</b>", "rtl": "\u202eabc"}'.encode())
        store.write_memory("t1", [ItemPut(ns, "k\u2028ey<>", value, {"<m>": "\u2028"}, "<i>text</i>")], OP)
        item = store.memory_item("t1", ns, "k\u2028ey<>")
        assert item is not None
        assert (item.value, item.metadata, item.index_text) == (value, {"<m>": "\u2028"}, "<i>text</i>")
        # "%_" is a label, not a pattern: a prefix "%" matches nothing
        assert _keys(store, prefix=encode_prefix(labels[:1])) == [(ns, "k\u2028ey<>")]
        assert _keys(store, prefix=encode_prefix(("%",))) == []

    def test_a_label_with_the_separator_is_refused(self) -> None:
        with pytest.raises(InvalidArgument, match="U\\+001F"):
            encode_namespace(("a\x1fb",))
        with pytest.raises(InvalidArgument, match="empty"):
            encode_namespace(("a", ""))

    # -- retention --------------------------------------------------------------------------

    def test_an_expired_item_is_invisible_at_once_and_swept(self, store: Store, clock: FakeClock) -> None:
        store.write_memory("t1", [_put("short", "a", ttl=10, index="x"), _put("long", "b")], OP)
        clock.advance(9.9)
        assert store.memory_item("t1", NS, "short") is not None
        clock.advance(0.2)
        assert store.memory_item("t1", NS, "short") is None
        assert _keys(store) == [(NS, "long")]
        assert store.sweep_memory() == 1
        assert store.sweep_memory() == 0
        assert _outbox(store) == []
        assert _keys(store) == [(NS, "long")]

    def test_refresh_on_read_renews_the_ttl_and_a_plain_read_does_not(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.write_memory("t1", [_put("a", "a", ttl=10), _put("b", "b", ttl=10)], OP)
        for _ in range(3):
            clock.advance(6)
            assert store.memory_item("t1", NS, "a", refresh=True) is not None
        assert store.memory_item("t1", NS, "b") is None  # 18 s: expired
        clock.advance(9)
        assert store.memory_item("t1", NS, "a") is not None
        clock.advance(2)
        assert store.memory_item("t1", NS, "a", refresh=True) is None  # expired reads do not revive

    def test_thread_ttl_refresh_and_restart(self, store: Store, clock: FakeClock) -> None:
        store.write_memory("t1", [ThreadAppend("th", (_v("a"),), 10)], OP)
        clock.advance(8)
        assert len(store.thread_messages("t1", "th", refresh=True)) == 1
        clock.advance(8)
        assert len(store.thread_messages("t1", "th")) == 1  # refreshed at 8: lives until 18
        clock.advance(3)
        assert store.thread_messages("t1", "th") == []
        store.write_memory("t1", [ThreadAppend("th", (_v("b"),), 10)], OP)  # a new thread
        assert [(m.index, m.value) for m in store.thread_messages("t1", "th")] == [(0, _v("b"))]

    # -- threads ------------------------------------------------------------------------------

    def test_window_and_compaction_keep_the_order(self, store: Store) -> None:
        store.write_memory("t1", [ThreadAppend("th", tuple(_v(str(i)) for i in range(6)), None)], OP)
        assert [m.index for m in store.thread_messages("t1", "th", last=2)] == [4, 5]
        assert [m.index for m in store.thread_messages("t1", "th", after=1, limit=2)] == [2, 3]
        store.write_memory("t1", [ThreadCompact("th", 4, _v("summary of 0-3"))], OP)
        got = [(m.index, m.kind, m.value) for m in store.thread_messages("t1", "th")]
        assert got == [(3, "summary", _v("summary of 0-3")), (4, "message", _v("4")), (5, "message", _v("5"))]
        store.write_memory("t1", [ThreadAppend("th", (_v("6"),), None)], OP)
        assert [m.index for m in store.thread_messages("t1", "th")] == [3, 4, 5, 6]
        with pytest.raises(InvalidArgument):
            store.write_memory("t1", [ThreadCompact("th", 0, _v("s"))], OP)

    # -- deletion leaves nothing behind ---------------------------------------------------------

    def _world(self, store: Store, clock: FakeClock) -> str:
        """Memory of t1 in every tier (written by run r1, and by an operator),
        some of it offloaded, plus t2's; returns the offloaded ref."""
        store.create_run(new_run("r1", tenant="t1", thread_id="th"))
        c = claim(store, "r1")
        ref = store.put_artifact(BIG)
        big = Payload(ref=ref)
        store.append_memory("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)], [
            ItemPut(NS, "big", big, None, "idx", None), RunPut("big", big), RunPut("small", _v("s")),
            ThreadAppend("th", (big, _v("m")), None), _put("k", "v", ns=OTHER, index="i")],
            Provenance("r1", 0, "op-0"))
        finish(store, clock, dataclasses.replace(c, next_seq=c.next_seq + 1))
        store.write_memory("t1", [_put("op", "by operator")], OP)
        store.write_memory("t2", [_put("k", "t2's", index="i"), ThreadAppend("th", (_v("t2"),), None)], OP)
        return ref

    def _collected(self, store: Store, clock: FakeClock, ref: str) -> bool:
        clock.advance(ARTIFACT_GRACE_SECONDS + 10)
        store.prune_runs(clock() - ARTIFACT_GRACE_SECONDS - 5, [RunStatus.CANCELLED])  # collects only
        try:
            store.get_artifact(ref)
        except PayloadError:
            return True
        return False

    def test_deleting_a_tenant_leaves_nothing_of_it(self, store: Store, clock: FakeClock) -> None:
        ref = self._world(store, clock)
        assert store.delete_memory(MemoryScope("t1")) == 7  # 2 run keys, 2 messages, 3 items
        assert store.memory_items("t1") == []
        assert store.thread_messages("t1", "th") == []
        assert store.memory_threads("t1") == []
        assert store.run_memory("r1") == []
        assert [o[0] for o in _outbox(store)] == ["t2"]
        assert _keys(store, "t2") == [(NS, "k")]
        assert [m.value for m in store.thread_messages("t2", "th")] == [_v("t2")]
        assert self._collected(store, clock, ref)

    def test_deleting_a_namespace_prefix_leaves_other_namespaces(
        self, store: Store, clock: FakeClock
    ) -> None:
        self._world(store, clock)
        assert store.delete_memory(MemoryScope("t1", encode_prefix(("users", "u1")))) == 2
        assert _keys(store) == [(OTHER, "k")]
        assert sorted((o[0], o[2]) for o in _outbox(store)) == [("t1", "k"), ("t2", "k")]

    def test_deleting_a_thread_and_an_item(self, store: Store, clock: FakeClock) -> None:
        self._world(store, clock)
        assert store.delete_memory(MemoryScope("t1", thread_id="th")) == 2
        assert store.thread_messages("t1", "th") == []
        assert store.memory_threads("t1") == []
        assert len(store.thread_messages("t2", "th")) == 1
        assert store.delete_memory(MemoryScope("t1", NS, "big")) == 1
        assert store.delete_memory(MemoryScope("t1", NS, "big")) == 0
        assert sorted((o[0], o[2]) for o in _outbox(store)) == [("t1", "k"), ("t2", "k")]

    def test_deleting_by_run_removes_what_the_run_wrote(self, store: Store, clock: FakeClock) -> None:
        ref = self._world(store, clock)
        assert store.delete_memory(MemoryScope("t1", run_id="r1")) == 6
        assert store.run_memory("r1") == []
        assert _keys(store) == [(NS, "op")]  # the operator's item stays
        assert store.thread_messages("t1", "th") == []
        assert [o[0] for o in _outbox(store)] == ["t2"]
        assert self._collected(store, clock, ref)

    def test_pruning_a_run_deletes_its_run_memory_and_its_values(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.create_run(new_run("r1", tenant="t1"))
        c = claim(store, "r1")
        ref = store.put_artifact(BIG)
        store.append_memory("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)],
                            [RunPut("big", Payload(ref=ref)), _put("kept", "v")], Provenance("r1", 0, "op"))
        finish(store, clock, dataclasses.replace(c, next_seq=c.next_seq + 1))
        clock.advance(ARTIFACT_GRACE_SECONDS + 10)
        assert store.prune_runs(clock() - 1) == 1
        assert store.run_memory("r1") == []
        assert _keys(store) == [(NS, "kept")]  # long-term memory outlives its run
        with pytest.raises(PayloadError):
            store.get_artifact(ref)

    def test_an_offloaded_value_in_use_is_never_collected(self, store: Store, clock: FakeClock) -> None:
        ref = store.put_artifact(BIG)
        store.write_memory("t1", [ItemPut(NS, "big", Payload(ref=ref), None, None, None)], OP)
        clock.advance(ARTIFACT_GRACE_SECONDS + 10)
        store.prune_runs(clock())
        assert store.get_artifact(ref) == BIG
        store.write_memory("t1", [_put("big", "small now")], OP)  # replaced: queued, then collected
        assert self._collected(store, clock, ref)

    def test_a_scope_must_say_what_it_deletes(self, store: Store) -> None:
        with pytest.raises(InvalidArgument, match="tenant"):
            store.delete_memory(MemoryScope(None))
        with pytest.raises(InvalidArgument, match="one of"):
            store.delete_memory(MemoryScope("t1", NS, thread_id="th"))
        with pytest.raises(InvalidArgument, match="namespace"):
            store.delete_memory(MemoryScope("t1", key="k"))

    def test_delete_write_and_entry_type(self, store: Store, clock: FakeClock) -> None:
        store.write_memory("t1", [_put("k", "v"), ItemDelete(NS, "k")], OP)
        assert store.memory_items("t1") == []
        assert EventType.STEP_COMPLETED.value == "step.completed"
