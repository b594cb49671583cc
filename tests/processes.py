"""Processes the tests start: one way to spawn them, and the rule that only
``slow`` tests may.

``spawn`` starts every Python worker process of the suite (the crash
harnesses' workers, the fault-point children, the CLI's worker): one place
that sets what every such child needs (unbuffered output, its own session so a
kill reaches no one else, no inherited fault plan, the repository root as its
directory, its output in a log file or a pipe). A child is a real OS process,
so a crash test still SIGKILLs a real process; what makes it cheap to start
is that it loads only what it uses (``import cairn`` is lazy) from cached
bytecode (``tests/__init__.py``).

``guard`` enforces the marker: ``pytest -m "not slow"`` is the quick inner
loop (README), so a test that starts a process (a worker, the CLI, a bank, a
server) must be marked ``slow``; in any other test, starting one fails the
test with a message that says so. The session's PostgreSQL cluster is
infrastructure, not the test's process: ``tests/pgcluster.py`` starts it
inside ``infrastructure()``.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]

#: fault plan of the test process (a child gets one only when the test passes it)
_NOT_INHERITED = ("CAIRN_FAULTS",)
#: what a Cairn worker process imports before its first claim, on either store (``import
#: cairn`` is lazy): a ``Zygote``'s ``preload`` for worker modules that import Cairn only when
#: they run (about 0.3 s of a quiet machine's CPU a process)
WORKER_PRELOAD = ("cairn.api.app", "cairn.worker.worker", "cairn.store.sqlite", "cairn.store.postgres",
                  "sqlite_vec")


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a Python child: unbuffered, without the
    test process's fault plan, plus ``env``."""
    environment = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    environment["PYTHONUNBUFFERED"] = "1"
    environment.update(env or {})
    return environment


def python_command(target: str | Path, args: Sequence[str] = ()) -> list[str]:
    """``python -m target`` for a dotted module name, ``python target`` for a file."""
    if isinstance(target, Path) or target.endswith(".py"):
        return [sys.executable, str(target), *args]
    return [sys.executable, "-m", target, *args]


def start(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    cwd: Path = REPO_ROOT,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Start ``command`` in its own session (a signal to its process group
    reaches it alone), from ``cwd``, in ``child_environment(env)``. Its stdout
    and stderr go to ``log`` when given (a file, never a pipe nobody drains),
    else wherever ``popen`` says (pipes, for a child the test talks to)."""
    options: dict[str, Any] = {"stdin": subprocess.DEVNULL, **popen}
    environment = child_environment(env)
    if log is None:
        return subprocess.Popen(list(command), cwd=cwd, env=environment, start_new_session=True, **options)
    with log.open("wb") as out:
        return subprocess.Popen(list(command), cwd=cwd, env=environment, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT, **options)


def spawn(
    target: str | Path,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    cwd: Path = REPO_ROOT,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Start a Python child: ``target`` is a module name (``-m``) or a script (see ``start``)."""
    return start(python_command(target, args), env=env, log=log, cwd=cwd, **popen)


def run(
    target: str | Path,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO_ROOT,
    timeout: float,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a Python child to its end (see ``spawn``), its output captured as text."""
    return subprocess.run(python_command(target, args), cwd=cwd, env=child_environment(env),
                          input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
                          start_new_session=True)


class Forked:
    """A child of a ``Zygote``: the part of ``Popen`` the crash tests use."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.ask({"poll": self.pid})["code"]
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped: the pid is still this child's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0)
            time.sleep(0.01)
        return code


class Zygote:
    """Starts Python children pre-loaded with ``module`` (``tests/zygote.py``):
    each is a real process (its own session, SIGKILLed like any other) forked
    from a parent that imported ``module`` once, so a chain of dozens of
    workers does not import LangGraph dozens of times. ``spawn`` takes what
    the module-level ``spawn`` takes; its child runs ``module`` as
    ``python -m module args`` would. ``preload``: modules the parent imports
    too, ahead of what ``module`` imports only once it runs."""

    def __init__(self, module: str, *, env: Mapping[str, str] | None = None, log: Path | None = None,
                 preload: Sequence[str] = ()) -> None:
        self.module = module
        self._lock = threading.Lock()
        with contextlib.ExitStack() as files:
            err = subprocess.DEVNULL if log is None else files.enter_context(log.open("wb"))
            self._parent = spawn("tests.zygote", [module, *preload], env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=err, text=True)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        parent = self._parent
        assert parent.stdin is not None
        assert parent.stdout is not None
        with self._lock:
            parent.stdin.write(json.dumps(request) + "\n")
            parent.stdin.flush()
            answer = parent.stdout.readline()
        if not answer:
            raise RuntimeError(f"the zygote of {self.module} ended (exit {parent.poll()})")
        found: dict[str, Any] = json.loads(answer)
        return found

    def spawn(self, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None, log: Path) -> Forked:
        request = {"fork": list(args), "env": child_environment(env), "log": str(log)}
        return Forked(self, self.ask(request)["pid"])

    def close(self) -> None:
        """End the zygote, and with it every child still running."""
        parent = self._parent
        if parent.stdin is not None:
            with contextlib.suppress(OSError):
                parent.stdin.close()
        try:
            parent.wait(30)
        except subprocess.TimeoutExpired:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the rule: only slow tests start processes ---------------------------------------------------


class SpawnWithoutSlowMark(AssertionError):
    """A test not marked ``slow`` started a process."""


_local = threading.local()
_state: dict[str, Any] = {"test": None, "spawned": []}


@contextlib.contextmanager
def infrastructure() -> Iterator[None]:
    """Processes started inside are the session's (its PostgreSQL cluster), not a test's."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def _check(what: str) -> None:
    test = _state["test"]
    if test is None or getattr(_local, "depth", 0):
        return
    what = what.encode("utf-8", "backslashreplace").decode()[:300]  # a hostile argument stays reportable
    message = (f"{test} started a process ({what}) but is not marked slow: mark it "
               "@pytest.mark.slow (process-spawning tests are left out of the quick loop, "
               "pytest -m 'not slow')")
    _state["spawned"].append(message)
    raise SpawnWithoutSlowMark(message)


def _wrap(original: Callable[..., Any], what: Callable[..., str]) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _check(what(*args, **kwargs))
        return original(*args, **kwargs)
    return guarded


def _command_of(self: Any, args: Any, *rest: Any, **kwargs: Any) -> str:
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)


_ORIGINALS: dict[tuple[Any, str], Callable[..., Any]] = {}


def _as_infrastructure(original: Callable[..., Any]) -> Callable[..., Any]:
    def quietly(*args: Any, **kwargs: Any) -> Any:
        with infrastructure():
            return original(*args, **kwargs)
    return quietly


def install() -> None:
    """Route every way this process starts another through ``_check``: the
    subprocess module (``Popen``, ``run``...), multiprocessing's spawn and
    forkserver (``_posixsubprocess.fork_exec``), ``os.fork`` (its fork start
    method) and ``os.posix_spawn``, ``os.system``. ``ctypes.util.find_library``
    runs ``ldconfig -p`` (the SQLite store looks up libsqlite3 once per
    process for sqlite-vec): a library lookup, not a test's process."""
    import ctypes.util

    if (ctypes.util, "find_library") not in _ORIGINALS:
        _ORIGINALS[(ctypes.util, "find_library")] = ctypes.util.find_library
        ctypes.util.find_library = _as_infrastructure(ctypes.util.find_library)
    targets: list[tuple[Any, str, Callable[..., str]]] = [
        (subprocess.Popen, "_execute_child", _command_of),
        (_posixsubprocess, "fork_exec", lambda *a, **k: "fork_exec"),
        (os, "fork", lambda *a, **k: "os.fork"),
        (os, "posix_spawn", lambda path, *a, **k: f"posix_spawn {path}"),
        (os, "posix_spawnp", lambda path, *a, **k: f"posix_spawnp {path}"),
        (os, "system", lambda command, *a, **k: f"os.system {command}"),
    ]
    for owner, name, what in targets:
        if (owner, name) not in _ORIGINALS and hasattr(owner, name):
            _ORIGINALS[(owner, name)] = getattr(owner, name)
            setattr(owner, name, _wrap(_ORIGINALS[(owner, name)], what))


@contextlib.contextmanager
def guard(test: str, slow: bool) -> Iterator[list[str]]:
    """While a test runs (setup, call, teardown): a spawn fails unless ``slow``.
    Yields the messages of the spawns refused (a test that swallowed the
    exception still fails on them)."""
    outer = dict(_state)
    _state["test"] = None if slow else test
    _state["spawned"] = []
    try:
        yield _state["spawned"]
    finally:
        _state.update(outer)
