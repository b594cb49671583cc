"""An embedding worker process for the crash tests: ``python -m tests.memory.indexer_main URL ID``.

It prints ``ready`` once its store is open, then drains the outbox until it
is killed (by a test, or by a ``$CAIRN_FAULTS`` point). With ``--once`` it
claims one batch, prints ``claimed N``, waits for the file named by
``--go`` to exist, stores, and prints ``stored N`` (the frozen-worker test).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from cairn.memory.embedders import HashEmbedder
from cairn.memory.indexer import Indexer
from cairn.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("worker_id")
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--go")
    args = parser.parse_args()
    store = open_store(args.url)
    embedder = HashEmbedder(64)
    indexer = Indexer(store, embedder, worker_id=args.worker_id, batch=args.batch, lease_seconds=args.lease,
                      poll_interval=0.01)
    print("ready", flush=True)
    if not args.once:
        indexer.run()
        return
    claim = store.claim_embeddings(args.worker_id, args.batch, args.lease)
    print(f"claimed {len(claim.tasks)}", flush=True)
    vectors = embedder.embed([task.text for task in claim.tasks])
    while not Path(args.go).exists():
        time.sleep(0.01)
    stored = store.store_embeddings(claim.token, embedder.name, embedder.dims,
                                    list(zip(claim.tasks, vectors, strict=True)))
    print(f"stored {stored}", flush=True)


if __name__ == "__main__":
    main()
