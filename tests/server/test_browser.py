"""The dashboard in a real browser: Debian's chromium, headless, against a
real uvicorn on 127.0.0.1. The browser signs in through a link carrying the
token in its fragment (the login page posts it and the server sets the
cookie), then renders pages whose DOM (after their scripts ran) we read:

- the runs page lists the runs, hostile run ids shown as text;
- a run page shows its timeline, and the live stream appends the entries a
  worker writes after the page was rendered, each once, until it ends;
- user text full of markup (``<script>``, ``<img onerror>``) is shown as
  text: no element is created from it and no script of it runs.

Screenshots land in ``$CAIRN_SCREENSHOTS`` (default: the test's tmp dir).
Skipped, with one reason, where chromium is not installed (``.ci/run``
installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import cairn

from .conftest import TENANT, LiveServer
from .workflows import register

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"document.body.dataset.pwned='1'\">"
HOSTILE_ID = "<b>bold</b><img src=y onerror=\"document.body.dataset.pwned='2'\">"  # '/' too: any id shows


class Dom(HTMLParser):
    """The elements of a dumped DOM: tag, attributes, and the text inside ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: dict[str, str] = {}
        self._open: list[str | None] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.elements.append((tag, found))
        self._in_title = tag == "title"
        if tag not in ("br", "img", "input", "meta", "link"):
            self._open.append(found.get("id"))

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False
        if self._open and tag not in ("br", "img", "input", "meta", "link"):
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        for ident in self._open:
            if ident is not None:
                self.text[ident] = self.text.get(ident, "") + data

    def rows(self, table_id: str) -> list[dict[str, str | None]]:
        return [attrs for tag, attrs in self.elements if tag == "tr" and "data-seq" in attrs]


def browse(url: str, screenshot: Path | None = None, *, stream_ends: bool = False) -> Dom:
    """The DOM of ``url`` after its scripts ran. A page whose event stream
    ends (a finished run's) is read once the browser is idle (virtual time:
    the stream's events all arrived); a page with a stream that stays open
    (the runs list) after a few seconds of load."""
    assert CHROMIUM is not None
    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"cairn-chromium-{os.getpid()}"
    wait = "--virtual-time-budget=8000" if stream_ends else "--timeout=3000"
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", f"--user-data-dir={profile}", "--window-size=1366,900", wait]
    if screenshot is not None:
        done = subprocess.run([*args, f"--screenshot={screenshot}", url], capture_output=True, timeout=90,
                              check=False)
        assert screenshot.exists(), done.stderr[-2000:]
    done = subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = Dom()
    dom.feed(done.stdout)
    return dom


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("CAIRN_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class SeesStream:
    """ASGI middleware: sets ``opened`` when a browser opens a run's event stream."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.opened = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("path", "").endswith("/events"):
            self.opened.set()
        await self.app(scope, receive, send)


def test_runs_page_run_page_live_timeline_and_hostile_text(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")
    wf = register(app)
    token = app.tokens.mint(TENANT, "operator", "ada").secret
    hostile = app.start(wf["echo"], HOSTILE, tenant=TENANT, run_id=HOSTILE_ID)
    app.resume(hostile.run_id)
    live = app.start(wf["ticker"], 12, tenant=TENANT)
    seen: dict[str, SeesStream] = {}

    def wrap(asgi: Any) -> Any:
        seen["m"] = SeesStream(asgi)
        return seen["m"]

    shots = _shots(tmp_path)
    try:
        with LiveServer(app, wrap=wrap, heartbeat=1.0) as server:
            def login(next_path: str) -> str:
                return f"{server.url}/login?next={next_path}#token={token}"

            runs = browse(login("/"), shots / "runs.png")
            listed = {attrs.get("data-run-id") for tag, attrs in runs.elements if tag == "tr"}
            assert {hostile.run_id, live.run_id} <= listed
            assert runs.title == "Runs · Cairn"

            def work() -> None:  # the run progresses only once the page is open and streaming
                if seen["m"].opened.wait(60):
                    app.resume(live.run_id)

            worker = threading.Thread(target=work, daemon=True)
            worker.start()
            page = browse(login(f"/runs/{live.run_id}"), stream_ends=True)
            worker.join(30)
            history = [e.seq for e in app.history(live.run_id)]
            shown = [int(str(attrs["data-seq"])) for attrs in page.rows("timeline")]
            assert shown == history, "the live timeline missed or repeated entries"
            assert page.text.get("run-status") == "completed"  # rendered pending, updated by the stream
            assert history[-1] > 10

            from urllib.parse import quote

            hostile_page = login("/runs/" + quote(hostile.run_id, safe=""))
            shown_hostile = browse(hostile_page, shots / "hostile-run.png", stream_ends=True)
            shown_input = shown_hostile.text.get("run-input", "")
            assert "<script>document.title='pwned'</script><img src=x onerror=" in shown_input, shown_input
            assert not [tag for tag, _ in shown_hostile.elements if tag in ("img", "b")], \
                "markup in user text became elements"
            assert all("onerror" not in attrs for _, attrs in shown_hostile.elements)
            body = next(attrs for tag, attrs in shown_hostile.elements if tag == "body")
            assert "data-pwned" not in body
            assert shown_hostile.title.startswith("Run <b>bold</b>")  # the title shows the id as text
            for dom in (runs, page):
                assert not [tag for tag, _ in dom.elements if tag in ("img", "b")]
    finally:
        app.close()
