"""The seccomp filter every sandboxed process runs under, as the classic-BPF
program ``bwrap --seccomp FD`` loads.

Built with libseccomp through ``pyseccomp`` (the ``sandbox`` extra, a ctypes
binding: nothing to compile): libseccomp gets the architecture checks right
(an i386 ``int 0x80`` or an x32 syscall number on x86-64 would otherwise
reach the kernel under another number than the one filtered), which a
hand-written program easily gets wrong. The default is to allow; what is
denied (``EPERM``, so a program sees an ordinary refusal) is what reaches
the kernel's attack surface or another process, not what ordinary build
and test commands use:

* ``ptrace`` and cross-process memory access;
* ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*`` (whose
  operations bypass seccomp);
* ``mount`` and friends, ``pivot_root``, ``chroot``, ``setns``;
* new user namespaces (``clone``/``unshare`` with ``CLONE_NEWUSER``;
  ``clone3`` answers ``ENOSYS`` since its flags are out of a filter's
  reach, and libc falls back to ``clone``): on top of ``--disable-userns``;
* the kernel keyring (``keyctl``, ``add_key``, ``request_key``);
* module loading, ``kexec``, ``reboot``, swap, ``syslog``,
  ``open_by_handle_at``/``name_to_handle_at``;
* sockets of family ``AF_NETLINK`` and ``AF_PACKET`` always, and
  ``AF_UNIX`` unless egress is on (the in-sandbox bridge must reach the
  proxy's socket; see docs/sandbox.md for why that stays contained).

A filter is built once per process and kind (``filter_bytes``): launches
copy the bytes into a pipe.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from typing import Any

from cairn.errors import MissingExtra

#: clone/unshare flag of a new user namespace (linux/sched.h)
CLONE_NEWUSER = 0x10000000
AF_UNIX, AF_NETLINK, AF_PACKET = 1, 16, 17

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "mount", "umount2", "pivot_root", "chroot", "setns", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr",
    "keyctl", "add_key", "request_key",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "syslog", "open_by_handle_at", "name_to_handle_at", "acct", "quotactl",
    "lookup_dcookie", "vhangup",
)


def _load() -> Any:
    try:
        import pyseccomp  # type: ignore[import-untyped]  # no stubs: a single ctypes module
    except ImportError:
        raise MissingExtra("the sandbox's seccomp filter", "sandbox") from None
    except RuntimeError as exc:  # pyseccomp raises this when libseccomp.so is missing
        raise MissingExtra(f"the sandbox's seccomp filter ({exc}: install libseccomp2)", "sandbox") from None
    return pyseccomp


def available() -> str | None:
    """Why no filter can be built here, or ``None``."""
    try:
        filter_bytes(unix_sockets=False)
    except (MissingExtra, OSError) as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=2)
def filter_bytes(*, unix_sockets: bool) -> bytes:
    """The BPF program (``struct sock_filter`` array) of the filter."""
    sc = _load()
    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED:
        try:
            f.add_rule(deny, name)
        except (ValueError, OSError):  # a syscall this kernel/libseccomp does not know: nothing to deny
            continue
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(deny, "unshare", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    families = [AF_NETLINK, AF_PACKET] + ([] if unix_sockets else [AF_UNIX])
    for family in families:
        # the kernel reads the family as an int: compare the low 32 bits only, or a family
        # with high bits set (0x1_00000001) would pass the filter and still open AF_UNIX
        f.add_rule(deny, "socket", sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, family))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def filter_fd(*, unix_sockets: bool) -> int:
    """A pipe's read end holding the filter (for ``bwrap --seccomp``); the
    caller passes it to the child and closes it."""
    program = filter_bytes(unix_sockets=unix_sockets)
    read, write = os.pipe()
    try:
        # a program is a few hundred bytes: far below a pipe's buffer, so this never blocks
        os.write(write, program)
    finally:
        os.close(write)
    return read


__all__ = ["DENIED", "available", "filter_bytes", "filter_fd"]
