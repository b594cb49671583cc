"""The demos' child processes: workers and the bank, each started in its own
session with its output in a log file, ended by SIGTERM (then SIGKILL if it
lingers) and always reaped.

The approval and payments demos each start workers, and both start the bank
(``demo.bank.BankProcess``): one piece starts and ends them all, so a fix to
how a child is started or stopped (a lingering one, a log left open) reaches
every demo.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, ClassVar


def child_env(drop: Collection[str] = ()) -> dict[str, str]:
    """This environment without the variables ``drop``, with this copy of the
    package importable by ``python -m`` (a child must run the code the demo
    runs, not another copy installed elsewhere)."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def launch(command: Sequence[str], log: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``command`` writing to ``log``, in a session of its own (a
    Ctrl-C at the terminal reaches the demo alone, which then stops its
    children itself)."""
    return subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes], log: IO[bytes], grace: float = 5.0) -> None:
    """SIGTERM (a worker drains, the bank closes its database), SIGKILL if it
    lingers past ``grace`` seconds; always reaped, and ``log`` closed."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=grace)
    log.close()


def tail(log_path: Path, lines: int) -> str:
    """The last ``lines`` lines of a child's log ("" if it has none yet)."""
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


@dataclass
class Child:
    """A child process a demo started, logging to ``log_path`` through ``log``."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    #: the lines of its log ``log_tail`` shows unless told
    tail_lines: ClassVar[int] = 12

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int | None = None) -> str:
        return tail(self.log_path, self.tail_lines if lines is None else lines)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it lingers past ``grace`` seconds; always reaped."""
        stop(self.proc, self.log, grace)


@dataclass
class Worker(Child):
    """A ``cairn worker`` a demo started (``spawn``)."""

    name: str

    @classmethod
    def spawn(cls, name: str, command: Sequence[str], workdir: Path, env: dict[str, str]) -> Worker:
        """Start ``command`` as worker ``name``, logging to ``workdir/<name>.log``."""
        log_path = workdir / f"{name}.log"
        log = log_path.open("wb")
        return cls(proc=launch(command, log, env), log_path=log_path, log=log, name=name)


__all__ = ["Child", "Worker", "child_env", "launch", "stop", "tail"]
