"""One live session with an MCP server, usable from sync and async code.

The SDK is async (anyio) and its transports are context managers that must
be entered and left by the same task. A ``Connection`` therefore owns a
thread running an event loop and one task that opens the transport and the
``ClientSession``, then waits to be told to close; every request is a
coroutine submitted to that loop, so a sync workflow (on a worker thread) and
an async one (on another loop) use the same session safely. A session whose
server died is dropped; the next request opens a new one (after the egress
check again: a server is started or reached only where the app allows it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from cairn.errors import CairnError

T = TypeVar("T")


class MCPUnavailable(CairnError):
    """The server could not be started, reached, or answer (it died, the
    connection dropped, it timed out)."""


class Connection:
    """A lazily opened, reopened-on-failure session with one server."""

    def __init__(self, label: str, open_transport: Callable[[], Any], timeout: float) -> None:
        self.label = label
        self._open_transport = open_transport
        #: how long opening a session (and listing tools) may take
        self.timeout = timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: ClientSession | None = None
        self._closing: asyncio.Event | None = None
        self._task: concurrent.futures.Future[None] | None = None

    # -- requests -------------------------------------------------------------------------

    def list_tools(self) -> list[types.Tool]:
        async def listing(session: ClientSession) -> list[types.Tool]:
            tools: list[types.Tool] = []
            cursor: str | None = None
            while True:
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor)
                                                if cursor else None)
                tools += page.tools
                cursor = page.nextCursor
                if not cursor:
                    return tools

        return self.request(listing, self.timeout)

    def call_tool(self, name: str, arguments: dict[str, Any], timeout: float) -> types.CallToolResult:
        async def call(session: ClientSession) -> types.CallToolResult:
            return await session.call_tool(name, arguments, read_timeout_seconds=timedelta(seconds=timeout))

        return self.request(call, timeout)

    async def acall_tool(self, name: str, arguments: dict[str, Any], timeout: float) -> types.CallToolResult:
        """``call_tool`` for async code: the caller's loop awaits the answer
        (no thread is taken per call, the loop is never blocked); the request
        runs on the session's own loop, where the SDK requires it."""
        async def call(session: ClientSession) -> types.CallToolResult:
            return await session.call_tool(name, arguments, read_timeout_seconds=timedelta(seconds=timeout))

        session = self._session
        if session is None:  # the first call opens it: blocking work (a process, a handshake), off the loop
            session = await asyncio.to_thread(self._open)
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(_awaited(call(session)), self._loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout + 5)
        except TimeoutError:
            future.cancel()
            self._drop()
            raise MCPUnavailable(f"MCP server {self.label} did not answer within {timeout:g} s") from None
        except asyncio.CancelledError:
            future.cancel()  # the caller gave up (its own timeout): so does the request
            raise
        except Exception as exc:
            self._drop()
            raise MCPUnavailable(f"MCP server {self.label} failed: {_why(exc)}") from None

    def request(self, body: Callable[[ClientSession], Awaitable[T]], timeout: float) -> T:
        """Run ``body(session)`` on the connection's loop; any failure of the
        session (not of the tool: that is a result) drops it."""
        session = self._open()
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(_awaited(body(session)), self._loop)
        try:
            return future.result(timeout + 5)  # the SDK's own timeout fires first
        except concurrent.futures.TimeoutError:
            future.cancel()
            self._drop()
            raise MCPUnavailable(f"MCP server {self.label} did not answer within {timeout:g} s") from None
        except Exception as exc:
            self._drop()
            raise MCPUnavailable(f"MCP server {self.label} failed: {_why(exc)}") from None

    # -- the session's life --------------------------------------------------------------------

    def _open(self) -> ClientSession:
        with self._lock:
            if self._session is not None:
                return self._session
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{self.label}",
                                                daemon=True)
                self._thread.start()
            ready: concurrent.futures.Future[ClientSession] = concurrent.futures.Future()
            self._task = asyncio.run_coroutine_threadsafe(self._hold(ready), self._loop)
            try:
                self._session = ready.result(self.timeout + 5)
            except concurrent.futures.TimeoutError:
                raise MCPUnavailable(f"MCP server {self.label} did not start within {self.timeout:g} s"
                                     ) from None
            except Exception as exc:
                raise MCPUnavailable(f"MCP server {self.label} cannot be reached: {_why(exc)}") from None
            return self._session

    async def _hold(self, ready: concurrent.futures.Future[ClientSession]) -> None:
        """Open the transport and the session, hand the session over, wait
        until closed: entered and left in this one task, as anyio requires."""
        self._closing = asyncio.Event()
        try:
            async with self._open_transport() as streams, ClientSession(streams[0], streams[1]) as session:
                await asyncio.wait_for(session.initialize(), self.timeout)
                ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else MCPUnavailable(str(exc)))

    def _drop(self) -> None:
        with self._lock:
            self._session = None
            closing, loop = self._closing, self._loop
        if closing is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(closing.set)

    def close(self) -> None:
        """End the session (and a stdio server's process) and the loop."""
        self._drop()
        with self._lock:
            loop, thread, task = self._loop, self._thread, self._task
            self._loop = self._thread = self._task = None
        if task is not None:
            with contextlib.suppress(Exception):
                task.result(10)
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(10)
            loop.close()


def _why(exc: BaseException) -> str:
    """The first real error inside anyio's exception groups, on one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def stdio_transport(command: list[str], env: dict[str, str] | None) -> Callable[[], Any]:
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    return lambda: stdio_client(params)


def http_transport(url: str, headers: dict[str, str] | None, timeout: float) -> Callable[[], Any]:
    import httpx
    from mcp.client import streamable_http

    def open_http() -> Any:
        new: Callable[..., Any] | None = getattr(streamable_http, "streamable_http_client", None)
        if new is not None:
            client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout, read=None))
            return _closing_client(new(url, http_client=client), client)
        return streamable_http.streamablehttp_client(url, headers=headers, timeout=timeout)

    return open_http


@contextlib.asynccontextmanager
async def _closing_client(inner: Any, client: Any) -> Any:
    async with client, inner as streams:
        yield streams

