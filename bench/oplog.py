"""What the operator log costs (issue 26): an operator mutation recorded
against the same mutation unrecorded, on SQLite, and the log's verification
speed.

    python -m bench.oplog [--rounds 9] [--actions 200]

The mutation is a queue-limit change (``Store.set_queue``: one upsert and a
bucket sweep in one write transaction), the cheapest operator mutation, so
the ratio is the log's worst case. "Recorded" runs it inside
``acting(...)``: the record's canonical JSON, its digest and link, the head
read and the insert, in the same transaction. Rounds alternate recorded /
unrecorded so drift hits both alike; medians of CPU time per action
(``time.process_time``: the machine is shared). Journaled steps do not go
through this code at all (no change to the step path), so nothing is
measured there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from cairn.api.actors import acting
from cairn.store import oplog
from cairn.store.admission import QueueLimits
from cairn.store.auditverify import Chains
from cairn.store.sqlite import SQLiteStore


def one_round(store: SQLiteStore, actions: int, recorded: bool, offset: int) -> float:
    start = time.process_time()
    for i in range(actions):
        limits = QueueLimits(f"q{i % 20}", concurrency=1 + (offset + i) % 7)
        if recorded:
            change = {"c": limits.concurrency}
            with acting(store, "cli:bench@host", "", "queue", limits.name, "queue.set", change):
                store.set_queue(limits)
        else:
            store.set_queue(limits)
    return (time.process_time() - start) / actions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--actions", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        store = SQLiteStore(os.path.join(where, "c.db"))
        store.migrate()
        on, off = [], []
        for r in range(args.rounds):
            on.append(one_round(store, args.actions, True, r))
            off.append(one_round(store, args.actions, False, r))
        rows = list(store.operator_log())
        start = time.process_time()
        chains = Chains()
        count = oplog.verify_into(chains, store)
        verify = time.process_time() - start
        assert count == len(rows)
        assert not chains.problems
        store.close()
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"queue.set unrecorded: {m_off * 1e6:.0f} us CPU; recorded: {m_on * 1e6:.0f} us CPU "
          f"(+{(m_on - m_off) * 1e6:.0f} us, {m_on / m_off:.2f}x)")
    print(f"verify: {count} records in {verify * 1e3:.0f} ms CPU ({count / verify:,.0f} records/s, "
          f"read from the database included)")


if __name__ == "__main__":
    main()
