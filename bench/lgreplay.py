"""CairnSaver's own work a super-step, without LangGraph's loop around it:
``python -m bench.lgreplay``.

    python -m bench.lgreplay record /tmp/calls.pickle --steps 300
    python -m bench.lgreplay replay /tmp/calls.pickle --windows 20:40,260:280 --repeat 5
    valgrind --tool=callgrind python -m bench.lgreplay replay /tmp/calls.pickle --upto 300   # and --upto 0

``record`` runs ``bench.graph``'s LangGraph graph (the one ``bench.langgraph_saver``
times) and keeps every ``put`` and ``put_writes`` LangGraph hands the saver,
in the order they begin (``--durability``: ``sync``, each checkpoint's put
before its writes; ``async``, LangGraph's default and the bench's, its writes
nearly always first: see ``record``), pickled in one piece so the objects shared between calls (a
message in a pending write and in the next checkpoint's list) stay shared,
as the saver's caches rely on identity. ``replay`` makes those calls in
order on a ``CairnSaver`` over a fresh SQLite file, in one thread:

* ``--windows a:b,...``: the process CPU time of the calls of super-steps
  ``a`` to ``b`` (a super-step: a ``put_writes`` and the calls up to the next one),
  µs a super-step, the median of ``--repeat`` replays on fresh files. A
  window late in the thread costing more than an early one is work that
  grows with the thread's length.
* ``--upto K``: replay the first ``K`` super-steps and nothing else (no
  timing): under callgrind, (instructions at K) - (instructions at 0), over
  K, is the saver's instructions a super-step, start-up and loading cancelling out.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.graph import langgraph_builder

#: one call the saver was handed: (method name, its positional arguments)
Call = tuple[str, tuple[Any, ...]]


def record(steps: int, durability: str) -> list[Call]:
    """The calls LangGraph makes of a saver running the bench graph ``steps``
    super-steps, in the order they begin. ``"sync"``: with a saver that stores
    nothing (each put before the writes that follow it); ``"async"``: with a
    SQLite CairnSaver (LangGraph's default, the bench's: a super-step's writes
    nearly always begin before its checkpoint's put, which waits for the put before it)."""
    from bench.langgraph_saver import noop_saver
    from cairn.langgraph import CairnSaver

    scratch = tempfile.TemporaryDirectory()
    saver = noop_saver() if durability == "sync" else CairnSaver(f"sqlite:///{scratch.name}/r.sqlite",
                                                                 tenant="bench")
    calls: list[Call] = []
    put, put_writes = saver.put, saver.put_writes

    def plain(config: Any) -> Any:  # what a saver reads of a config (the rest does not pickle)
        return {k: {n: v for n, v in config[k].items() if not n.startswith("__")}
                for k in ("configurable", "metadata") if k in config}

    def keep_put(config: Any, *args: Any) -> Any:
        calls.append(("put", (plain(config), *args)))
        return put(config, *args)

    def keep_writes(config: Any, *args: Any) -> Any:
        calls.append(("put_writes", (plain(config), *args)))
        return put_writes(config, *args)

    saver.put, saver.put_writes = keep_put, keep_writes  # type: ignore[method-assign]
    graph = langgraph_builder(steps, {}).compile(checkpointer=saver)
    graph.invoke({"messages": [], "n": 0}, {"configurable": {"thread_id": "chat"},
                                            "recursion_limit": steps + 10}, durability=durability)
    scratch.cleanup()
    return calls


def steps_of(calls: Sequence[Call]) -> list[int]:
    """The index in ``calls`` where each super-step starts (its ``put_writes``)."""
    return [i for i, (name, _) in enumerate(calls) if name == "put_writes"]


def replay(calls: Sequence[Call], windows: Sequence[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """Replay ``calls`` on a fresh SQLite CairnSaver; CPU µs a super-step in each window."""
    from cairn.langgraph import CairnSaver

    starts = steps_of(calls)
    bounds = {}
    for a, b in windows:
        bounds[(a, b)] = (starts[a], starts[b] if b < len(starts) else len(calls))
    spent = dict.fromkeys(bounds, 0.0)
    with tempfile.TemporaryDirectory() as d:
        saver = CairnSaver(f"sqlite:///{d}/replay.sqlite", tenant="bench")
        try:
            for i, (name, args) in enumerate(calls):
                at = time.process_time()
                getattr(saver, name)(*args)
                took = time.process_time() - at
                for w, (lo, hi) in bounds.items():
                    if lo <= i < hi:
                        spent[w] += took
        finally:
            saver.close()
    return {w: spent[w] / (w[1] - w[0]) * 1e6 for w in spent}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("record", "replay"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--durability", choices=("sync", "async"), default="sync")
    parser.add_argument("--windows", default="")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--upto", type=int, default=None)
    args = parser.parse_args(argv)
    if args.mode == "record":
        args.path.write_bytes(pickle.dumps(record(args.steps, args.durability)))
        return 0
    calls: list[Call] = pickle.loads(args.path.read_bytes())  # a file this tool wrote
    gc.collect()
    gc.freeze()
    gc.disable()
    if args.upto is not None:
        starts = steps_of(calls)
        end = starts[args.upto] if args.upto < len(starts) else len(calls)
        # the first put (before any write) is replayed either way: the saver's set-up cancels out
        replay(calls[:max(end, 1)], [])
        return 0
    windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",") if w]
    runs = [replay(calls, windows) for _ in range(args.repeat)]  # type: ignore[arg-type]
    for w in windows:
        got = [r[w] for r in runs]  # type: ignore[index]
        print(f"super-steps {w[0]}-{w[1]}: CPU µs a super-step, median {statistics.median(got):,.0f} "
              f"of {', '.join(f'{x:,.0f}' for x in got)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
