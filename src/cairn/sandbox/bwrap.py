"""The ``bwrap`` command line of one sandbox (a pure function of what it
needs, so the flags are read and tested in one place).

The sandbox sees: the system directories read-only (``SYSTEM``, part of
``/etc``), its own
``/proc`` (a new PID namespace: only its own processes), a minimal ``/dev``,
a size-capped ``/tmp``, the workspace at ``/workspace`` (the one writable
place that outlives it) and, with egress, the proxy's socket. Not the
host's ``/home``, ``/root``, ``/run``, ``/var``, ``/tmp`` or the worker's
own directories: what is not bound does not exist in there. The root is
remounted read-only last, so nothing can be written beside the binds.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: read-only system directories (those the host has); a top-level symlink (``/bin -> usr/bin``) is kept one
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: what of ``/etc`` programs need (names, libraries, certificates, alternatives), read-only. Not all of
#: it: outside their user namespace the sandbox's processes are this process's user, so as root they
#: would read root's own 0600 files (``/etc/shadow``, ``/etc/ssl/private``, tokens in ``pip.conf``)
ETC = ("passwd", "group", "hosts", "host.conf", "nsswitch.conf", "gai.conf", "protocols", "services",
       "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives", "ssl/certs",
       "ca-certificates", "os-release", "debian_version", "mime.types", "profile", "bash.bashrc",
       "inputrc", "python3", "python3.11", "python3.12", "python3.13", "terminfo", "magic", "mtab")
#: where the workspace and the proxy's socket appear inside
WORKSPACE = "/workspace"
PROXY_SOCKET = "/run/cairn-egress.sock"
#: the uid and gid the sandboxed processes see (not root)
INNER_UID = 1000
#: the environment every sandboxed command starts from (nothing of the worker's)
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}


@dataclass(frozen=True, slots=True)
class Spec:
    workspace: str
    argv: Sequence[str]
    env: Mapping[str, str]
    tmp_bytes: int
    seccomp_fd: int | None = None
    proxy_socket: str | None = None
    info_fd: int | None = None


@functools.lru_cache(maxsize=1)
def etc_view() -> str:
    """A copy of ``ETC`` made once per process (symlinks kept as symlinks),
    bound as the sandbox's ``/etc`` in one mount: binding its ~30 entries
    one by one took a third of a launch. A change to the host's ``/etc``
    after the first launch is not seen by later sandboxes of this process."""
    view = tempfile.mkdtemp(prefix="cairn-sandbox-etc-")
    atexit.register(shutil.rmtree, view, ignore_errors=True)
    for name in ETC:
        source, target = os.path.join("/etc", name), os.path.join(view, name)
        if not os.path.lexists(source):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
    os.chmod(view, 0o755)
    return view


def system_binds() -> list[str]:
    args: list[str] = []
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return [*args, "--ro-bind", etc_view(), "/etc"]


def command(spec: Spec, bwrap: str = "bwrap") -> list[str]:
    args = [
        bwrap,
        "--unshare-all", "--unshare-user",  # as root --unshare-all keeps the user namespace: ask for it
        "--disable-userns",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--uid", str(INNER_UID), "--gid", str(INNER_UID), "--hostname", "sandbox",
        *system_binds(),
        "--proc", "/proc", "--dev", "/dev",
        "--perms", "1777", "--size", str(spec.tmp_bytes), "--tmpfs", "/tmp",
        "--bind", spec.workspace, WORKSPACE,
    ]
    if spec.proxy_socket is not None:
        args += ["--ro-bind", spec.proxy_socket, PROXY_SOCKET]
    args += ["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]
    for key, value in {**BASE_ENV, **spec.env}.items():
        args += ["--setenv", key, value]
    if spec.seccomp_fd is not None:
        args += ["--seccomp", str(spec.seccomp_fd)]
    if spec.info_fd is not None:
        args += ["--info-fd", str(spec.info_fd)]
    return [*args, "--", *spec.argv]


__all__ = ["BASE_ENV", "INNER_UID", "PROXY_SOCKET", "SYSTEM", "WORKSPACE", "Spec", "command"]
