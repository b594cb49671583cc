"""A LangGraph run over the HTTP API (both backends): ``POST /api/runs``
starts it in the token's tenant, a worker runs it, its interrupt is decided
over HTTP, and the run's event stream and dashboard page name its
super-steps with their LangGraph nodes. Its thread lives in its tenant: the
other tenant's saver finds nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

import cairn
from cairn.langgraph import CairnSaver
from cairn.server.dashboard import COOKIE
from tests.server.conftest import TENANT, LiveServer, Setup
from tests.server.sse import events

from .support import register


def test_post_a_run_decide_its_interrupt_and_read_its_steps(setup: Setup) -> None:
    app = setup.app
    register(app)
    worker = app.worker(concurrency=1, poll_interval=0.02)
    thread = threading.Thread(target=lambda: worker.run(install_signals=False), daemon=True)
    thread.start()
    try:
        with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as http:
            operator = setup.headers("operator")
            posted = http.post("/api/runs", json={"workflow": "support",
                                                  "input": {"input": {"order": "A-17", "log": []}}},
                               headers=operator)
            assert posted.status_code in (200, 201), posted.text
            run_id = posted.json()["run"]["run_id"]
            requests: list[Any] = []
            deadline = time.monotonic() + 60
            while not requests and time.monotonic() < deadline:
                requests = [r for r in http.get(f"/api/runs/{run_id}/approvals", headers=operator).json()
                            ["approvals"] if r["status"] == "pending"]
                time.sleep(0.05)
            [request] = requests
            assert request["details"] == {"order": "A-17", "question": "refund how much?"}
            decided = http.post(f"/api/runs/{run_id}/approvals/{request['request_id']}/approve",
                                json={"edit": 25}, headers=operator)
            assert decided.status_code == 200, decided.text
            assert app.handle(run_id).result(timeout=60)["log"] == ["triaged A-17", "refunded 25 on A-17"]
            names = []
            viewer = setup.headers("viewer")
            with http.stream("GET", f"/api/runs/{run_id}/events", headers=viewer) as response:
                for event in events(response):
                    if event.event == "end":
                        break
                    if not event.comment and event.data.get("kind") == "langgraph":
                        names.append(event.data["name"])
            assert names == ["step -1 (input)", "step 0 (loop)", "step 1: triage", "step 2: settle"]
            http.cookies.set(COOKIE, setup.tokens["viewer"])
            page = http.get(f"/runs/{run_id}")
            assert page.status_code == 200
            assert "step 2: settle" in page.text
    finally:
        worker.stop()
        thread.join(30)
    assert app.get_run(run_id).tenant == TENANT
    config: Any = {"configurable": {"thread_id": f"lg:{run_id}", "checkpoint_ns": ""}}
    assert CairnSaver(app, tenant=TENANT).get_tuple(config) is not None
    assert CairnSaver(app, tenant="globex").get_tuple(config) is None  # another tenant: not found
    assert isinstance(app, cairn.App)
