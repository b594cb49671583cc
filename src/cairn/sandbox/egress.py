"""The host-side egress proxy: the only way out of a sandbox, and only to
the policy's hosts (``policy.Egress``).

It listens on a Unix socket that is bind-mounted into the sandbox (the
sandbox has no network interface but its own loopback; ``bridge`` relays
its ``127.0.0.1`` proxy port to that socket). Each connection carries one
request, ``CONNECT host:port`` (a tunnel, for HTTPS) or a plain-HTTP
request in absolute form (``GET http://host/path``), and is checked the
same way either way, before any byte goes out:

* the hostname is spelled canonically (``policy.check_hostname``: no raw
  IPs in any notation, no NUL or control bytes, lowercase only, no
  trailing dot) and is on the allowlist, and the port is allowed;
* for plain HTTP the ``Host`` header names that same host (no smuggling a
  second destination past the check);
* DNS is resolved here, on the host (the sandbox has no resolver), and
  every address must be globally routable (not private, loopback,
  link-local, multicast or reserved; IPv4-mapped IPv6 is unwrapped) unless
  inside ``allow_networks``; the connection goes to the address checked,
  never to a name resolved again (no DNS rebinding in between).

After the check the bytes are relayed as they are: a request pipelined
after the first, or a ``CONNECT`` sent inside a tunnel, goes to the same
checked address and nowhere else, so a "relayed CONNECT" reaches only the
upstream the policy allowed. A refusal is answered ``403`` with the reason
and recorded (``refusals``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import tempfile
import threading
from pathlib import Path

from cairn.sandbox.policy import Egress, check_hostname

#: the most a request head may take before it is refused
MAX_HEAD = 16 * 1024
#: seconds a client has to send its request head, and an upstream to accept
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
#: connections one sandbox may hold open through its proxy at once (each is a thread here)
MAX_CONNECTIONS = 64

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """A request the policy does not allow (its message is the reason)."""


def _resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _routable(address: _Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


class Decision:
    """Where one checked request goes: the address and port to connect to."""

    __slots__ = ("address", "host", "port")

    def __init__(self, host: str, port: int, address: str) -> None:
        self.host, self.port, self.address = host, port, address


def decide(policy: Egress, host: str, port: int) -> Decision:
    """Check a destination against the policy and resolve it (``Refused``)."""
    problem = check_hostname(host)
    if problem is not None:
        raise Refused(f"{problem}: {host!r}")
    if not policy.allows_host(host):
        raise Refused(f"host {host!r} is not on the allowlist")
    if port not in policy.ports:
        raise Refused(f"port {port} is not allowed")
    resolver = policy.resolver or _resolve
    try:
        found = list(resolver(host, port))
    except OSError as exc:
        raise Refused(f"cannot resolve {host!r}: {exc}") from None
    if not found:
        raise Refused(f"{host!r} has no address")
    exceptions = [ipaddress.ip_network(n) for n in policy.allow_networks]
    for text in found:
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if not _routable(address) and not any(address in net for net in exceptions):
            # one bad address refuses the name: a resolver answering a mix is not to be trusted
            raise Refused(f"{host!r} resolves to {address}, which is not a public address")
    return Decision(host, port, found[0])


def _split_authority(authority: str, default_port: int) -> tuple[str, int]:
    host, sep, port_text = authority.rpartition(":")
    if not sep:
        return authority, default_port
    if not port_text.isdigit() or len(port_text) > 5:
        raise Refused(f"bad port in {authority!r}")
    return host, int(port_text)


def parse_head(head: bytes) -> tuple[str, str, int, bytes]:
    """The method, the authority's host and port, and the head to send
    upstream of a request head (``Refused`` if malformed). Pure, so the
    parsing is tested without sockets; ``decide`` is applied by the caller."""
    if any(b < 0x20 and b not in (0x0D, 0x0A, 0x09) for b in head) or any(b > 0x7E for b in head):
        raise Refused("the request has NUL, control or non-ASCII bytes")
    lines = head.decode("ascii").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(f"not an HTTP/1 request line: {lines[0][:100]!r}")
    method, target, version = parts
    headers = [line for line in lines[1:] if line]
    if method == "CONNECT":
        host, port = _split_authority(target, 443)
        return method, host, port, b""
    if not target.startswith("http://"):
        raise Refused("plain HTTP requests must use an absolute http:// URL (origin-form is refused)")
    rest = target[len("http://"):]
    authority, _, path = rest.partition("/")
    if "@" in authority or not authority:
        raise Refused(f"bad authority in {target[:100]!r}")
    host, port = _split_authority(authority, 80)
    kept = []
    for line in headers:
        name, colon, value = line.partition(":")
        if not colon:
            raise Refused(f"malformed header line {line[:100]!r}")
        lowered = name.strip().lower()
        if lowered == "host" and value.strip() != authority:
            raise Refused(f"Host header {value.strip()[:100]!r} differs from the URL's {authority!r}")
        if lowered.startswith("proxy-") or lowered == "connection":
            continue
        kept.append(line)
    upstream = [f"{method} /{path} {version}", *kept, "Connection: close", "", ""]
    return method, host, port, "\r\n".join(upstream).encode("ascii")


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class Proxy:
    """One sandbox's proxy: a Unix socket in a private directory, served by
    threads until ``close``."""

    def __init__(self, policy: Egress, *, owner: int | None = None) -> None:
        self.policy = policy
        self.refusals: list[str] = []
        self._dir = Path(tempfile.mkdtemp(prefix="cairn-egress-"))
        self.path = str(self._dir / "proxy.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        os.chmod(self.path, 0o666)
        if owner is not None:
            os.chown(self.path, owner, owner)
        self._server.listen(64)
        self._closed = False
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._thread = threading.Thread(target=self._serve, name="cairn-egress", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):  # a sandbox may not exhaust the worker's threads
                self.refusals.append(f"more than {MAX_CONNECTIONS} connections at once")
                client.close()
                continue
            threading.Thread(target=self._serve_one, args=(client,), name="cairn-egress-conn",
                             daemon=True).start()

    def _serve_one(self, client: socket.socket) -> None:
        try:
            self._handle(client)
        finally:
            self._slots.release()

    def _read_head(self, client: socket.socket) -> tuple[bytes, bytes]:
        client.settimeout(HEAD_TIMEOUT)
        data = b""
        while b"\r\n\r\n" not in data:
            if len(data) > MAX_HEAD:
                raise Refused("request head too large")
            chunk = client.recv(4096)
            if not chunk:
                raise Refused("connection closed before a complete request head")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        client.settimeout(None)
        return head, rest

    def _handle(self, client: socket.socket) -> None:
        with client:
            try:
                head, rest = self._read_head(client)
                method, host, port, upstream_head = parse_head(head)
                decision = decide(self.policy, host, port)
                try:
                    upstream = socket.create_connection((decision.address, decision.port), CONNECT_TIMEOUT)
                except OSError as exc:
                    client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                    self.refusals.append(f"cannot connect to {host}:{port}: {exc}")
                    return
            except (Refused, OSError, UnicodeDecodeError) as exc:
                reason = str(exc).replace("\r", " ").replace("\n", " ")[:300]
                self.refusals.append(reason)
                body = f"refused by the sandbox's egress policy: {reason}\n".encode("ascii", "replace")
                with contextlib.suppress(OSError):
                    client.sendall(b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Type: text/plain"
                                   b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                return
            with upstream:
                if method == "CONNECT":
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    upstream.sendall(upstream_head)
                if rest:
                    upstream.sendall(rest)
                back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
                back.start()
                _pump(client, upstream)
                back.join()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self._dir.rmdir()


__all__ = ["Decision", "Proxy", "Refused", "decide", "parse_head"]
