"""HTTP API under load, on loopback: ``python -m bench.server [--quick]``.

Starts ``cairn serve`` (SQLite) and, as the floor, uvicorn serving a bare
Starlette JSON endpoint, each in a process of its own, and drives them from
client threads in this process (``--clients`` concurrent keep-alive
connections):

- ``GET /api/runs/{id}`` and ``POST /api/runs``: p50/p99 latency, requests/s,
  and the ratio to the bare endpoint measured in the same run (what auth,
  the token look-up, the store and the JSON of a run cost over HTTP itself);
- ``--subscribers`` SSE clients on one run that a worker keeps producing
  (``--steps`` steps): delivery lag of every event (received - the entry's
  ``at``) p50/p99, events lost or repeated (must be 0), and the server's RSS.

Figures are this machine's (2 cores shared with the clients); only the
ratios travel.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

import cairn

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
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=300)
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
        n = opts.requests
        ids = [f"run-{i}" for i in range(n)]
        starts: list[tuple[str, object]] = [("/api/runs", {"workflow": "bench", "run_id": i}) for i in ids]
        post, post_s = _load(url, "POST", starts, auth, opts.clients)
        get, get_s = _load(url, "GET", [(f"/api/runs/{i}", None) for i in ids], auth, opts.clients)
        floor, floor_s = _load(bare_url, "GET", [(f"/bare/{i}", None) for i in ids], {}, opts.clients)
        for name, lat, secs in (("POST /api/runs", post, post_s), ("GET /api/runs/{id}", get, get_s),
                                ("bare GET (floor)", floor, floor_s)):
            results[name] = {"p50_ms": round(_pct(lat, 0.5) * 1000, 2),
                             "p99_ms": round(_pct(lat, 0.99) * 1000, 2), "rps": round(len(lat) / secs, 1)}
        floor_p50 = _pct(floor, 0.5)
        results["GET p50 / floor p50"] = round(_pct(get, 0.5) / floor_p50, 2)
        results["POST p50 / floor p50"] = round(_pct(post, 0.5) / floor_p50, 2)

        # SSE: many subscribers on one busy run
        app = cairn.App(db=db)
        subscribers = opts.subscribers
        run_id = "sse-run"
        with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
            assert http.post("/api/runs", json={"workflow": "bench", "run_id": run_id,
                                                "input": {"n": opts.steps}}).status_code in (200, 201)
        lags: list[float] = []
        seen_counts: list[tuple[int, int]] = []
        ready = threading.Barrier(subscribers + 1)
        lock = threading.Lock()

        def subscribe() -> None:
            seqs: list[int] = []
            mine: list[float] = []
            with httpx.Client(base_url=url, headers=auth, timeout=60) as http, \
                    http.stream("GET", f"/api/runs/{run_id}/events") as response:
                ready.wait()
                event: dict[str, str] = {}
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        event["data"] = line[6:]
                    elif line.startswith("event: "):
                        event["event"] = line[7:]
                    elif line == "" and "data" in event:
                        if event.get("event") == "end":
                            break
                        data = json.loads(event["data"])
                        seqs.append(int(data["seq"]))
                        mine.append(time.time() - float(data["at"]))
                        event = {}
            with lock:
                lags.extend(mine)
                seen_counts.append((len(seqs), len(set(seqs))))

        threads = [threading.Thread(target=subscribe, daemon=True) for _ in range(subscribers)]
        for t in threads:
            t.start()
        ready.wait()
        rss_before = _rss_kb(server.pid)
        quiet = subprocess.DEVNULL
        worker_proc = subprocess.Popen([sys.executable, "-m", "cairn", "worker", "--app",
                                        "bench.server_app:app", "--db", db, "--poll", "0.01"],
                                       cwd=ROOT, env=env, stdout=quiet, stderr=quiet)
        peak = rss_before
        while any(t.is_alive() for t in threads):
            peak = max(peak, _rss_kb(server.pid))
            time.sleep(0.05)
        worker_proc.terminate()
        worker_proc.wait(20)
        expected = len(app.history(run_id))
        app.close()
        results["sse"] = {
            "subscribers": subscribers, "events per subscriber": expected,
            "lost or repeated": sum(abs(expected - n) + (n - u) for n, u in seen_counts),
            "lag_p50_ms": round(_pct(lags, 0.5) * 1000, 1), "lag_p99_ms": round(_pct(lags, 0.99) * 1000, 1),
            "server_rss_mb": {"idle": round(rss_before / 1024, 1), "peak": round(peak / 1024, 1)},
        }
    finally:
        server.terminate()
        bare.terminate()
        server.wait(20)
        bare.wait(20)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
