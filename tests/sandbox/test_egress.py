"""The egress proxy: what it lets out and what it refuses, in the parser
and checks (no process) and end to end from inside a sandbox.

End to end, ``allowed.test`` is the only allowed host; the test's resolver
maps it to the host's 127.0.0.1 where a real HTTP server answers, and the
policy's ``allow_networks`` makes that one loopback address an explicit
exception (without it the name is refused: ``test_private_resolution``).
A second listener on 127.0.0.1 stands for everything else on the host: it
must see no connection whatever the request says.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cairn.errors import InvalidArgument
from cairn.sandbox import Egress, Limits, Policy, run_python
from cairn.sandbox.egress import Refused, decide, parse_head
from cairn.sandbox.policy import check_hostname
from tests.sandbox.conftest import Listener


def resolver(host: str, port: int) -> Sequence[str]:
    table = {"allowed.test": ["127.0.0.1"], "public.test": ["93.184.215.14"],
             "mixed.test": ["93.184.215.14", "10.0.0.7"], "metadata.test": ["169.254.169.254"],
             "mapped.test": ["::ffff:127.0.0.1"]}
    if host not in table:
        raise OSError("no such name")
    return table[host]


ALL = ("allowed.test", "public.test", "mixed.test", "metadata.test", "mapped.test")


@pytest.mark.parametrize("host", ["127.0.0.1", "0x7f000001", "2130706433", "0177.0.0.1", "127.1", "[::1]",
                                  "::1", "Allowed.test", "ALLOWED.TEST", "allowed.test.",
                                  "allowed.test\0.evil", "allowed test", "allowed.tést", "", "-bad.test",
                                  "a..test", "user@allowed.test"])
def test_hostnames_in_disguise_are_refused(host: str) -> None:
    assert check_hostname(host) is not None
    if host.lower() != host and host.isascii() and "\0" not in host:
        assert check_hostname(host) == "hostname is not lowercase"
    with pytest.raises(Refused):
        decide(Egress(hosts=ALL, resolver=resolver, allow_networks=("127.0.0.0/8",)), host, 80)


def test_private_resolution_is_refused_after_dns() -> None:
    policy = Egress(hosts=ALL, resolver=resolver)
    assert decide(policy, "public.test", 443).address == "93.184.215.14"
    for host, why in (("allowed.test", "127.0.0.1"), ("mixed.test", "10.0.0.7"),
                      ("metadata.test", "169.254.169.254"), ("mapped.test", "::ffff:7f00:1")):
        with pytest.raises(Refused, match=why.replace(".", r"\.")):
            decide(policy, host, 443)
    with pytest.raises(Refused, match="allowlist"):
        decide(policy, "other.test", 443)
    with pytest.raises(Refused, match="port"):
        decide(policy, "public.test", 22)


def test_wildcards_match_subdomains_only() -> None:
    policy = Egress(hosts=("*.example.com",))
    assert policy.allows_host("api.example.com")
    assert policy.allows_host("a.b.example.com")
    assert not policy.allows_host("example.com")
    assert not policy.allows_host("evilexample.com")


def test_a_bad_policy_is_refused_where_written() -> None:
    for bad in ({"hosts": ("Example.com",)}, {"hosts": ("10.0.0.1",)}, {"hosts": ("a.test",), "ports": (0,)},
                {"hosts": ("a.test",), "allow_networks": ("not-a-net",)}):
        with pytest.raises(InvalidArgument):
            Egress(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unknown controls"):
        Policy(allow_degraded=frozenset({"namespaces"}))


@pytest.mark.parametrize("head", [
    b"GET / HTTP/1.1\r\nHost: allowed.test",                                  # origin-form: no checked host
    b"GET http://allowed.test/ HTTP/1.1\r\nHost: 127.0.0.1:5432",               # smuggled second destination
    b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\0",              # NUL in a header
    b"CONNECT allowed.test:443 HTTP/1.1\r\nX: \x80",                           # non-ASCII
    b"GET http://user@allowed.test/ HTTP/1.1",                                 # userinfo
    b"GET http://allowed.test/ HTTP/2",                                        # not HTTP/1
    b"GET http://allowed.test:99999999/ HTTP/1.1",                             # bad port
])
def test_malformed_or_smuggling_heads_are_refused(head: bytes) -> None:
    with pytest.raises(Refused):
        parse_head(head)


def test_plain_http_is_rewritten_to_one_request() -> None:
    method, host, port, upstream = parse_head(
        b"GET http://allowed.test:8080/a?b=1 HTTP/1.1\r\nHost: allowed.test:8080\r\n"
        b"Proxy-Authorization: x\r\n"
        b"Connection: keep-alive")
    assert (method, host, port) == ("GET", "allowed.test", 8080)
    assert upstream == (b"GET /a?b=1 HTTP/1.1\r\nHost: allowed.test:8080\r\nConnection: close\r\n\r\n")


# -- end to end ----------------------------------------------------------------------------------


class Upstream:
    """The allowed host: an HTTP server on 127.0.0.1 recording what reached it."""

    def __init__(self) -> None:
        seen: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(f"GET {self.path}")
                body = b"upstream says hi"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.seen = seen
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    found = Upstream()
    yield found
    found.server.shutdown()
    found.server.server_close()


ATTACKS = r'''
import json, socket
seen = {}
def ask(name, data, then=None):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(data)
    answer = s.recv(4096)
    if then is not None and answer.startswith(b"HTTP/1.1 200"):
        s.sendall(then)
        answer += b" | tunnel: " + s.recv(4096)
    seen[name] = answer.decode("latin-1").split("\r\n")[0] + (" | tunnel" if b"tunnel" in answer else "")
    s.close()
UP, BAD = %d, %d
ask("allowed", b"GET http://allowed.test:%%d/ok HTTP/1.1\r\nHost: allowed.test:%%d\r\n\r\n" %% (UP, UP))
ask("relayed-connect", b"CONNECT allowed.test:%%d HTTP/1.1\r\n\r\n" %% UP,
    b"CONNECT 127.0.0.1:%%d HTTP/1.1\r\n\r\n" %% BAD)
ask("pipelined-connect",
    b"CONNECT allowed.test:%%d HTTP/1.1\r\n\r\nCONNECT 127.0.0.1:%%d HTTP/1.1\r\n\r\n" %% (UP, BAD))
ask("raw-ip", b"CONNECT 127.0.0.1:%%d HTTP/1.1\r\n\r\n" %% BAD)
ask("raw-ip-hex", b"GET http://0x7f000001:%%d/ HTTP/1.1\r\n\r\n" %% BAD)
ask("nul", b"CONNECT allowed.test\0.evil:%%d HTTP/1.1\r\n\r\n" %% BAD)
ask("mixed-case", b"CONNECT Allowed.Test:%%d HTTP/1.1\r\n\r\n" %% UP)
ask("host-header", b"GET http://allowed.test:%%d/ HTTP/1.1\r\nHost: 127.0.0.1:%%d\r\n\r\n" %% (UP, BAD))
ask("not-listed", b"CONNECT localhost:%%d HTTP/1.1\r\n\r\n" %% BAD)
import urllib.request
via = urllib.request.urlopen("http://allowed.test:%%d/via-urllib" %% UP, timeout=10)
seen["urllib"] = via.read().decode()
print(json.dumps(seen))
'''


@pytest.mark.slow
def test_egress_from_a_sandbox(ws: Path, upstream: Upstream, listener: Listener) -> None:
    policy = Policy(egress=Egress(hosts=("allowed.test",), ports=(upstream.port, listener.port),
                                  resolver=resolver, allow_networks=("127.0.0.1/32",)))
    result = run_python(ATTACKS % (upstream.port, listener.port), ws, policy)
    assert result.exit_code == 0, result
    seen = json.loads(result.stdout)
    assert seen["allowed"] == "HTTP/1.0 200 OK"
    assert seen["urllib"] == "upstream says hi"
    # the tunnel's inner CONNECT went to the allowed upstream (which answered it), never to the listener
    assert seen["relayed-connect"].startswith("HTTP/1.1 200")
    assert seen["relayed-connect"].endswith("tunnel")
    assert seen["pipelined-connect"].startswith("HTTP/1.1 200")
    for name in ("raw-ip", "raw-ip-hex", "nul", "mixed-case", "host-header", "not-listed"):
        assert seen[name].startswith("HTTP/1.1 403"), (name, seen[name])
    assert listener.accepted == 0
    assert upstream.seen == ["GET /ok", "GET /via-urllib"]
    assert len(result.refused) == 6


@pytest.mark.slow
def test_private_resolution_refused_from_a_sandbox(ws: Path, upstream: Upstream) -> None:
    policy = Policy(egress=Egress(hosts=("allowed.test",), ports=(upstream.port,), resolver=resolver))
    result = run_python(
        "import urllib.request, urllib.error\n"
        f"try:\n    urllib.request.urlopen('http://allowed.test:{upstream.port}/', timeout=10)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n", ws, policy)
    assert result.stdout.strip() == "403", result
    assert upstream.seen == []
    assert "127.0.0.1" in result.refused[0]


@pytest.mark.slow
def test_no_egress_means_no_proxy(ws: Path) -> None:
    result = run_python("import os, socket\nprint(os.path.exists('/run/cairn-egress.sock'))\n"
                        "try:\n    socket.create_connection(('127.0.0.1', 3128), timeout=2)\n"
                        "    print('open')\n"
                        "except OSError as e:\n    print(type(e).__name__)\n", ws)
    assert result.stdout.split() == ["False", "ConnectionRefusedError"], result


@pytest.mark.slow
def test_a_sandbox_cannot_exhaust_the_proxys_threads(ws: Path) -> None:
    # the relay inside spends two threads per connection: threads count as processes, and each
    # reserves 8 MB of address space
    policy = Policy(egress=Egress(hosts=("allowed.test",), resolver=resolver),
                    limits=Limits(processes=400, memory_bytes=8 << 30))
    result = run_python("import socket, time\n"
                        "held = [socket.create_connection(('127.0.0.1', 3128)) for _ in range(100)]\n"
                        "time.sleep(1)\nprint(len(held))\n", ws, policy)
    assert result.stdout.strip() == "100", result
    assert any(r.startswith("more than 64 connections") for r in result.refused), result.refused
