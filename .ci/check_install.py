"""What an installed Cairn can do with the extras it has, and how it fails without the others.

``.ci/extras`` runs this in clean virtualenvs, each with the wheel installed
with no extra or with one (``--extra NAME``); ``tests/test_packaging.py``
runs it in the test suite's own environment with ``--simulate NAME``, which
hides every installed distribution that ``cairn-runtime[NAME]`` would not
have pulled in, so the lazy-import rule is pinned without building venvs.

It checks, for the extras this environment satisfies:

* every module of the package imports (walked on disk, so a package whose
  ``__init__`` fails still has its submodules tried), except those that need
  an extra that is missing: they must raise ``cairn.errors.MissingExtra``
  with exactly the one line that names the extra;
* each optional feature works when its extra is there, and otherwise fails
  with that one line: in the library as ``MissingExtra``, in the CLI as one
  ``error:`` line on stderr and exit status 1, no traceback;
* ``--source DIR``: every file of the source tree (templates, static files,
  SQL, the demo's files) is in the installed package;
* ``--demo``: ``cairn demo`` exits 0 on its default embedded SQLite
  database (a new ``./.cairn/demo-*.db``), its worker processes included.

Prints one line per failure and exits 1 if there was any.
"""

from __future__ import annotations

import argparse
import http.server
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DIST = "cairn-runtime"
#: the extras this checks (``dev`` and ``bench`` are for working on Cairn, not features)
EXTRAS = ("pydantic", "openai", "anthropic", "mcp", "postgres", "server", "otel", "otel-export", "langgraph",
          "encryption", "workspace", "sandbox")
#: module (and its submodules) -> the extra its import needs; the feature its message names
IMPORT_NEEDS = {
    "cairn.models.openai": "openai",
    "cairn.models.anthropic": "anthropic",
    "cairn.models.transport": "openai",
    "cairn.mcp": "mcp",
    "cairn.mcpserve": "mcp",
    "cairn.server": "server",
    "cairn.store.postgres": "postgres",
    "cairn.memory.langgraph": "langgraph",
    "cairn.langgraph": "langgraph",
    "cairn.lgdurable": "langgraph",
    "cairn.lgbreakpoints": "langgraph",
}

failures: list[str] = []
simulated: str | None = None


def fail(message: str) -> None:
    failures.append(message)
    print(f"FAIL {message}", flush=True)


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- which extras this environment has ------------------------------------------------------------


def extra_requirements() -> dict[str, list[str]]:
    """Each extra's requirement names, from the installed distribution's metadata."""
    found: dict[str, list[str]] = {}
    for line in importlib.metadata.requires(DIST) or []:
        marker = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", line)
        name = re.match(r"[A-Za-z0-9._-]+", line)
        if marker and name:
            found.setdefault(marker.group(1), []).append(normal(name.group(0)))
    return found


def satisfied_extras(installed: Callable[[str], bool]) -> set[str]:
    """The extras whose every requirement is installed (``otel-export`` brings ``otel``'s too)."""
    return {extra for extra, names in extra_requirements().items() if all(installed(n) for n in names)}


def installed_for_real(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# -- --simulate: hide what a clean venv with one extra would not have -------------------------------


def closure(extra: str | None) -> set[str]:
    """The distributions ``pip install cairn-runtime[extra]`` installs (names normalised)."""
    from packaging.requirements import Requirement

    dists: set[str] = set()
    visited: set[tuple[str, str]] = set()
    todo = [(DIST, extra or "")]
    while todo:
        name, wanted_extra = todo.pop()
        if (normal(name), wanted_extra) in visited:
            continue
        visited.add((normal(name), wanted_extra))
        dists.add(normal(name))
        if wanted_extra:
            todo.append((name, ""))  # an extra brings the distribution's own requirements too
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in dist.requires or []:
            req = Requirement(text)
            if (req.marker is None and wanted_extra) or (
                    req.marker is not None and not req.marker.evaluate({"extra": wanted_extra})):
                continue
            todo.extend([(req.name, ""), *((req.name, e) for e in req.extras)])
    return dists


class Hider:
    """A meta-path finder that refuses modules whose file belongs to a hidden distribution."""

    def __init__(self, keep: set[str]) -> None:
        self.hidden: set[str] = set()
        for dist in importlib.metadata.distributions():
            if normal(dist.metadata["Name"]) in keep:
                continue
            for file in dist.files or []:
                if file.suffix in (".py", ".so", ".pyd"):
                    self.hidden.add(os.path.realpath(str(dist.locate_file(file))))

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.origin and os.path.realpath(spec.origin) in self.hidden:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by check_install)", name=name)
        return None


def simulate(extra: str | None) -> set[str]:
    keep = closure(extra)
    sys.meta_path.insert(0, Hider(keep))
    return satisfied_extras(lambda name: name in keep)


# -- running the CLI --------------------------------------------------------------------------------


def cairn_command() -> list[str]:
    if simulated is not None:
        return [sys.executable, __file__, "--simulate", simulated, "--cli"]
    return [str(Path(sys.executable).parent / "cairn")]


def run_cli(*args: str, cwd: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    return subprocess.run([*cairn_command(), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def one_line_error(what: str, done: subprocess.CompletedProcess[str], message: str) -> None:
    """``done`` failed with exactly ``error: message`` on stderr."""
    want = f"error: {message}"
    if done.returncode != 1 or done.stderr.strip() != want:
        fail(f"{what}: wanted exit 1 and {want!r}, got exit {done.returncode} and {done.stderr.strip()!r}")


# -- the checks -------------------------------------------------------------------------------------


def modules(root: Path, prefix: str) -> Iterator[str]:
    """Every module under ``root``, found on disk (importing a package is not
    needed to list its submodules); ``__main__`` runs the CLI, so it is left out."""
    for info in pkgutil.iter_modules([str(root)]):
        name = prefix + info.name
        if info.name != "__main__":
            yield name
        if info.ispkg:
            yield from modules(root / info.name, name + ".")


def needed_extra(module: str) -> tuple[str, str] | None:
    for prefix, extra in IMPORT_NEEDS.items():
        if module == prefix or module.startswith(prefix + "."):
            return prefix, extra
    return None


def check_imports(have: set[str]) -> None:
    import cairn
    from cairn.errors import MissingExtra, missing_extra_message

    count = 0
    for name in modules(Path(cairn.__file__).parent, "cairn."):
        count += 1
        need = needed_extra(name)
        try:
            importlib.import_module(name)
        except MissingExtra as exc:
            if need is None or need[1] in have:
                fail(f"import {name}: {exc}")
            elif str(exc) != missing_extra_message(*need):
                fail(f"import {name}: wanted {missing_extra_message(*need)!r}, got {str(exc)!r}")
        except BaseException as exc:
            fail(f"import {name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        else:
            if need is not None and need[1] not in have:
                fail(f"import {name} succeeded without the {need[1]!r} extra")
    print(f"ok   {count} modules walked", flush=True)


def expect_missing(feature: str, extra: str, use: Callable[[], object]) -> None:
    """``use()`` raises ``MissingExtra`` naming ``extra`` for ``feature``."""
    from cairn.errors import MissingExtra, missing_extra_message

    try:
        use()
    except MissingExtra as exc:
        if str(exc) != missing_extra_message(feature, extra):
            fail(f"{feature}: wanted {missing_extra_message(feature, extra)!r}, got {str(exc)!r}")
    except BaseException as exc:
        fail(f"{feature}: wanted MissingExtra for {extra!r}, got {type(exc).__name__}: {exc}")
    else:
        fail(f"{feature} worked without the {extra!r} extra")


def check_features(have: set[str], workdir: Path) -> None:
    import cairn
    from cairn.errors import missing_extra_message

    app = cairn.App("memory://")
    done = run_cli("--help")  # the console script, in a real venv
    if done.returncode != 0 or "Usage: cairn" not in done.stdout:
        fail(f"cairn --help exited {done.returncode}: {done.stderr.strip()[-500:]}")
    # the OpenAI adapter and the OpenAI embedder (httpx)
    from cairn.memory.embedders import OpenAIEmbedder

    if "openai" in have:
        OpenAIEmbedder("text-embedding-3-small", 8, api_key="k")
        from cairn.models.openai import OpenAIChat

        OpenAIChat("gpt-4o-mini", api_key="k").close()
    if "anthropic" in have:
        from cairn.models.anthropic import AnthropicChat

        AnthropicChat("claude-sonnet-4-5", api_key="k").close()
    else:
        expect_missing("OpenAIEmbedder", "openai", lambda: OpenAIEmbedder("m", 8))
    # PostgreSQL (psycopg): in the library, and through the CLI
    unreachable = "postgresql://cairn@127.0.0.1:1/cairn"
    if "postgres" in have:
        from cairn.store.sqlfiles import load_migrations, load_queries

        if not (load_queries("postgres") and load_migrations("postgres")):
            fail("the PostgreSQL queries or migrations are missing from the package")
        try:
            cairn.App(unreachable)
        except cairn.errors.MissingExtra as exc:
            fail(f"App(postgresql://...) with the postgres extra: {exc}")
        except cairn.CairnError:
            pass  # nothing listens there: a StoreError, as wanted
    else:
        expect_missing("PostgreSQL (a postgresql:// database)", "postgres", lambda: cairn.App(unreachable))
        one_line_error("cairn runs --db postgresql://", run_cli("--db", unreachable, "runs"),
                       missing_extra_message("PostgreSQL (a postgresql:// database)", "postgres"))
    # OpenTelemetry: spans and metrics through the API (otel), exported (otel-export)
    from cairn.api.instrumentation import export_otlp, instrument, uninstrument
    from cairn.api.store_metrics import StoreMetrics

    if "otel" in have:
        instrument(app)
        uninstrument(app)
        StoreMetrics(app)
    else:
        expect_missing("OpenTelemetry instrumentation", "otel", lambda: instrument(app))
        expect_missing("OpenTelemetry store metrics", "otel", lambda: StoreMetrics(app))
    if "otel-export" in have:
        check_otlp_export()
    else:
        expect_missing("OTLP export", "otel-export", lambda: export_otlp(app))
    # the sandbox's seccomp filter (pyseccomp over the system's libseccomp2)
    from cairn.sandbox.seccomp import filter_bytes

    if "sandbox" in have:
        if not filter_bytes(unix_sockets=False):
            fail("the sandbox's seccomp filter is empty")
    else:
        expect_missing("the sandbox's seccomp filter", "sandbox", lambda: filter_bytes(unix_sockets=True))
    # encryption at rest (cryptography): only when a keyring is given
    import base64

    from cairn.security.keyring import LocalKeyring

    ring = LocalKeyring.parse(f"k1 {base64.b64encode(os.urandom(32)).decode()}", "a test key")
    if "encryption" in have:
        sealed = cairn.App("memory://", keyring=ring)
        if sealed.run(sealed.workflow(name="sealed")(lambda ctx: "ok")) != "ok":
            fail("a run with encryption on did not complete")
        sealed.close()
    else:
        expect_missing("encryption at rest", "encryption", lambda: cairn.App("memory://", keyring=ring))
    # the HTTP server and the dashboard
    if "server" not in have:
        one_line_error("cairn serve", run_cli("serve", "--db", f"sqlite:///{workdir}/serve.db"),
                       missing_extra_message("cairn serve", "server"))
    else:
        check_serve(workdir, metrics="otel-export" in have)
    app.close()


def check_otlp_export() -> None:
    """A run's spans and metrics reach an OTLP/HTTP endpoint: a stand-in that answers 200 to anything."""
    import cairn

    app = cairn.App("memory://")

    @app.workflow(name="ping")
    def ping(ctx: cairn.Context) -> str:
        return "pong"

    posted: list[str] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            posted.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        from cairn.api.instrumentation import export_otlp

        stop = export_otlp(app, service_name="check-install")
        app.run(ping)
        stop()  # flushes the batched spans and the metrics
    finally:
        server.shutdown()
        del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        app.close()
    if not {"/v1/traces", "/v1/metrics"} <= set(posted):
        fail(f"export_otlp sent no spans or no metrics (posted: {posted})")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_serve(workdir: Path, metrics: bool) -> None:
    """A real ``cairn serve``: the login page (a template), a static file and the OpenAPI document."""
    import cairn
    from cairn.errors import missing_extra_message

    db = f"sqlite:///{workdir}/serve.db"
    cairn.App(db).close()  # serve opens an existing database only
    if not metrics:
        one_line_error("cairn serve --metrics", run_cli("serve", "--metrics", "--db", db),
                       missing_extra_message("GET /metrics", "otel-export"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    args = ["serve", "--db", db, "--port", str(port), *(["--metrics"] if metrics else [])]
    server = subprocess.Popen([*cairn_command(), *args], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        for path in ("/login", "/static/app.js", "/static/style.css", "/api/openapi.json"):
            status = get(f"http://127.0.0.1:{port}{path}", server)
            if status != 200:
                fail(f"cairn serve: GET {path} answered {status}")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            _, err = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            _, err = server.communicate()
    if server.returncode != 0:
        fail(f"cairn serve exited {server.returncode} on SIGTERM: {err.strip()[-500:]}")


def get(url: str, server: subprocess.Popen[str]) -> int | str:
    """The status of GET ``url``, once the server listens (it is polled until then)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError as exc:
            if server.poll() is not None or time.monotonic() > deadline:
                return f"no answer ({exc}; server exit {server.poll()})"
            time.sleep(0.1)  # not listening yet: uvicorn is still starting


def check_package_data(source: Path) -> None:
    """Every file of the source tree is in the installed package (hatch decides what ships)."""
    import cairn

    installed = Path(cairn.__file__).parent
    missing = [str(f.relative_to(source)) for f in sorted(source.rglob("*"))
               if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
               and not (installed / f.relative_to(source)).is_file()]
    if missing:
        fail(f"not in the installed package: {', '.join(missing)}")
    else:
        print("ok   every source file is in the installed package", flush=True)


def check_demo(workdir: Path) -> None:
    started = time.monotonic()
    done = run_cli("demo", cwd=str(workdir), timeout=300)
    if done.returncode != 0:
        fail(f"cairn demo exited {done.returncode}: {(done.stderr or done.stdout).strip()[-2000:]}")
    elif not list((workdir / ".cairn").glob("demo-*.db")):
        fail("cairn demo did not make its default database, ./.cairn/demo-*.db")
    else:
        print(f"ok   cairn demo exited 0 in {time.monotonic() - started:.1f}s", flush=True)


def main() -> int:
    global simulated
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", default="base", help="the extra installed ('base': none)")
    parser.add_argument("--simulate", metavar="EXTRA",
                        help="hide what a clean venv with only this extra ('base': none) would not have")
    parser.add_argument("--source", type=Path, help="the source package (src/cairn) to compare with")
    parser.add_argument("--demo", action="store_true", help="run cairn demo")
    parser.add_argument("--cli", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simulate is not None:
        simulated = args.simulate
        have = simulate(None if args.simulate == "base" else args.simulate)
        if args.cli is not None:  # the CLI, under the same hiding (the CLI checks run it so)
            from cairn.cli.main import main as cairn_main

            sys.argv = ["cairn", *args.cli]
            cairn_main()
            return 0
        wanted = args.simulate
    else:
        have = satisfied_extras(installed_for_real)
        wanted = args.extra
    have &= set(EXTRAS)
    if wanted == "base" and have:
        fail(f"a clean install has no extra, but this one has {sorted(have)}")
    if wanted != "base" and wanted not in have:
        fail(f"the {wanted!r} extra is not fully installed (have: {sorted(have)})")
    print(f"==   cairn-runtime[{wanted}]: extras satisfied {sorted(have) or 'none'}", flush=True)
    try:
        import cairn.cli.main  # noqa: F401 - the package, and the CLI over all of it
    except BaseException as exc:
        fail(f"import cairn.cli.main: {type(exc).__name__}: {exc}")
        return 1
    check_imports(have)
    with tempfile.TemporaryDirectory(prefix="cairn-check-") as tmp:
        check_features(have, Path(tmp))
        if args.source is not None:
            check_package_data(args.source)
        if args.demo:
            demo_dir = Path(tmp) / "demo"
            demo_dir.mkdir()
            check_demo(demo_dir)
    verdict = "FAILED" if failures else "ok  "
    print(f"{verdict} cairn-runtime[{wanted}]: {len(failures)} failure(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
