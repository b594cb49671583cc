"""The dashboard in a real browser: Debian's chromium, headless, against a
real uvicorn on 127.0.0.1. The browser signs in through a link carrying the
token in its fragment (the login page posts it and the server sets the
cookie), then renders pages whose DOM (after their scripts ran) we read:

- the runs page lists the runs, hostile run ids shown as text;
- a run page shows its timeline, and the live stream appends the entries a
  worker writes after the page was rendered, each once, until it ends;
- user text full of markup (``<script>``, ``<img onerror>``) is shown as
  text: no element is created from it and no script of it runs.

The interactive tests (approve with an edit, resolve an operation, live
updates arriving without a reload) drive the same chromium with Playwright
(``executable_path``: Playwright downloads no browser of its own).

Screenshots land in ``$CAIRN_ARTIFACTS`` (``$CAIRN_SCREENSHOTS`` also read;
default: the test's tmp dir). Skipped, with one reason, where chromium is
not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import cairn
from tests.timing import SLACK

from .conftest import TENANT, LiveServer
from .workflows import register

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"),
    # one worker process runs every browser test (pytest-xdist, --dist loadgroup): one chromium
    # at a time, and the module-scoped browser is launched once, not once per process
    pytest.mark.xdist_group("chromium"),
]

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"document.body.dataset.pwned='1'\">"
#: HOSTILE as shown inside a JSON string (its double quotes escaped)
MARKUP = "<script>document.title='pwned'</script><img src=x onerror="
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
    folder = Path(os.environ.get("CAIRN_ARTIFACTS") or os.environ.get("CAIRN_SCREENSHOTS") or tmp_path)
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


@pytest.mark.slow
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


# -- interactive: Playwright driving the same chromium ---------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield launched
        launched.close()


class Served:
    """An app on SQLite, a worker serving it in a thread, a live server and
    a signed-in browser page."""

    def __init__(self, tmp_path: Path, browser: Any) -> None:
        self.app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db", lease_seconds=5.0)
        self.wf = register(self.app)
        self.token = self.app.tokens.mint(TENANT, "operator", "ada").secret
        self.browser = browser
        self.shots = _shots(tmp_path)

    def __enter__(self) -> Served:
        self.worker = self.app.worker(concurrency=2, poll_interval=0.02)
        self.thread = threading.Thread(target=self.worker.run, kwargs={"install_signals": False}, daemon=True)
        self.thread.start()
        self.server = LiveServer(self.app, heartbeat=0.5).__enter__()
        self.context = self.browser.new_context(viewport={"width": 1366, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        return self

    def open(self, path: str) -> Any:
        """Sign in (the token rides in the fragment) and land on ``path``."""
        self.page.goto(f"{self.server.url}/login?next={path}#token={self.token}")
        self.page.wait_for_url(f"{self.server.url}{path.split('#')[0]}")
        self.page.evaluate("window.cairnNoReload = 1")  # gone if the page reloads
        return self.page

    def not_reloaded(self) -> bool:
        return bool(self.page.evaluate("window.cairnNoReload === 1"))

    def wait_status(self, run_id: str, status: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout * SLACK
        while self.app.get_run(run_id).status.value != status:
            assert time.monotonic() < deadline, f"{run_id} is {self.app.get_run(run_id).status.value}"
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.context.close()
        self.server.__exit__()
        self.worker.stop()
        self.thread.join(15)
        self.app.close()


def _awaiting(served: Served, *args: Any, run_id: str | None = None) -> str:
    handle = served.app.start(served.wf["payout"], *args, tenant=TENANT, run_id=run_id)
    deadline = time.monotonic() + 20 * SLACK
    while not served.app.approvals(run_id=handle.run_id):
        assert time.monotonic() < deadline, "the run never asked for approval"
        time.sleep(0.05)
    return handle.run_id


@pytest.mark.slow
def test_approve_with_an_edit_and_the_run_continues_with_it(tmp_path: Path, browser: Any) -> None:
    with Served(tmp_path, browser) as served:
        run_id = _awaiting(served, "ada", 500, run_id="pay/ada <500>")
        page = served.open("/")
        page.wait_for_selector(f'tr[data-run-id="{run_id}"]')  # the runs list shows it
        page.goto(f"{served.server.url}/approvals")
        article = page.locator(f'article[data-run-id="{run_id}"]')
        article.wait_for()
        assert '"amount": 500' in article.locator(".approval-details").inner_text()
        page.screenshot(path=str(served.shots / "approvals-inbox.png"), full_page=True)
        article.locator("a.id").click()  # open the run
        page.wait_for_selector("#timeline")
        assert page.locator("h1 .id").inner_text() == run_id
        page.evaluate("window.cairnNoReload = 1")
        form = page.locator("form.decide")
        form.locator("textarea").fill('{"to": "bob", "amount": "lots"}')
        form.locator('button[value="edit"]').click()
        error = form.locator(".approval-error")
        error.filter(has_text="amount").wait_for()
        assert "does not fit" in error.inner_text()
        assert served.app.approvals(run_id=run_id)[0].status.value == "pending"  # nothing stored
        form.locator("textarea").fill('{"to": "bob", "amount": 3}')
        form.locator("input[name=comment]").fill("<b>less</b>")
        form.locator('button[value="edit"]').click()
        page.locator("#run-status", has_text="completed").wait_for(timeout=20_000)
        result = page.locator("#run-result").inner_text()
        assert '"to": "bob"' in result
        assert '"amount": 3' in result
        assert served.not_reloaded(), "the page reloaded instead of updating live"
        decided = page.locator(f'article[data-run-id="{run_id}"]')
        assert decided.locator(".status").inner_text() == "edited"
        assert "<b>less</b>" in decided.inner_text()  # the comment shown as text
        assert page.locator("main b").count() == 0
        page.screenshot(path=str(served.shots / "approved-with-edit.png"), full_page=True)
        assert served.app.handle(run_id).result(timeout=5)["paid"] == {"to": "bob", "amount": 3}
        assert served.errors == []


@pytest.mark.slow
def test_resolve_an_operation_needing_attention(tmp_path: Path, browser: Any) -> None:
    with Served(tmp_path, browser) as served:
        page = served.open("/attention")
        page.locator("#attention-empty").wait_for()
        page.locator("#live[data-state=open]").wait_for()
        run_id = served.app.start(served.wf["payer"], "ada", tenant=TENANT).run_id
        form = page.locator(f'form.resolve[data-run-id="{run_id}"]')
        form.wait_for(timeout=20_000)  # it came to need attention: the page showed it by itself
        form.locator("input[name=result]").fill("not json")
        form.locator('button[value="true"]').click()
        form.locator(".resolve-error", has_text="not JSON").wait_for()
        page.screenshot(path=str(served.shots / "needs-attention.png"), full_page=True)
        form.locator("input[name=result]").fill('"sent by hand"')
        form.locator('button[value="true"]').click()
        page.locator("#attention-empty").wait_for()  # the page reloads without it
        served.wait_status(run_id, "completed")
        assert served.app.handle(run_id).result(timeout=5) == "sent by hand"
        page.goto(f"{served.server.url}/runs/{run_id}")
        assert "operator_done by http:ada#" in page.locator("#operations").inner_text()


@pytest.mark.slow
def test_live_updates_arrive_without_a_reload_and_markup_stays_text(tmp_path: Path, browser: Any) -> None:
    with Served(tmp_path, browser) as served:
        page = served.open("/")
        page.locator("#live[data-state=open]").wait_for()
        started = served.app.start(served.wf["echo"], HOSTILE, tenant=TENANT, run_id=HOSTILE_ID).run_id
        row = page.locator("#runs tr").filter(has_text="bold")
        row.locator(".status", has_text="completed").wait_for(timeout=20_000)  # arrived, then changed
        assert row.get_attribute("data-run-id") == started
        assert served.not_reloaded()

        page.goto(f"{served.server.url}/approvals")
        page.evaluate("window.cairnNoReload = 1")
        page.locator("#live[data-state=open]").wait_for()
        asked = _awaiting(served, HOSTILE, 1)
        article = page.locator(f'article[data-run-id="{asked}"]')
        article.wait_for(timeout=20_000)  # built by the script from the live stream
        assert served.not_reloaded()
        assert MARKUP in article.locator(".approval-details").inner_text()
        page.screenshot(path=str(served.shots / "live-approval.png"), full_page=True)

        from urllib.parse import quote

        page.goto(f"{served.server.url}/runs/{quote(started, safe='')}")
        assert MARKUP in page.locator("#run-input").inner_text()
        assert page.title().startswith("Run <b>bold</b>")
        assert page.locator("main img, main b, main script").count() == 0
        assert page.evaluate("document.body.dataset.pwned") is None
        assert served.errors == []
