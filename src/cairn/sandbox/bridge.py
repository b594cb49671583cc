"""The sandbox's side of egress: a relay from ``127.0.0.1:PORT`` (inside
the sandbox's own network namespace) to the proxy's bind-mounted Unix
socket, so ordinary clients find the proxy through ``HTTP(S)_PROXY``.

``SCRIPT`` runs as the sandbox's first process (the system's
``python3 -I -S``, standard library only: Cairn is not inside): it binds
the port, forks the relay, then execs the command. The relay has no
privilege the command lacks (same uid, same seccomp filter), so a command
that kills or imitates it gains nothing; it dies with the sandbox.
"""

from __future__ import annotations

from cairn.sandbox.bwrap import PROXY_SOCKET

PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PORT}"
#: the proxy variables clients read (both spellings: curl reads lowercase ``http_proxy`` only)
PROXY_ENV = {name: PROXY_URL for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                                          "ALL_PROXY", "all_proxy")}

SCRIPT = f"""
import os, socket, sys, threading
listener = socket.socket()
listener.bind(("127.0.0.1", {PORT}))
listener.listen(64)
def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def relay(client):
    upstream = socket.socket(socket.AF_UNIX)
    try:
        upstream.connect({PROXY_SOCKET!r})
    except OSError:
        client.close()
        return
    try:
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
    except RuntimeError:  # no thread left (the sandbox's process limit): this connection only fails
        client.close()
        upstream.close()
        return
    pump(client, upstream)
if os.fork() == 0:
    os.setsid()
    while True:
        client, _ = listener.accept()
        try:
            threading.Thread(target=relay, args=(client,), daemon=True).start()
        except RuntimeError:
            client.close()
listener.close()
os.execvp(sys.argv[1], sys.argv[1:])
"""


def wrap(argv: list[str], python: str) -> list[str]:
    """``argv`` started behind the relay."""
    return [python, "-I", "-S", "-c", SCRIPT, *argv]


__all__ = ["PORT", "PROXY_ENV", "PROXY_URL", "SCRIPT", "wrap"]
