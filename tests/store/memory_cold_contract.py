"""Store contract: the cold tier of long-term item values (issue 14), for every backend.

``tier_items`` moves the values of items nobody touched for a while out of
their hot rows, compressed; every read gives the same value back
(read-through); a put or a touched item comes back hot; every deletion and
the TTL sweep leave no cold copy behind; tenants never see each other's.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from cairn.errors import InvalidArgument, PayloadError
from cairn.store.contract import Store
from cairn.store.memrecords import ItemPut, ItemTierUsage, MemoryScope, Provenance, RunPut
from cairn.store.namespaces import encode_namespace, encode_prefix
from cairn.store.records import Payload
from tests.store.contract import FakeClock, claim, ev, finish, new_run

NS = encode_namespace(("notes", "u1"))
OTHER = encode_namespace(("notes", "u2"))
OP = Provenance(actor="cli:test")
IDLE = 100.0


def doc(n: int, tenant: str = "t1") -> Payload:
    """A realistic JSON value of a few hundred bytes (it compresses)."""
    value = {"tenant": tenant, "n": n, "title": f"note {n}", "tags": ["memory", "cold", "tier"],
             "body": "the user prefers short answers and dark mode; " * 6}
    return Payload(data=json.dumps(value).encode())


def put(key: str, value: Payload, *, ns: str = NS, ttl: float | None = None) -> ItemPut:
    return ItemPut(ns, key, value, {"kind": "note"}, f"index {key}", ttl)


def cold_copies(store: Store) -> list[tuple[object, ...]]:
    return store._select("select_all_item_cold", {})  # type: ignore[attr-defined, no-any-return]


def tiers(store: Store, tenant: str | None = None) -> dict[str, ItemTierUsage]:
    return {usage.tier: usage for usage in store.item_tiers(tenant)}


class MemoryColdContract:
    def test_cold_values_read_back_identical_from_get_and_list(self, store: Store, clock: FakeClock) -> None:
        store.write_memory("t1", [put(f"k{i}", doc(i)) for i in range(5)], OP)
        before = {i.key: i for i in store.memory_items("t1")}
        clock.advance(IDLE + 1)
        assert store.tier_items(IDLE).cooled == 5
        usage = tiers(store)
        assert set(usage) == {"cold"}
        assert usage["cold"].items == 5
        assert usage["cold"].raw_bytes == sum(len(doc(i).data or b"") for i in range(5))
        assert usage["cold"].bytes < usage["cold"].raw_bytes / 2  # JSON compresses
        assert len(cold_copies(store)) == 5
        listed = store.memory_items("t1")
        assert [i.tier for i in listed] == ["cold"] * 5
        for item in listed:
            assert dataclasses.replace(item, tier="hot") == before[item.key]
        got = store.memory_item("t1", NS, "k3")
        assert got is not None
        assert got.value == doc(3)
        assert got.tier == "cold"
        assert store.tier_items(IDLE) == type(store.tier_items(IDLE))(0, 0)  # idempotent: nothing left

    def test_only_idle_live_inline_values_worth_it_go_cold(self, store: Store, clock: FakeClock) -> None:
        ref = store.put_artifact(b'"' + b"x" * 300_000 + b'"')
        store.write_memory("t1", [put("doc", doc(1)), put("tiny", Payload(data=b"5")),
                                  ItemPut(NS, "big", Payload(ref=ref)), put("dies", doc(2), ttl=50)], OP)
        clock.advance(IDLE / 2)
        store.write_memory("t1", [put("fresh", doc(3))], OP)
        clock.advance(IDLE / 2 + 1)
        assert store.tier_items(IDLE).cooled == 1  # not tiny, offloaded, expired or recently written
        assert {i.key: i.tier for i in store.memory_items("t1")} == {
            "doc": "cold", "tiny": "hot", "big": "hot", "fresh": "hot"}

    def test_a_put_makes_a_cold_item_hot_and_drops_its_copy(self, store: Store, clock: FakeClock) -> None:
        store.write_memory("t1", [put("a", doc(1)), put("b", doc(2))], OP)
        clock.advance(IDLE + 1)
        store.tier_items(IDLE)
        store.write_memory("t1", [put("a", doc(10))], OP)
        a = store.memory_item("t1", NS, "a")
        assert a is not None
        assert (a.tier, a.value, a.version) == ("hot", doc(10), 2)
        assert [row[2] for row in cold_copies(store)] == ["b"]
        assert tiers(store)["hot"].items == 1
        assert tiers(store)["cold"].items == 1

    def test_a_touched_cold_item_comes_back_hot_at_the_next_pass(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.write_memory("t1", [put("a", doc(1), ttl=1000), put("b", doc(2), ttl=1000)], OP)
        clock.advance(IDLE + 1)
        store.tier_items(IDLE)
        assert store.memory_item("t1", NS, "a", refresh=True) is not None  # a refresh-on-read touches it
        assert store.tier_items(IDLE) == type(store.tier_items(IDLE))(0, 1)
        a = store.memory_item("t1", NS, "a")
        assert a is not None
        assert (a.tier, a.value) == ("hot", doc(1))
        assert [row[2] for row in cold_copies(store)] == ["b"]

    def test_every_deletion_leaves_no_cold_copy(self, store: Store, clock: FakeClock) -> None:
        def world() -> None:
            store.create_run(new_run("r1", tenant="t1"))
            c = claim(store, "r1")
            store.append_memory("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)],
                                [put("by-run", doc(1)), RunPut("scratch", doc(2))], Provenance("r1", 0, "op"))
            finish(store, clock, dataclasses.replace(c, next_seq=c.next_seq + 1))
            store.write_memory("t1", [put("a", doc(3)), put("b", doc(4), ns=OTHER)], OP)
            store.write_memory("t2", [put("a", doc(5, "t2"))], OP)
            clock.advance(IDLE + 1)
            assert store.tier_items(IDLE).cooled == 4

        def left() -> list[tuple[object, object, object]]:
            return [(row[0], row[1], row[2]) for row in cold_copies(store)]

        world()
        assert store.delete_memory(MemoryScope("t1", NS, "a")) == 1
        assert ("t1", NS, "a") not in left()
        assert len(left()) == 3
        assert store.delete_memory(MemoryScope("t1", run_id="r1")) == 2  # its run key and its item
        assert left() == [("t1", OTHER, "b"), ("t2", NS, "a")]
        assert store.delete_memory(MemoryScope("t1", encode_prefix(("notes",)))) == 1
        assert left() == [("t2", NS, "a")]
        store.write_memory("t1", [put("c", doc(6))], OP)
        clock.advance(IDLE + 1)
        store.tier_items(IDLE)
        assert store.delete_memory(MemoryScope("t1")) == 1  # everything of the tenant
        assert left() == [("t2", NS, "a")]
        t2 = store.memory_item("t2", NS, "a")
        assert t2 is not None
        assert t2.value == doc(5, "t2")

    def test_ttl_hides_a_cold_item_and_the_sweep_deletes_its_copy(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.write_memory("t1", [put("short", doc(1), ttl=IDLE + 10), put("long", doc(2))], OP)
        clock.advance(IDLE + 1)
        assert store.tier_items(IDLE).cooled == 2
        clock.advance(10)
        assert store.memory_item("t1", NS, "short") is None
        assert [i.key for i in store.memory_items("t1")] == ["long"]
        assert store.sweep_memory() == 1
        assert [row[2] for row in cold_copies(store)] == ["long"]

    def test_tenants_keep_their_own_cold_values(self, store: Store, clock: FakeClock) -> None:
        store.write_memory("t1", [put("same", doc(1, "t1"))], OP)
        store.write_memory("t2", [put("same", doc(1, "t2")), put("more", doc(2, "t2"))], OP)
        clock.advance(IDLE + 1)
        assert store.tier_items(IDLE).cooled == 3
        t1, t2 = store.memory_item("t1", NS, "same"), store.memory_item("t2", NS, "same")
        assert t1 is not None
        assert t1.value == doc(1, "t1")
        assert t2 is not None
        assert t2.value == doc(1, "t2")
        assert [i.value for i in store.memory_items("t1")] == [doc(1, "t1")]
        assert tiers(store, "t1")["cold"].items == 1
        assert tiers(store, "t2")["cold"].items == 2
        assert tiers(store)["cold"].items == 3
        store.delete_memory(MemoryScope("t2"))
        assert [row[0] for row in cold_copies(store)] == ["t1"]

    def test_a_damaged_cold_copy_is_a_clear_error_not_garbage(self, store: Store, clock: FakeClock) -> None:
        store.write_memory("t1", [put("a", doc(1)), put("b", doc(2))], OP)
        clock.advance(IDLE + 1)
        store.tier_items(IDLE)
        [(_, _, _, _, _, data), _] = cold_copies(store)
        damaged = bytearray(bytes(data))  # type: ignore[arg-type]
        damaged[len(damaged) // 2] ^= 0xFF
        self.damage_cold_copy(store, "a", bytes(damaged))
        with pytest.raises(PayloadError, match=r"memory item 'a'.*cold copy is damaged"):
            store.memory_item("t1", NS, "a")
        with pytest.raises(PayloadError, match="damaged"):
            store.memory_items("t1")
        b = store.memory_item("t1", NS, "b")
        assert b is not None
        assert b.value == doc(2)
        store.write_memory("t1", [put("a", doc(3))], OP)  # a put replaces the damaged copy
        a = store.memory_item("t1", NS, "a")
        assert a is not None
        assert a.value == doc(3)

    def test_idle_seconds_must_be_positive(self, store: Store) -> None:
        with pytest.raises(InvalidArgument, match="idle_seconds"):
            store.tier_items(0)

    def damage_cold_copy(self, store: Store, key: str, data: bytes) -> None:
        """Overwrite item ``key``'s cold copy behind the store's back (per backend)."""
        raise NotImplementedError
