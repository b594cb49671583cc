"""How a sandboxed command ended (``Result``), and what both tiers use to
get there: its standard streams as in-memory files, their reading cut at
the output limit, and the wait for its end. A module of its own so the
standard tier (``runner``) and the gVisor tier (``gvisor``) share them
without importing each other.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from dataclasses import dataclass, field
from typing import IO, Any


@dataclass(frozen=True, slots=True)
class Result:
    """How a sandboxed command ended. ``exit_code`` is negative for a signal
    (``-9``: killed, as at the timeout); ``timed_out`` says the wall clock
    ended it; ``oom_killed`` that the kernel killed a process of it for
    going over ``Limits.memory_bytes`` (the command itself, or one of its
    children); outputs are cut at ``Limits.output_bytes`` (``truncated``);
    ``degraded`` names controls it ran without; ``refused`` lists the egress
    proxy's refusals; ``warm`` that a sandbox launched ahead ran it
    (``pool.Pool``)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    truncated: bool = False
    degraded: tuple[str, ...] = ()
    refused: tuple[str, ...] = field(default_factory=tuple)
    oom_killed: bool = False
    warm: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
                "timed_out": self.timed_out, "oom_killed": self.oom_killed, "seconds": round(self.seconds, 3),
                "truncated": self.truncated, "degraded": list(self.degraded), "refused": list(self.refused),
                "warm": self.warm}


def memory_file(name: str) -> IO[bytes]:
    """An anonymous in-memory file for one of the command's standard
    streams: a file, not a pipe, so a command that writes much never blocks
    on a reader; in memory (``memfd``), since a temporary file on the
    worker's disk cost milliseconds a launch on a busy machine (the
    filesystem's journal). What the sandbox writes to it is charged to the
    sandbox's memory cgroup and capped by its ``file_bytes`` rlimit."""
    return open(os.memfd_create(f"cairn-sandbox-{name}", os.MFD_CLOEXEC), "w+b")


def read_output(file: IO[bytes], limit: int) -> tuple[str, bool]:
    file.seek(0)
    data = file.read(limit + 1)
    return data[:limit].decode("utf-8", "replace"), len(data) > limit


def exited(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until the process exits or ``timeout`` passes; whether it exited.
    A pidfd wakes this thread the moment it exits: ``Popen.wait(timeout=)``
    polls with sleeps growing to 50 ms, which was most of a launch's cost."""
    try:
        fd = os.pidfd_open(process.pid)
    except OSError:  # a kernel before 5.3
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                if poller.poll(left * 1000):
                    return True
            except InterruptedError:
                continue
    finally:
        os.close(fd)


__all__ = ["Result", "exited", "memory_file", "read_output"]
