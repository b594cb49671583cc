"""What a per-thread compression dictionary saves of a LangGraph thread's
value rows, and what it costs a value, by the dictionary's size: the
measurement behind ``cairn.lgdictionary`` (issue 24's PostgreSQL bytes on
disk), which CairnSaver uses at the largest size here (31,000 bytes).

    python -m bench.value_dictionary                 # 300 messages, 9 rounds
    python -m bench.value_dictionary --messages 300 --rounds 9
    python -m bench.value_dictionary --chat          # each a LangChain HumanMessage

A CairnSaver stores each message of a list once, as a value row: its
LangGraph serialization (msgpack), raw DEFLATE primed with Cairn's static
dictionary (``cairn.langgraph.ZDICT_1``, ``packed``). That static dictionary
holds the message envelope, not the words: the bench graph's 1 KB messages
(``bench.graph.message``: words drawn from 3,000 made-up ones, about as
compressible as prose) take ~636 bytes each. A dictionary made of the
thread's own first messages also holds its words. For each size of such a
dictionary (the first messages' serialized bytes, up to that many, after
``ZDICT_1``), this prints:

* **bytes a message**: the mean stored length of the messages after the
  ones the dictionary is made of, against ``ZDICT_1`` alone (``packed``);
* **the dictionary's own bytes**: the first messages as they are stored
  anyway (a dictionary that names them costs their digests, not a copy) and,
  for a dictionary stored apart, compressed;
* **µs a message**: the thread's CPU time to compress each message with the
  dictionary (``cairn.security.envelope.deflate_raw``, which copies a
  compressor primed once) and with ``ZDICT_1``, the two alternated round
  after round (medians), and to inflate one.

Everything runs in one process on one thread; no database.
"""

from __future__ import annotations

import argparse
import statistics
import time
import zlib
from collections.abc import Callable, Sequence

from bench.common import environment
from bench.graph import message

#: dictionary sizes measured: bytes of the thread's first serialized messages
SIZES = (4096, 8192, 16384, 31000)
#: the longest a DEFLATE dictionary can be (the window: 32 KB, less the message it primes)
WINDOW = 32768


def serialized(count: int, chat: bool) -> list[bytes]:
    """The bench graph's first ``count`` messages as LangGraph serializes
    them: strings, as the graph appends them, or (``chat``) each the content
    of a LangChain ``HumanMessage``, as a chat agent's list holds them."""
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()
    return [serde.dumps_typed(HumanMessage(content=message(n), id=f"m{n}") if chat else message(n))[1]
            for n in range(count)]


def cpu_us(work: Callable[[], object], items: int) -> float:
    """The thread's CPU µs an item of ``work``."""
    at = time.thread_time()
    work()
    return (time.thread_time() - at) / items * 1e6


def row(messages: list[bytes], static: list[int], size: int, level: int, rounds: int) -> str | None:
    """The table's line for a dictionary of the first ``size`` serialized bytes."""
    from cairn.langgraph import ZDICT_1
    from cairn.security.envelope import deflate_raw

    source = b"".join(messages)[:min(size, WINDOW - 1024 - len(ZDICT_1))]
    first = next(i for i in range(len(messages) + 1) if sum(map(len, messages[:i])) >= len(source))
    zdict = ZDICT_1 + source
    rest = messages[first:]
    if not rest:
        return None
    packed = [deflate_raw(m, level, zdict) for m in rest]
    mean = statistics.mean(map(len, packed))

    def with_dict() -> object:
        return [deflate_raw(m, level, zdict) for m in rest]

    def alone() -> object:
        return [deflate_raw(m, level, ZDICT_1) for m in rest]

    def inflate() -> object:
        return [zlib.decompressobj(-15, zdict=zdict).decompress(p) for p in packed]

    spent: dict[str, list[float]] = {"dict": [], "alone": [], "inflate": []}
    for r in range(rounds):  # alternated, so the machine's drift falls on both
        for name, work in (("dict", with_dict), ("alone", alone))[:: 1 if r % 2 == 0 else -1]:
            spent[name].append(cpu_us(work, len(rest)))
        spent["inflate"].append(cpu_us(inflate, len(rest)))
    us = {k: statistics.median(v) for k, v in spent.items()}
    return (f"{len(source):>10,} {first:>6} {mean:>10,.0f} {mean / statistics.mean(static[first:]):>10.2f}x "
            f"{sum(static[:first]):>9,} {len(deflate_raw(source, 6, ZDICT_1)):>7,} {us['dict']:>8.1f} "
            f"{us['alone']:>10.1f} {us['inflate']:>10.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    from cairn.langgraph import ZDICT_1
    from cairn.security.envelope import deflate_raw

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--level", type=int, default=1, help="DEFLATE level (packed's default: 1)")
    parser.add_argument("--chat", action="store_true", help="HumanMessage objects, not the graph's strings")
    args = parser.parse_args(argv)
    print(environment())
    messages = serialized(args.messages, args.chat)
    static = [len(deflate_raw(m, args.level, ZDICT_1)) for m in messages]
    print(f"{len(messages)} messages, {statistics.mean(map(len, messages)):,.0f} bytes serialized, "
          f"{statistics.mean(static):,.0f} stored with ZDICT_1 alone (level {args.level})")
    print(f"{'dictionary':>10} {'after':>6} {'bytes/msg':>10} {'vs ZDICT_1':>11} {'its rows':>9} "
          f"{'apart':>7} {'µs dict':>8} {'µs ZDICT_1':>10} {'µs inflate':>10}")
    for size in SIZES:
        line = row(messages, static, size, args.level, args.rounds)
        if line is not None:
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
