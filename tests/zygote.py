"""A pre-loaded parent of worker processes (``processes.Zygote``): run as
``python -m tests.zygote MODULE [PRELOAD...]``, it imports ``MODULE`` once (for
the LangGraph crash tests, LangGraph and Cairn: about 1.5 s of CPU a process),
and each ``PRELOAD`` module (what ``MODULE`` imports only when it runs: the
payments worker imports its app's module, which builds an App from
``$CAIRN_DB``, so only that module's dependencies can be loaded ahead), and
then forks a child per request, which runs ``MODULE`` as ``__main__``
the way ``python -m MODULE ARGS`` would, with the environment and log file
asked for. A child is a real process of its own session, killed by SIGKILL
like any other; only its start is cheap.

Requests come one JSON line at a time on stdin, answers go on stdout:

* ``{"fork": [ARGS...], "env": {...}, "log": PATH}`` -> ``{"pid": N}``
* ``{"poll": N}`` -> ``{"code": null}`` while child N runs, else its exit
  code (negative: the signal that ended it), once: the child is reaped then

A child is reaped only when a poll finds it ended, so its pid stays its own
(a zombie) until the test has seen it end: a kill sent by pid never reaches
a reused one. At the end of stdin every child still running is killed;
each child dies with the zygote too (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import signal
import sys
import traceback
from typing import Any

_PR_SET_PDEATHSIG = 1


def _child(module: str, args: list[str], env: dict[str, str], log: str) -> int:
    """In the forked child: become what ``python -m module args`` is, then run it."""
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the zygote died before the line above
        return 1
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.environ.clear()
    os.environ.update(env)
    from cairn import faults

    faults.arm(env.get("CAIRN_FAULTS", ""))
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> int:
    module = sys.argv[1]
    for name in (module, *sys.argv[2:]):
        importlib.import_module(name)
    children: set[int] = set()
    answer = sys.stdout
    for line in sys.stdin:
        request: dict[str, Any] = json.loads(line)
        if "fork" in request:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _child(module, request["fork"], request["env"], request["log"])
                finally:
                    for stream in (sys.stdout, sys.stderr):
                        with contextlib.suppress(Exception):  # the child ends either way
                            stream.flush()
                    os._exit(code)
            children.add(pid)
            reply: dict[str, Any] = {"pid": pid}
        else:
            pid = request["poll"]
            done, status = os.waitpid(pid, os.WNOHANG)
            code = None if done == 0 else os.waitstatus_to_exitcode(status)
            if code is not None:
                children.discard(pid)
            reply = {"code": code}
        answer.write(json.dumps(reply) + "\n")
        answer.flush()
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    return 0


if __name__ == "__main__":
    status = main()
    # no interpreter finalization: tearing down everything it imported (LangGraph, Cairn) took
    # 0.2 s of each crash test's teardown, and the zygote holds nothing that needs it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
