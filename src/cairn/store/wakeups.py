"""Wake-ups across processes for the SQLite store: what PostgreSQL's
``LISTEN/NOTIFY`` does, with unix-domain datagram sockets.

SQLite has no way to tell another process that a row changed, and polling the
file for new runnable runs costs either latency (a long poll) or CPU (a short
one, in every idle worker). So a listening worker binds one datagram socket in
a directory that belongs to the database (``<db>.wake/``, or a short directory
under the temporary directory keyed by the database's path when that would be
too long for a socket address), and a store whose commit made a run runnable
sends one byte to every socket there. The receiving thread blocks in
``recv`` (no busy poll) and calls the worker back.

What "made a run runnable" means is decided by the database, not by a list of
methods to keep in step: each write connection carries two ``TEMP`` triggers
(``install``) on ``runs`` that mirror PostgreSQL's ``runs_notify_runnable``
(an inserted or updated run that is not running and has a ``runnable_at`` due
now). The trigger only marks the connection; the datagrams go out after the
``COMMIT`` (``SQLiteStore._write``: ``Waker.wake``), so a worker never wakes to a change it
cannot see yet, and a rolled-back write wakes nobody. Temp triggers live in
the connection, not in the schema: other programs writing the file are
unaffected, and nothing needs migrating.

Losing a datagram costs latency, never a stuck run: workers keep polling. A
socket whose worker died (SIGKILL leaves the file behind) refuses the send
and is removed by the sender. A datagram to a listener whose buffer is full
is dropped: that listener has wake-ups pending already.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("cairn.store")

#: A socket address holds 108 bytes on Linux, 104 on macOS; leave room.
_MAX_ADDRESS = 100
_SUFFIX = ".sock"

#: The triggers of one write connection: a run inserted or updated so that a
#: claim could take it (not running, runnable_at set) calls ``cairn_wake``,
#: which marks the connection if that time is due now.
TRIGGERS = (
    """CREATE TEMP TRIGGER IF NOT EXISTS cairn_wake_insert AFTER INSERT ON main.runs
       FOR EACH ROW WHEN NEW.runnable_at IS NOT NULL AND NEW.status <> 'running'
       BEGIN SELECT cairn_wake(NEW.runnable_at); END""",
    """CREATE TEMP TRIGGER IF NOT EXISTS cairn_wake_update AFTER UPDATE OF runnable_at, status ON main.runs
       FOR EACH ROW WHEN NEW.runnable_at IS NOT NULL AND NEW.status <> 'running'
       BEGIN SELECT cairn_wake(NEW.runnable_at); END""",
)


def wake_directory(db_path: Path) -> Path:
    """Where the listeners of database ``db_path`` bind their sockets. Every
    process computes the same one from the database's real path."""
    real = Path(os.path.realpath(db_path))
    beside = real.with_name(real.name + ".wake")
    if len(str(beside)) + 1 + 32 + len(_SUFFIX) <= _MAX_ADDRESS:
        return beside
    digest = hashlib.sha256(str(real).encode()).hexdigest()[:20]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"cairn-wake-{uid}-{digest}"


class Mark:
    """The ``cairn_wake`` SQL function of one connection: remembers that a
    statement of the current transaction made a run runnable by now."""

    __slots__ = ("clock", "marked")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.marked = False

    def __call__(self, runnable_at: float | None) -> None:
        # A timer set for later wakes nobody: the worker that set it tracks it,
        # the others poll. Half a second of slack covers clock reads in between.
        if runnable_at is not None and runnable_at <= self.clock() + 0.5:
            self.marked = True


class Waker:
    """Sends wake-ups to every listener of one database and binds listeners."""

    def __init__(self, db_path: Path) -> None:
        self.directory = wake_directory(db_path)
        self._lock = threading.Lock()
        self._sender: socket.socket | None = None
        self._listing: list[str] = []
        self._listed_at: int | None = None  # the directory's mtime when listed

    # -- sending -------------------------------------------------------------------

    def wake(self) -> None:
        """One datagram to every listener; never raises (a lost wake-up costs
        a poll interval, and the commit it follows is done)."""
        try:
            with self._lock:
                names = self._listeners()
                if not names:
                    return
                if self._sender is None:
                    self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sender.setblocking(False)
                sender = self._sender
                for name in names:
                    path = str(self.directory / name)
                    try:
                        sender.sendto(b"!", path)
                    except (ConnectionRefusedError, FileNotFoundError):
                        with contextlib.suppress(OSError):  # its worker is gone
                            os.unlink(path)
                        self._listed_at = None
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                            log.debug("wake-up to %s failed: %s", path, exc)
        except OSError as exc:
            log.debug("wake-ups of %s failed: %s", self.directory, exc)

    def _listeners(self) -> list[str]:
        """The socket names in the directory, listed again only when it changed."""
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            return []
        if mtime != self._listed_at:
            self._listing = [name for name in os.listdir(self.directory) if name.endswith(_SUFFIX)]
            self._listed_at = mtime
        return self._listing

    def close(self) -> None:
        with self._lock:
            if self._sender is not None:
                self._sender.close()
                self._sender = None

    # -- listening -----------------------------------------------------------------

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Bind a socket of our own and call ``callback`` (on a thread) for each
        wake-up, and once at the start; return a function that stops it and
        removes the socket."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{uuid.uuid4().hex}{_SUFFIX}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(path))
        sock.settimeout(0.5)  # how soon the thread sees ``stop`` should ``_nudge``'s datagram be lost
        stop = threading.Event()

        def loop() -> None:
            callback()
            while not stop.is_set():
                try:
                    sock.recv(64)
                except TimeoutError:
                    continue
                except OSError:
                    if stop.is_set():
                        return
                    stop.wait(0.1)
                    continue
                if stop.is_set():  # close()'s nudge, or a wake-up after it: no call after close
                    return
                # fold a burst of wake-ups into one call
                sock.setblocking(False)
                with contextlib.suppress(OSError):
                    while sock.recv(64):
                        pass
                sock.settimeout(0.5)
                callback()

        thread = threading.Thread(target=loop, name=f"cairn-wake-{path.stem[:8]}", daemon=True)
        thread.start()

        def close() -> None:
            stop.set()
            _nudge(path)
            thread.join(timeout=5)
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)

        return close


def _nudge(path: Path) -> None:
    """An empty datagram to the listener bound at ``path``, so that its
    ``recv`` returns now rather than at its timeout: without it every
    ``close`` waited up to the half second of that timeout, which a worker's
    drain, a server's shutdown and each in-process worker run of the tests
    paid. If it cannot be sent, the timeout still ends the wait."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender, contextlib.suppress(OSError):
        sender.setblocking(False)
        sender.sendto(b"", str(path))
