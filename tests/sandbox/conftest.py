"""Fixtures of the sandbox's escape tests: workspaces in the test's own
temporary directory, and host-side listeners that count who reached them.

These tests need the host's controls (bubblewrap, user namespaces, a pids
cgroup, libseccomp): CI installs bubblewrap (.ci/run). Where one is
missing they fail with the control's name, never skip: a sandbox test that
did not run is not a sandbox that held.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.sandbox import check


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace of the test's own, on a host checked to have every control."""
    missing = [f"{c.name}: {c.detail}" for c in check() if not c.available]
    if missing:
        pytest.fail("the sandbox's controls are missing on this host: " + "; ".join(missing))
    path = tmp_path / "workspace"
    path.mkdir()
    return path


class Listener:
    """A TCP listener on the host's 127.0.0.1 that counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


class UdpListener:
    """A UDP socket on the host's 127.0.0.1 that counts datagrams (a stand-in resolver)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]

    def received(self) -> int:
        count = 0
        while True:
            try:
                self.sock.recvfrom(4096)
            except (TimeoutError, OSError):
                return count
            count += 1


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    yield found
    found.close()


@pytest.fixture
def udp_listener() -> Iterator[UdpListener]:
    found = UdpListener()
    yield found
    found.sock.close()
