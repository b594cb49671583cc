"""What a sandboxed command may use: resource limits, the egress allowlist,
and which missing host controls the caller accepts running without.

Plain frozen values, checked when built, so a bad policy fails where it is
written (one-line ``InvalidArgument``), not inside a worker mid-run.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from cairn.errors import InvalidArgument

#: the controls a host may lack, which ``allow_degraded`` may name (``controls.CONTROLS`` checks them)
DEGRADABLE = frozenset({"seccomp", "processes", "memory"})
#: the isolation tiers: bubblewrap (``runner``) and gVisor's ``runsc`` where installed (``gvisor``)
TIERS = ("standard", "gvisor")

#: a hostname the proxy accepts: lowercase LDH labels, no trailing dot (see ``check_hostname``)
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")

Resolver = Callable[[str, int], Sequence[str]]


def check_hostname(host: str) -> str | None:
    """Why ``host`` is refused as a destination, or ``None``. Strict on
    purpose: one spelling per name, so an allowlist compare cannot be
    dodged by case, a trailing dot, escapes or an address in disguise
    (``0x7f.1``, ``2130706433``: what ``inet_aton`` accepts is an address)."""
    if not host:
        return "empty hostname"
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in host):
        return "hostname has a control, space or non-ASCII character"
    if host != host.lower():
        return "hostname is not lowercase"
    if len(host) > 253:
        return "hostname is longer than 253 characters"
    if host.startswith("[") or ":" in host:
        return "raw IP addresses are refused"
    try:
        socket.inet_aton(host)
    except OSError:
        pass
    else:
        return "raw IP addresses are refused"
    labels = host.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return "hostname is not dot-separated letters, digits and hyphens"
    if labels[-1].isdigit():
        return "raw IP addresses are refused"
    return None


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-sandbox resource limits. ``processes`` (a ``pids`` cgroup) and
    ``memory_bytes`` (a ``memory`` cgroup: RAM and swap of all its processes
    together, the kernel's OOM killer acting inside it; and each process's
    address space, so one big allocation fails with ``ENOMEM`` first) hold
    for the whole sandbox. ``file_bytes`` (largest file written),
    ``cpu_seconds`` (per process) and ``open_files`` are rlimits; the shell
    that sets them rounds ``memory_bytes`` down to KiB and ``file_bytes`` to
    512 bytes. ``tmp_bytes`` caps the private ``/tmp``; ``wall_seconds``
    ends the whole sandbox; ``output_bytes`` is how much of stdout and
    stderr each is kept."""

    processes: int = 64
    memory_bytes: int = 1 << 30
    file_bytes: int = 256 << 20
    cpu_seconds: int = 60
    open_files: int = 256
    tmp_bytes: int = 64 << 20
    wall_seconds: float = 120.0
    output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("processes", "memory_bytes", "file_bytes", "cpu_seconds", "open_files", "tmp_bytes",
                     "output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"sandbox limit {name} must be a positive integer, not {value!r}")
        if not isinstance(self.wall_seconds, (int, float)) or not self.wall_seconds > 0:
            raise InvalidArgument(f"sandbox limit wall_seconds must be > 0, not {self.wall_seconds!r}")


@dataclass(frozen=True, slots=True)
class Egress:
    """Outbound HTTP(S) through the host-side proxy (``egress.Proxy``), to
    these hosts only: ``"api.example.com"`` (exactly) or ``"*.example.com"``
    (its subdomains), on ``ports``. Addresses that are not globally routable
    (private, loopback, link-local, ...) are refused after resolution unless
    inside ``allow_networks`` (an operator's explicit exception, such as an
    internal mirror). ``resolver(host, port)`` returns addresses; the
    default is the host's own DNS (``getaddrinfo``)."""

    hosts: tuple[str, ...]
    ports: tuple[int, ...] = (80, 443)
    allow_networks: tuple[str, ...] = ()
    resolver: Resolver | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for entry in self.hosts:
            if not isinstance(entry, str):
                raise InvalidArgument(f"egress host {entry!r} is not a string")
            name = entry[2:] if entry.startswith("*.") else entry
            problem = check_hostname(name)
            if problem is not None:
                raise InvalidArgument(f"egress host {entry!r}: {problem}")
        for port in self.ports:
            if not isinstance(port, int) or not 0 < port < 65536:
                raise InvalidArgument(f"egress port {port!r} is not 1..65535")
        for net in self.allow_networks:
            try:
                ipaddress.ip_network(net)
            except ValueError as exc:
                raise InvalidArgument(f"egress allow_networks: {exc}") from None

    def allows_host(self, host: str) -> bool:
        for entry in self.hosts:
            if entry.startswith("*.") and host.endswith(entry[1:]) and len(host) > len(entry) - 1:
                return True
            if host == entry:
                return True
        return False


@dataclass(frozen=True, slots=True)
class Policy:
    """A sandbox's limits, its network (``egress=None``: none at all) and the
    controls it may run without where the host lacks them (``allow_degraded``:
    names from ``DEGRADABLE``; anything else missing refuses to start).
    ``tier``: ``"standard"`` (bubblewrap) or ``"gvisor"`` (``runsc``, a
    user-space kernel; no egress yet, and never a fallback to bubblewrap)."""

    limits: Limits = Limits()
    egress: Egress | None = None
    allow_degraded: Collection[str] = frozenset()
    tier: str = "standard"

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise InvalidArgument(f"sandbox tier {self.tier!r} is not one of {list(TIERS)}")
        if self.tier == "gvisor" and self.egress is not None:
            raise InvalidArgument("sandbox tier 'gvisor' does not support egress (use tier='standard')")
        if isinstance(self.allow_degraded, str):
            raise InvalidArgument("allow_degraded is a set of control names, not a string")
        object.__setattr__(self, "allow_degraded", frozenset(self.allow_degraded))  # a set or list is fine
        unknown = set(self.allow_degraded) - DEGRADABLE
        if unknown:
            raise InvalidArgument(f"allow_degraded names unknown controls {sorted(unknown)} "
                                  f"(known: {sorted(DEGRADABLE)})")


__all__ = ["DEGRADABLE", "TIERS", "Egress", "Limits", "Policy", "Resolver", "check_hostname"]
