"""The PostgreSQL store's connections, the one used last handed out first.

psycopg_pool's ``ConnectionPool`` hands out the connection that has been
idle longest (a FIFO deque) and offers no other order. A store used by one
thread at a time (a worker's loop, a LangGraph saver driving its graph)
therefore rotates every statement over all the connections the pool ever
grew to (four after a burst), each with its own server backend, its own
catalog and plan caches and its own prepared statements: a LangGraph
``get_state`` read took 0.6-0.85 ms of client CPU (p50) rotating against
0.44 on the connection used last (issue 24, 2026-12-07,
``bench/results/langgraph-getstate-2026-12-07-pgget.txt``).

``Recent`` keeps the connection returned last aside, for the next taker,
and goes to the pool (public ``getconn``/``putconn``) only when it is in
use or gone; so a store used by one thread at a time uses one connection
and its backend, and concurrent users still get one each. A connection is
kept aside only while no taker has gone to the pool for one: a taker
waiting there is handed the next connection returned (the pool holds its
maximum then), never left to time out beside one kept idle. ``Recent`` must
be the pool's only user for that count to hold. A kept connection
goes back to the pool at least every ``hold`` seconds of being kept in turn,
so the pool's own care (``max_lifetime``, shrinking idle connections,
replacing broken ones) still reaches every connection. A connection that
leaves its block with an error, or not idle, always goes back through the
pool, which rolls it back or replaces it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Generic, Protocol, TypeVar


class _Connection(Protocol):
    """What ``Recent`` uses of a psycopg connection: its block (commit or roll back)."""

    def __enter__(self) -> object: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                 exc_tb: TracebackType | None) -> object: ...


_C = TypeVar("_C", bound=_Connection)


class _Pool(Protocol[_C]):
    """What ``Recent`` uses of a ``psycopg_pool.ConnectionPool``."""

    @property
    def closed(self) -> bool: ...
    def getconn(self) -> _C: ...
    def putconn(self, conn: _C) -> None: ...


#: how long a connection may be handed out again from the slot before it goes back through the pool
HOLD_SECONDS = 5.0


class Recent(Generic[_C]):
    """``pool``'s connections, the one returned last handed out first (see
    the module); ``idle(conn)``: whether a connection is open and outside
    any transaction, so it may be handed out again as it is."""

    __slots__ = ("_hold", "_idle", "_kept", "_lock", "_pool", "_since", "_waiting")

    def __init__(self, pool: _Pool[_C], idle: Callable[[_C], bool], hold: float = HOLD_SECONDS) -> None:
        self._pool = pool
        self._idle = idle
        self._hold = hold
        self._lock = threading.Lock()
        self._kept: _C | None = None
        self._since = 0.0  # when the kept connection last came from the pool
        self._waiting = 0  # takers gone to the pool, maybe waiting there for a connection

    @contextlib.contextmanager
    def connection(self) -> Iterator[_C]:
        """A connection for one block, as ``ConnectionPool.connection``:
        committed when the block ends, rolled back if it raises."""
        with self._lock:
            conn, since, self._kept = self._kept, self._since, None
            if conn is None:
                self._waiting += 1
        if conn is None:
            try:
                conn = self._pool.getconn()
            finally:
                with self._lock:
                    self._waiting -= 1
            since = time.monotonic()
        try:
            with conn:
                yield conn
        except BaseException:
            self._pool.putconn(conn)
            raise
        if time.monotonic() - since < self._hold and self._idle(conn) and not self._pool.closed:
            with self._lock:
                # a taker waiting in the pool gets it from there, never left waiting beside a kept one
                if self._kept is None and not self._waiting:
                    self._kept, self._since = conn, since
                    return
        self._pool.putconn(conn)

    def close(self) -> None:
        """Give the kept connection back to the pool (before the pool closes)."""
        with self._lock:
            conn, self._kept = self._kept, None
        if conn is not None:
            self._pool.putconn(conn)
