"""The first process of a sandbox: a ``/bin/sh`` that moves itself into
the sandbox's cgroups, sets its rlimits, and execs bwrap, so bwrap and
everything it starts are counted and limited from their first instruction.

Why a shell and not ``prlimit``: ``ulimit`` is a builtin, so the limits
cost no extra process (``prlimit`` was one more exec, ~4 ms of a launch
on a loaded machine). Its units are the shell's: address space in KiB
and file size in 512-byte blocks (POSIX), so both are rounded *down*
(never a weaker limit). ``verify`` runs the launcher once and reads the
limits back from ``/proc/self/limits``, so a shell with other units is a
missing control, not a silently different limit.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from cairn.sandbox.policy import Limits

SHELL = "/bin/sh"
#: the launcher's ``$0`` (what ``ps`` shows until it execs bwrap)
NAME = "cairn-sandbox"


def rlimits(limits: Limits) -> dict[str, int]:
    """The limits as ``/proc/self/limits`` will show them (soft = hard), in bytes or counts."""
    return {"Max address space": limits.memory_bytes // 1024 * 1024,
            "Max file size": limits.file_bytes // 512 * 512,
            "Max cpu time": limits.cpu_seconds,
            "Max open files": limits.open_files,
            "Max core file size": 0}


def command(joins: Sequence[str], limits: Limits, argv: Sequence[str]) -> list[str]:
    """The launcher's argv: write ``0`` to each file of ``joins`` (a
    cgroup's ``tasks``/``cgroup.procs``: the writer moves itself), set the
    rlimits (soft and hard: ``ulimit`` without ``-S``/``-H`` sets both),
    then exec ``argv``. Paths travel as arguments, never inside the script."""
    steps = [f'echo 0 > "${i}"' for i in range(1, len(joins) + 1)]
    steps += [f"ulimit -v {limits.memory_bytes // 1024}", f"ulimit -f {limits.file_bytes // 512}",
              f"ulimit -t {limits.cpu_seconds}", f"ulimit -n {limits.open_files}", "ulimit -c 0"]
    if joins:
        steps.append(f"shift {len(joins)}")
    steps.append('exec "$@"')
    return [SHELL, "-c", " && ".join(steps), NAME, *joins, *argv]


def verify() -> str | None:
    """Why the launcher cannot set the rlimits exactly here, or ``None``:
    it is run once with odd limits and the child's ``/proc/self/limits`` is
    compared with ``rlimits``."""
    probe = Limits(memory_bytes=(1 << 30) + 1536, file_bytes=(4 << 20) + 700, cpu_seconds=61,
                   open_files=255)
    try:
        done = subprocess.run(command([], probe, ["/bin/cat", "/proc/self/limits"]), capture_output=True,
                              text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run {SHELL}: {exc}"
    if done.returncode != 0:
        return f"{SHELL} could not set the limits: {done.stderr.strip() or done.returncode}"
    seen: dict[str, tuple[str, str]] = {}
    for line in done.stdout.splitlines():
        name, fields = line[:26].strip(), line[26:].split()
        if len(fields) >= 2:
            seen[name] = (fields[0], fields[1])
    for name, value in rlimits(probe).items():
        if seen.get(name) != (str(value), str(value)):
            return f"{SHELL}'s ulimit set {name.lower()} to {seen.get(name)}, not {value}"
    return None


__all__ = ["SHELL", "command", "rlimits", "verify"]
