"""A fake OpenAI-compatible chat-completions server for tests.

It is a real HTTP server on 127.0.0.1 (an ephemeral port, a background
thread), so the client under test goes through real sockets, headers and
status codes. It records every request it receives and answers from a
script of replies, in order; a request with no reply left gets a 599 so a
test that asks more often than it expects fails loudly.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``drop`` closes the connection without answering;
    ``delay`` waits before answering (to provoke client timeouts); ``trickle``
    sends the body one byte per that many seconds (each read is quick, the
    whole answer is not)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False
    trickle: float = 0.0


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # decoded JSON


def completion(
    content: str | None = "hello",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "fake-model-2024",
    finish_reason: str = "stop",
    usage: dict[str, int] | None = None,
) -> Reply:
    """A successful chat completion in the OpenAI wire format."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return json_reply(body)


def error(status: int, message: str, **headers: str) -> Reply:
    """An OpenAI-style error body."""
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return json_reply(body, status, headers)


def json_reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})})


class FakeOpenAI:
    """Start with ``with FakeOpenAI() as server``; ``server.url`` ends in ``/v1``."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._replies: list[Reply] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-openai", daemon=True)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next(self, received: Received) -> Reply:
        with self._lock:
            self.requests.append(received)
            if self._replies:
                return self._replies.pop(0)
        return error(599, f"fake server: no scripted reply for request {len(self.requests)}")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like real servers: clients pool connections

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = {"undecodable": raw.decode(errors="replace")}
                headers = {name.lower(): value for name, value in self.headers.items()}
                reply = fake._next(Received("POST", self.path, headers, body))
                if reply.delay and fake._stopping.wait(reply.delay):
                    self.close_connection = True
                    return
                try:
                    if reply.drop:
                        self.close_connection = True
                        return
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    if not reply.trickle:
                        self.wfile.write(reply.body)
                    for i in range(len(reply.body) if reply.trickle else 0):
                        self.wfile.write(reply.body[i:i + 1])
                        self.wfile.flush()
                        if fake._stopping.wait(reply.trickle):
                            break
                except OSError:  # the client gave up (timeout test): nothing to answer
                    self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler
