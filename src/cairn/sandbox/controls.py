"""Which of the sandbox's controls this host provides, checked once per
process: ``cairn sandbox check`` prints them, and every launch requires
them (``require``): a missing one refuses to start with a message naming
it, unless the policy's ``allow_degraded`` names it (``policy.DEGRADABLE``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from cairn.errors import CairnError
from cairn.sandbox import bwrap, cgroups, launcher, seccomp
from cairn.sandbox.policy import Policy

#: bwrap 0.8.0 is the first with --disable-userns and tmpfs --size
MIN_BWRAP = (0, 8, 0)
#: the interpreter ``run_python`` and the egress bridge use inside the sandbox
SANDBOX_PYTHON = "/usr/bin/python3"


class SandboxUnavailable(CairnError):
    """A control the sandbox needs is missing on this host (and the policy
    does not allow running without it)."""


@dataclass(frozen=True, slots=True)
class Control:
    name: str
    available: bool
    detail: str


def _bwrap() -> Control:
    path = shutil.which("bwrap")
    if path is None:
        return Control("bwrap", False, "bubblewrap is not installed (apt-get install bubblewrap)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return Control("bwrap", False, f"{path} --version failed: {exc}")
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    version = tuple(int(g) for g in found.groups()) if found else (0, 0, 0)
    if version < MIN_BWRAP:
        return Control("bwrap", False, f"{path} is {out.strip()!r}; 0.8.0 or later is needed "
                                       "(--disable-userns, tmpfs --size)")
    return Control("bwrap", True, f"{path} ({out.strip()})")


def _userns() -> Control:
    """A trivial sandbox with every namespace."""
    args = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            *bwrap.system_binds(), "--proc", "/proc", "--dev", "/dev", "/usr/bin/true"]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return Control("namespaces", False, f"cannot start bwrap: {exc}")
    if done.returncode != 0:
        return Control("namespaces", False, "user/PID/network namespaces refused: "
                                            f"{done.stderr.strip() or done.returncode}")
    return Control("namespaces", True, "user, PID, IPC, UTS, cgroup and network namespaces; nested "
                                       "user namespaces disabled")


def _cgroup(name: str, controller: str, what: str) -> Control:
    problem = cgroups.available(controller)
    where = cgroups.place(controller)
    if problem is not None or where is None:
        return Control(name, False, problem or f"no {controller} cgroup")
    version = "v2" if where.v2 else "v1"
    return Control(name, True, f"{what}: a {controller} cgroup ({version}) per sandbox, under {where.parent}")


def _rlimits() -> Control:
    problem = launcher.verify()
    if problem is not None:
        return Control("rlimits", False, problem)
    return Control("rlimits", True, f"{launcher.SHELL} ulimit: address space, file size, CPU time, open "
                                    "files, no core dumps")


def _seccomp() -> Control:
    problem = seccomp.available()
    if problem is not None:
        return Control("seccomp", False, problem)
    return Control("seccomp", True, f"libseccomp filter: {len(seccomp.DENIED)} syscalls denied, "
                                    "nested user namespaces, AF_NETLINK/AF_PACKET (AF_UNIX without egress)")


@functools.lru_cache(maxsize=1)
def check() -> tuple[Control, ...]:
    """Every control, as this host provides it (checked once per process)."""
    bwrap = _bwrap()
    found = [bwrap, _cgroup("processes", "pids", "process limit"),
             _cgroup("memory", "memory", "memory limit (RAM and swap, all processes together)"),
             _rlimits(), _seccomp()]
    if bwrap.available:
        found.insert(1, _userns())
    else:
        found.insert(1, Control("namespaces", False, "needs bwrap"))
    python = os.path.exists(SANDBOX_PYTHON)
    found.append(Control("python", python, SANDBOX_PYTHON + ("" if python else " is missing: run_python "
                                                                                 "and egress need it")))
    return tuple(found)


def require(policy: Policy, *, python: bool = False) -> frozenset[str]:
    """The controls this launch runs without (allowed by the policy); raises
    ``SandboxUnavailable`` naming the first missing one it may not."""
    degraded: set[str] = set()
    for control in check():
        if control.available or (control.name == "python" and not python):
            continue
        if control.name in policy.allow_degraded:
            degraded.add(control.name)
            continue
        raise SandboxUnavailable(f"sandbox control unavailable: {control.name} ({control.detail})")
    return frozenset(degraded)


__all__ = ["Control", "SandboxUnavailable", "check", "require"]
