"""What calling an MCP tool through Cairn costs over calling it directly.

    python -m bench.mcp_tools                 # 300 calls a round, median of 5 rounds
    python -m bench.mcp_tools --calls 1000 --rounds 7

Issue 28's budget: MCP tool call overhead over a direct call to the same
server is at most 1 ms plus the journal's write. Three figures per call, on
one stdio server (tests/mcptools/mcp_server.py, the SDK's FastMCP) and SQLite:

* **direct**: ``session.call_tool("lookup")`` on an open session (Cairn's
  ``Connection``, which is the SDK's ``ClientSession`` on its own loop);
* **journal**: a local ``read`` tool taking the ``Operation`` (the same
  ledger path an MCP tool takes, called inline) returning the same result in
  a workflow: the journal's write. It has no ``timeout``: a sync tool with
  one runs on a thread of its own per call, which the MCP path does not take
  (its session bounds the wait), so counting that thread here would hide
  part of Cairn's overhead rather than measure the journal;
* **through Cairn**: ``server.call("lookup", ...)`` in a workflow (the list
  journaled once before the timed loop).

overhead = through Cairn - direct - journal, from per-call medians, and the
median of paired differences (each iteration times the three in turn, so the
machine's drifting load falls alike on all three). Each is measured twice:
wall-clock, and CPU time of this process (all its threads: the workflow's and
the session's loop): a stdio round trip's wall time follows the load of a
shared machine by milliseconds, while the overhead under test is CPU spent
here (the server's own time is the same for the direct call). The load
average is printed with the figures. The same three again in an async
workflow: ``await connection.acall_tool``, an async local tool, and
``await server.acall`` (no thread per call, the loop never blocked).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cairn
from cairn.mcp import Egress, MCPServer

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "mcptools" / "mcp_server.py"

#: per iteration: wall and CPU time of direct, journal, through Cairn (us)
Samples = list[list[float]]


def _sample(samples: Samples, marks: list[tuple[float, float]]) -> None:
    """Append one iteration's three (wall, CPU) durations from its four marks."""
    for i in range(3):
        (w0, c0), (w1, c1) = marks[i], marks[i + 1]
        samples[i].append((w1 - w0) * 1e6)
        samples[3 + i].append((c1 - c0) * 1e6)


def _mark() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "world"
        server = MCPServer("b", command=[sys.executable, str(SCRIPT), "stdio"],
                           egress=Egress(commands=[sys.executable]),
                           env={"MCP_STATE": str(state), "PATH": os.environ.get("PATH", "")})
        app = cairn.App(db=f"sqlite:///{tmp}/bench.db")

        def answer(key: str) -> dict[str, object]:
            """What the MCP tool's call returns through Cairn: the same size journaled."""
            text = f"value of {key}"
            return {"text": text, "content": [], "structured": {"result": text}}

        @app.tool(effect="read")
        def local(op: cairn.Operation, key: str) -> dict[str, object]:
            return answer(key)

        @app.workflow(name="paired")
        def paired(ctx: cairn.Context, n: int) -> Samples:
            server.tools()
            connection = server._session()
            server.call("lookup", {"key": "warm"})
            samples: Samples = [[] for _ in range(6)]
            for i in range(n):
                m0 = _mark()
                connection.call_tool("lookup", {"key": f"k{i}"}, 30)
                m1 = _mark()
                local(f"k{i}")
                m2 = _mark()
                server.call("lookup", {"key": f"k{i}"})
                _sample(samples, [m0, m1, m2, _mark()])
            return samples

        @app.tool(effect="read")
        async def alocal(op: cairn.Operation, key: str) -> dict[str, object]:
            return answer(key)

        @app.workflow(name="apaired")
        async def apaired(ctx: cairn.Context, n: int) -> Samples:
            server.tools()
            connection = server._session()
            await server.acall("lookup", {"key": "warm"})
            samples: Samples = [[] for _ in range(6)]
            for i in range(n):
                m0 = _mark()
                await connection.acall_tool("lookup", {"key": f"k{i}"}, 30)
                m1 = _mark()
                await alocal(f"k{i}")
                m2 = _mark()
                await server.acall("lookup", {"key": f"k{i}"})
                _sample(samples, [m0, m1, m2, _mark()])
            await asyncio.sleep(0)
            return samples

        print(f"{args.calls} calls a round, median of {args.rounds} rounds, per call (us):")
        for label, workflow in (("sync workflow, server.call", paired),
                                ("async workflow, await server.acall", apaired)):
            rounds = [app.run(workflow, args.calls, run_id=f"{workflow.definition.name}{r}")
                      for r in range(args.rounds)]
            print(f"-- {label}")
            print(f"{'':40}{'wall':>9}{'CPU':>9}")
            _report(rounds)
        server.close()
        app.close()
    load_after = os.getloadavg()
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, "
          f"on {os.cpu_count()} cores")
    return 0


def _report(rounds: list[Samples]) -> None:
    def median_of_rounds(pick: Callable[[Samples], list[float]]) -> float:
        return statistics.median(statistics.median(pick(r)) for r in rounds)

    rows: list[tuple[str, float, float]] = []
    for name, i in (("direct call on an open session", 0), ("journal (local read tool, same path)", 1),
                    ("through Cairn", 2)):
        rows.append((name, median_of_rounds(lambda r, i=i: r[i]), median_of_rounds(lambda r, i=i: r[3 + i])))
    for name, wall, cpu in rows:
        print(f"{name + ':':40}{wall:9.1f}{cpu:9.1f}")
    over_wall = rows[2][1] - rows[0][1] - rows[1][1]
    over_cpu = rows[2][2] - rows[0][2] - rows[1][2]
    print(f"{'overhead beyond the journal (budget 1000):':40}{over_wall:9.1f}{over_cpu:9.1f}")

    def paired(r: Samples, base: int) -> list[float]:
        return [c - d - j for d, j, c in zip(r[base], r[base + 1], r[base + 2], strict=True)]

    print(f"{'  median of paired differences:':40}{median_of_rounds(lambda r: paired(r, 0)):9.1f}"
          f"{median_of_rounds(lambda r: paired(r, 3)):9.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
