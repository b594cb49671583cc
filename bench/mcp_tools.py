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
samples (each iteration times the three in turn).
"""

from __future__ import annotations

import argparse
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

        direct, journal, cairn_mcp = [], [], []
        for r in range(args.rounds):
            d_, j_, c_ = app.run(paired, args.calls, run_id=f"paired{r}")
            direct.append(statistics.median(d_))
            journal.append(statistics.median(j_))
            cairn_mcp.append(statistics.median(c_))
        server.close()
        app.close()
    d, j, c = statistics.median(direct), statistics.median(journal), statistics.median(cairn_mcp)
    print(f"{args.calls} calls a round, median of {args.rounds} rounds, per call:")
    print(f"direct call_tool on an open session:   {d:8.1f} us")
    print(f"journal (local read tool, same path):  {j:8.1f} us")
    print(f"server.call through Cairn:             {c:8.1f} us")
    print(f"overhead beyond the journal's write:   {c - d - j:8.1f} us  (budget 1000 us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
