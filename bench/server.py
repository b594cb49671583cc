"""HTTP API under load, on loopback: ``python -m bench.server [--quick]``.

Starts ``cairn serve`` (SQLite) and, as the floor, uvicorn serving a bare
Starlette JSON endpoint, each in a process of its own, and drives them from
client threads in this process (``--clients`` concurrent keep-alive
connections):

- ``GET /api/runs/{id}`` and ``POST /api/runs``: p50/p99 latency, requests/s,
  and the ratio to the bare endpoint measured in the same run (what auth,
  the token look-up, the store and the JSON of a run cost over HTTP itself);
- ``--subscribers`` SSE clients (1,000 by default, on one asyncio loop in
  this process) on one run that a worker keeps producing (``--steps``
  steps): delivery lag of every event (received - the entry's ``at``)
  p50/p99, events lost or repeated (must be 0), streams that failed, and
  the server's RSS before the subscribers, with them idle, and at peak.

Figures are this machine's (2 cores shared with the clients); only the
ratios travel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

import cairn
from cairn.store.runids import scoped_run_id

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not start: {args}")


def _load(url: str, method: str, requests: list[tuple[str, object]], headers: dict[str, str], clients: int
          ) -> tuple[list[float], float]:
    latencies: list[float] = []
    lock = threading.Lock()
    chunks = [requests[i::clients] for i in range(clients)]

    def client(mine: list[tuple[str, object]]) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            got = []
            for path, body in mine:
                started = time.perf_counter()
                response = http.request(method, path, json=body)
                got.append(time.perf_counter() - started)
                assert response.status_code < 300, response.text
            with lock:
                latencies.extend(got)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - started


async def _subscribe_all(port: int, token: str, run_id: str, count: int, connected: threading.Event
                         ) -> dict[str, Any]:
    """``count`` SSE subscribers of ``run_id`` on one event loop (threads
    with an HTTP client each would cost the measuring process more than the
    server): raw HTTP/1.0 over asyncio streams, so the body is the event
    stream itself (no chunked framing) and ends when the server closes it.
    Each records the lag of every event (received - the entry's ``at``)."""
    lags: list[float] = []
    early: list[float] = []  # the lags of each subscriber's first tenth of the events, and of its last
    late: list[float] = []
    counts: list[tuple[int, int]] = []
    failed: list[str] = []
    ready = 0
    started = time.time()
    request = (f"GET /api/runs/{run_id}/events HTTP/1.0\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n").encode()

    async def one() -> None:
        nonlocal ready
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        try:
            writer.write(request)
            await writer.drain()
            status = await reader.readline()
            if b" 200 " not in status:
                raise RuntimeError(status.decode().strip())
            while (await reader.readline()).strip():  # the headers
                pass
            ready += 1
            if ready == count:
                connected.set()
            seqs: list[int] = []
            mine: list[float] = []
            buffer = b""
            ended = False
            while not ended:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                now = time.time()
                *events, buffer = (buffer + chunk).split(b"\n\n")
                for event in events:  # parsed cheaply: the clients share the cores with the server
                    if event.startswith(b"event: end"):
                        ended = True
                        break
                    if not event.startswith(b"id: "):
                        continue  # retry: and heartbeat lines
                    seqs.append(int(event[4:event.index(b"\n")]))
                    found = _AT.search(event)
                    assert found is not None, event
                    mine.append(now - float(found.group(1)))
            lags.extend(mine)
            counts.append((len(seqs), len(set(seqs))))
            tenth = max(1, len(mine) // 10)
            early.extend(mine[:tenth])
            late.extend(mine[-tenth:])
        finally:
            writer.close()

    async def guarded() -> None:
        try:
            await one()
        except Exception as exc:  # counted, not fatal: the figure says how many streams failed
            failed.append(f"{type(exc).__name__}: {exc}")

    tasks = []
    for _ in range(count):  # connect in batches: a burst of 1,000 SYNs overflows the listen backlog
        tasks.append(asyncio.create_task(guarded()))
        if len(tasks) % 50 == 0:
            await asyncio.sleep(0.05)
    await asyncio.gather(*tasks)
    if ready < count:
        connected.set()
    return {"lags": lags or [0.0], "early": early or [0.0], "late": late or [0.0], "counts": counts,
            "failed": len(failed), "errors": sorted(set(failed))[:5],
            "seconds": time.time() - started}


_AT = re.compile(rb'"at":([0-9.eE+-]+)')


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sse-only", action="store_true", help="skip the request load, measure the streams")
    opts = parser.parse_args()
    if opts.quick:
        opts.requests, opts.subscribers, opts.steps = 300, 20, 60
    tmp = Path(tempfile.mkdtemp(prefix="cairn-bench-server-"))
    db = f"sqlite:///{tmp}/cairn.db"
    env = {**os.environ, "CAIRN_DB": db, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    setup = cairn.App(db=db)
    token = setup.tokens.mint("bench", "operator", "bench").secret
    setup.close()
    auth = {"Authorization": f"Bearer {token}"}
    port, bare_port = _free_port(), _free_port()
    server = _start([sys.executable, "-m", "cairn", "serve", "--app", "bench.server_app:app", "--db", db,
                     "--port", str(port), "--log-level", "warning"], port, env)
    bare = _start([sys.executable, "-m", "uvicorn", "bench.server_app:bare", "--port", str(bare_port),
                   "--log-level", "warning"], bare_port, env)
    url, bare_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
    results: dict[str, object] = {}
    try:
        if not opts.sse_only:
            n = opts.requests
            ids = [f"run-{i}" for i in range(n)]
            starts: list[tuple[str, object]] = [("/api/runs", {"workflow": "bench", "run_id": i})
                                                for i in ids]
            post, post_s = _load(url, "POST", starts, auth, opts.clients)
            # a run id chosen over HTTP is in the tenant's namespace (the token's tenant: "bench")
            gets: list[tuple[str, object]] = [(f"/api/runs/{scoped_run_id('bench', i)}", None) for i in ids]
            get, get_s = _load(url, "GET", gets, auth, opts.clients)
            floor, floor_s = _load(bare_url, "GET", [(f"/bare/{i}", None) for i in ids], {}, opts.clients)
            for name, lat, secs in (("POST /api/runs", post, post_s), ("GET /api/runs/{id}", get, get_s),
                                    ("bare GET (floor)", floor, floor_s)):
                results[name] = {"p50_ms": round(_pct(lat, 0.5) * 1000, 2),
                                 "p99_ms": round(_pct(lat, 0.99) * 1000, 2), "rps": round(len(lat) / secs, 1)}
            floor_p50 = _pct(floor, 0.5)
            results["GET p50 / floor p50"] = round(_pct(get, 0.5) / floor_p50, 2)
            results["POST p50 / floor p50"] = round(_pct(post, 0.5) / floor_p50, 2)

        # SSE: many subscribers on one busy run
        rss_empty = _rss_kb(server.pid)
        app = cairn.App(db=db)
        subscribers = opts.subscribers
        run_id = scoped_run_id("bench", "sse-run")
        with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
            assert http.post("/api/runs", json={"workflow": "bench", "run_id": run_id,
                                                "input": {"n": opts.steps}}).status_code in (200, 201)
        connected = threading.Event()
        outcome: dict[str, Any] = {}

        def subscribers_thread() -> None:
            outcome.update(asyncio.run(_subscribe_all(port, token, run_id, subscribers, connected)))

        clients = threading.Thread(target=subscribers_thread, daemon=True)
        clients.start()
        if not connected.wait(120):
            raise RuntimeError(f"{subscribers} subscribers did not connect: {outcome}")
        rss_before = _rss_kb(server.pid)
        server_cpu, client_cpu = _cpu_seconds(server.pid), time.process_time()
        quiet = subprocess.DEVNULL
        worker_proc = subprocess.Popen([sys.executable, "-m", "cairn", "worker", "--app",
                                        "bench.server_app:app", "--db", db, "--poll", "0.01"],
                                       cwd=ROOT, env=env, stdout=quiet, stderr=quiet)
        peak = rss_before
        while clients.is_alive():
            peak = max(peak, _rss_kb(server.pid))
            time.sleep(0.05)
        server_cpu, client_cpu = _cpu_seconds(server.pid) - server_cpu, time.process_time() - client_cpu
        worker_proc.terminate()
        worker_proc.wait(20)
        expected = len(app.history(run_id))
        app.close()
        lags: list[float] = outcome["lags"]
        seen_counts: list[tuple[int, int]] = outcome["counts"]
        results["sse"] = {
            "subscribers": subscribers, "completed streams": len(seen_counts),
            "failed streams": outcome["failed"], "errors": outcome["errors"],
            "events per subscriber": expected,
            "lost or repeated": sum(abs(expected - n) + (n - u) for n, u in seen_counts),
            "lag_p50_ms": round(_pct(lags, 0.5) * 1000, 1), "lag_p99_ms": round(_pct(lags, 0.99) * 1000, 1),
            "lag_max_ms": round(max(lags) * 1000, 1),
            "lag_p50_ms first / last tenth of the run": [round(_pct(outcome["early"], 0.5) * 1000, 1),
                                                         round(_pct(outcome["late"], 0.5) * 1000, 1)],
            "streams_seconds": round(outcome["seconds"], 2),
            "cpu_seconds": {"server": round(server_cpu, 2),
                            "subscribers (this process)": round(client_cpu, 2)},
            "server_rss_mb": {"before subscribers": round(rss_empty / 1024, 1),
                              "subscribed, idle": round(rss_before / 1024, 1), "peak": round(peak / 1024, 1)},
        }
    finally:
        server.terminate()
        bare.terminate()
        server.wait(20)
        bare.wait(20)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
