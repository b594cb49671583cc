"""What calling an MCP tool through Cairn costs over calling it directly.

    python -m bench.mcp_tools                 # 300 calls a round, median of 5 rounds
    python -m bench.mcp_tools --calls 1000 --rounds 7

Issue 28's budget: MCP tool call overhead over a direct call to the same
server is at most 1 ms plus the journal's write. Three figures per call, on
one stdio server (tests/mcptools/mcp_server.py, the SDK's FastMCP) and SQLite:

* **direct**: ``session.call_tool("lookup")`` on an open session (Cairn's
  ``Connection``, which is the SDK's ``ClientSession`` on its own loop);
* **journal**: a local ``read`` tool with a timeout (the same ledger path an
  MCP tool takes) returning the same text in a workflow: the journal's write;
* **through Cairn**: ``server.call("lookup", ...)`` in a workflow (the list
  journaled once before the timed loop).

overhead = through Cairn - direct - journal, from per-call medians of paired
samples (each iteration times the three in turn). The same three again in an
async workflow: ``await connection.acall_tool``, an async local tool, and
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
from pathlib import Path

import cairn
from cairn.mcp import Egress, MCPServer

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "mcptools" / "mcp_server.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "world"
        server = MCPServer("b", command=[sys.executable, str(SCRIPT), "stdio"],
                           egress=Egress(commands=[sys.executable]),
                           env={"MCP_STATE": str(state), "PATH": os.environ.get("PATH", "")})
        app = cairn.App(db=f"sqlite:///{tmp}/bench.db")

        @app.tool(effect="read", timeout=30)
        def local(key: str) -> dict[str, object]:
            return {"content": [{"type": "text", "text": f"value of {key}"}], "structured": None,
                    "text": f"value of {key}"}

        @app.workflow(name="paired")
        def paired(ctx: cairn.Context, n: int) -> list[list[float]]:
            """Each iteration times the three side by side (paired samples:
            the machine's load drifts alike for all three)."""
            server.tools()
            connection = server._session()
            samples: list[list[float]] = [[], [], []]
            for i in range(n):
                t0 = time.perf_counter()
                connection.call_tool("lookup", {"key": f"k{i}"}, 30)
                t1 = time.perf_counter()
                local(f"k{i}")
                t2 = time.perf_counter()
                server.call("lookup", {"key": f"k{i}"})
                t3 = time.perf_counter()
                for column, value in zip(samples, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                    column.append(value * 1e6)
            return samples

        @app.tool(effect="read", timeout=30)
        async def alocal(key: str) -> dict[str, object]:
            return {"content": [{"type": "text", "text": f"value of {key}"}], "structured": None,
                    "text": f"value of {key}"}

        @app.workflow(name="apaired")
        async def apaired(ctx: cairn.Context, n: int) -> list[list[float]]:
            server.tools()
            connection = server._session()
            await server.acall("lookup", {"key": "warm"})
            samples: list[list[float]] = [[], [], []]
            for i in range(n):
                t0 = time.perf_counter()
                await connection.acall_tool("lookup", {"key": f"k{i}"}, 30)
                t1 = time.perf_counter()
                await alocal(f"k{i}")
                t2 = time.perf_counter()
                await server.acall("lookup", {"key": f"k{i}"})
                t3 = time.perf_counter()
                for column, value in zip(samples, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                    column.append(value * 1e6)
            await asyncio.sleep(0)
            return samples

        print(f"{args.calls} calls a round, median of {args.rounds} rounds, per call:")
        for label, workflow in (("sync workflow, server.call", paired),
                                ("async workflow, await server.acall", apaired)):
            direct, journal, cairn_mcp, paired_over = [], [], [], []
            for r in range(args.rounds):
                d_, j_, c_ = app.run(workflow, args.calls, run_id=f"{workflow.definition.name}{r}")
                direct.append(statistics.median(d_))
                journal.append(statistics.median(j_))
                cairn_mcp.append(statistics.median(c_))
                # the same iteration's three: the load's drift cancels out
                paired_over.append(statistics.median(c - d - j for d, j, c in zip(d_, j_, c_, strict=True)))
            d, j, c = statistics.median(direct), statistics.median(journal), statistics.median(cairn_mcp)
            print(f"-- {label}")
            print(f"direct call on an open session:        {d:8.1f} us")
            print(f"journal (local read tool, same path):  {j:8.1f} us")
            print(f"through Cairn:                         {c:8.1f} us")
            print(f"overhead beyond the journal's write:   {c - d - j:8.1f} us  (budget 1000 us)")
            print(f"  the same, median of paired differences: {statistics.median(paired_over):8.1f} us")
        server.close()
        app.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
