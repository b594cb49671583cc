"""A tiering pass in its own process, for the crash test: ``python -m tests.memory.tier_main URL IDLE``.

It runs ``Store.tier_items(IDLE)`` and prints what it moved; with
``$CAIRN_FAULTS=memory.tier_items.mid_move@N`` it SIGKILLs itself in the
middle of the N-th item's move (its hot value cleared, its cold copy not yet
written), with the pass's transaction open.
"""

from __future__ import annotations

import sys

from cairn.store import open_store


def main() -> None:
    store = open_store(sys.argv[1])
    moved = store.tier_items(float(sys.argv[2]))
    print(f"cooled {moved.cooled}", flush=True)
    store.close()


if __name__ == "__main__":
    main()
