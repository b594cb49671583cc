"""Bytes per long-term item, hot vs cold, on a realistic workload (issue 14).

    python -m bench.memory_tiers            # 5,000 items
    python -m bench.memory_tiers --quick    # 1,000 items

A user-profile memory of the kind an agent keeps: per user, a profile
document, preferences, and notes summarizing past conversations (JSON of
0.2 to 3 kB, with repeated field names and phrases, as such values have),
with metadata. The same items are written into two fresh SQLite stores;
one then runs a tiering pass (``Store.tier_items``) that moves every value
cold. Printed per store: value bytes per item as ``cairn memory tiers``
reports them, and the database file's size per item after ``VACUUM``
(what the items really cost on disk: rows, indexes, the cold table), with
the cold/hot ratios. A read-through check decodes every cold item and
compares it with what was written.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from cairn.store.memrecords import ItemPut, Provenance
from cairn.store.namespaces import encode_namespace
from cairn.store.records import Payload
from cairn.store.sqlite import SQLiteStore

TOPICS = ["billing", "travel plans", "a job search", "learning Spanish", "a home renovation", "fitness",
          "a research paper", "tax filing", "a product launch", "gardening"]
PHRASES = ["The user asked about", "They prefer", "Follow up on", "They mentioned", "Remember that",
           "They were frustrated by", "Next time suggest", "They agreed to"]


def _values(n: int, rng: random.Random) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """``(namespace, key, value, metadata)`` of ``n`` items."""
    out = []
    for i in range(n):
        user = f"u{i // 10}"
        kind = ("profile", "preferences", "note", "note", "note")[i % 5]
        if kind == "profile":
            value: dict[str, Any] = {"name": f"User {user}",
                                     "locale": rng.choice(["en-GB", "fr-FR", "de-DE"]),
                                     "timezone": rng.choice(["Europe/London", "Europe/Paris"]),
                                     "plan": rng.choice(["free", "pro", "team"]),
                                     "signed_up": 1_700_000_000 + rng.randrange(10**7)}
        elif kind == "preferences":
            value = {"answers": rng.choice(["short", "detailed"]), "tone": rng.choice(["formal", "casual"]),
                     "dark_mode": rng.random() < 0.5, "languages": rng.sample(["en", "fr", "de", "es"], 2),
                     "notify": {"email": True, "push": rng.random() < 0.3}}
        else:
            topic = rng.choice(TOPICS)
            sentences = [f"{rng.choice(PHRASES)} {topic} ({rng.randrange(1000)})."
                         for _ in range(rng.randrange(4, 40))]
            value = {"topic": topic, "summary": " ".join(sentences), "turns": rng.randrange(2, 60),
                     "conversation": f"c-{rng.getrandbits(48):012x}",
                     "sentiment": rng.choice(["+", "0", "-"])}
        meta = {"kind": kind, "user": user}
        out.append((encode_namespace(("users", user, kind)), f"{kind}-{i}", value, meta))
    return out


def _store(path: Path, items: list[tuple[str, str, dict[str, Any], dict[str, Any]]]) -> SQLiteStore:
    store = SQLiteStore(path)
    who = Provenance(actor="bench")
    for start in range(0, len(items), 500):
        store.write_memory("acme", [ItemPut(ns, key, Payload(data=json.dumps(value).encode()), meta)
                                    for ns, key, value, meta in items[start:start + 500]], who)
    return store


def _file_bytes(store: SQLiteStore) -> int:
    """The database's size once compacted (its own connection: VACUUM needs no open statement)."""
    path = str(store.path)
    store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return Path(path).stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 1000 if args.quick else 5000
    items = _values(n, random.Random(14))
    with tempfile.TemporaryDirectory(prefix="cairn-bench-tiers-") as tmp:
        hot, cold = _store(Path(tmp) / "hot.db", items), _store(Path(tmp) / "cold.db", items)
        empty = SQLiteStore(Path(tmp) / "empty.db")  # the schema alone, subtracted from both files
        started = time.perf_counter()
        moved = cold.tier_items(1e-9, limit=n)
        pass_ms = (time.perf_counter() - started) * 1e3
        assert moved.cooled == n, moved
        started = time.perf_counter()
        back = {(i.namespace, i.key): i.value.data for i in cold.memory_items("acme", limit=n)}
        read_ms = (time.perf_counter() - started) * 1e3
        assert all(back[(ns, key)] == json.dumps(value).encode() for ns, key, value, _ in items)
        [hot_usage] = hot.item_tiers()
        [cold_usage] = cold.item_tiers()
        base = _file_bytes(empty)
        hot_file, cold_file = _file_bytes(hot) - base, _file_bytes(cold) - base
    print(f"{n} items, values {hot_usage.raw_bytes / n:.0f} B each on average "
          f"(tiering pass {pass_ms:.0f} ms; listing all cold {read_ms:.0f} ms)")
    print(f"{'':<22} {'hot':>9} {'cold':>9} {'cold/hot':>9}")
    print(f"{'value bytes / item':<22} {hot_usage.bytes / n:>9.0f} {cold_usage.bytes / n:>9.0f} "
          f"{cold_usage.bytes / hot_usage.bytes:>8.2f}x")
    print(f"{'file bytes / item':<22} {hot_file / n:>9.0f} {cold_file / n:>9.0f} "
          f"{cold_file / hot_file:>8.2f}x")


if __name__ == "__main__":
    main()
