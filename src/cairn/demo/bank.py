"""A fake external bank: its own process, its own SQLite database, an HTTP API.

The payments demo and its tests need an outside world that behaves like a real
payment provider, in particular one that keeps going when the agent's worker
dies. So the bank is a separate process::

    python -m cairn.demo.bank --db PATH --port 0 --ready-file F

It listens on 127.0.0.1 (port 0: an ephemeral port, written atomically to the
ready file once the socket listens) and speaks JSON:

* ``POST /transfers`` ``{"idempotency_key", "from", "to", "amount_cents", "memo"}``
  → ``201`` with the new transfer, or ``200`` with the *original* transfer if
  the key was seen before (``409`` if that key was used with other
  parameters). Keys are enforced by a UNIQUE constraint; the transfer is
  committed (``synchronous=FULL``) before the response is written.
* ``GET /transfers/by-key/{key}`` → ``200`` with the transfer, or ``404``.
* ``GET /transfers`` → ``{"transfers": [...]}``, oldest first.
* ``GET /health`` → ``{"status": "ok", ...}``.

Fault knobs, for tests, as query parameters of any request or as server-wide
defaults (``--delay-ms`` / ``$CAIRN_BANK_DELAY_MS``, ``--reply-delay-ms`` /
``$CAIRN_BANK_REPLY_DELAY_MS``): ``delay_ms`` waits before the request is
processed (latency), ``reply_delay_ms`` waits *after the commit and before the
response* (the window in which the money moved but the caller does not know
yet), ``drop_reply=1`` commits and then closes the connection without
answering (a lost response). A POST whose caller hangs up while it waits
for processing is dropped, as a cancelled request would be: a caller killed
during ``delay_ms`` leaves no transfer, one killed during ``reply_delay_ms``
does.

``BankClient`` is the small urllib client the demo's tools use, and
``BankProcess`` starts and stops a bank subprocess.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import secrets
import select
import signal
import socket
import sqlite3
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import msgspec

from cairn.demo.children import Child, child_env, launch

_SCHEMA = """
CREATE TABLE IF NOT EXISTS transfers (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    idempotency_key TEXT NOT NULL UNIQUE,
    from_account    TEXT NOT NULL,
    to_account      TEXT NOT NULL,
    amount_cents    INTEGER NOT NULL CHECK (amount_cents > 0),
    memo            TEXT NOT NULL,
    created_at      REAL NOT NULL
)
"""
_COLUMNS = "id, idempotency_key, from_account, to_account, amount_cents, memo, created_at"
MAX_KEY_LENGTH = 255
MAX_BODY = 64 * 1024


class Transfer(msgspec.Struct, frozen=True, kw_only=True):
    """One transfer as the bank reports it (JSON names ``from`` and ``to``)."""

    id: str
    idempotency_key: str
    from_account: str = msgspec.field(name="from")
    to_account: str = msgspec.field(name="to")
    amount_cents: int
    memo: str
    created_at: float


# -- the server ---------------------------------------------------------------------------------


class _Invalid(Exception):
    """A request the bank refuses (400)."""


def _connect(db_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db_path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA synchronous = FULL")  # a bank does not forget a committed transfer
    return conn


def init_db(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(_connect(db_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(_SCHEMA)


def _row_json(row: tuple[Any, ...]) -> dict[str, Any]:
    return {"id": row[0], "idempotency_key": row[1], "from": row[2], "to": row[3], "amount_cents": row[4],
            "memo": row[5], "created_at": row[6]}


def _parse_transfer_request(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"null")
    except json.JSONDecodeError as exc:
        raise _Invalid(f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _Invalid("body must be a JSON object")
    key, source, target = body.get("idempotency_key"), body.get("from"), body.get("to")
    amount, memo = body.get("amount_cents"), body.get("memo", "")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise _Invalid(f"idempotency_key must be a non-empty string of at most {MAX_KEY_LENGTH} characters")
    if not isinstance(source, str) or not source or not isinstance(target, str) or not target:
        raise _Invalid("'from' and 'to' must be non-empty account strings")
    if source == target:
        raise _Invalid("'from' and 'to' must differ")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise _Invalid("amount_cents must be a positive integer")
    if not isinstance(memo, str):
        raise _Invalid("memo must be a string")
    return {"idempotency_key": key, "from": source, "to": target, "amount_cents": amount, "memo": memo}


class BankServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], db_path: Path, delay_ms: int, reply_delay_ms: int) -> None:
        self.db_path = db_path
        self.delay_ms = delay_ms
        self.reply_delay_ms = reply_delay_ms
        init_db(db_path)
        super().__init__(address, _Handler)

    def create(self, request: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Insert the transfer unless its key exists; ``(created, transfer)``.
        Committed durably before returning."""
        transfer_id = f"tr_{secrets.token_hex(8)}"
        with contextlib.closing(_connect(self.db_path)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                inserted = conn.execute(
                    f"INSERT INTO transfers ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (idempotency_key) DO NOTHING",
                    (transfer_id, request["idempotency_key"], request["from"], request["to"],
                     request["amount_cents"], request["memo"], time.time()),
                ).rowcount
                row = conn.execute(f"SELECT {_COLUMNS} FROM transfers WHERE idempotency_key = ?",
                                   (request["idempotency_key"],)).fetchone()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return inserted == 1, _row_json(row)

    def by_key(self, key: str) -> dict[str, Any] | None:
        with contextlib.closing(_connect(self.db_path)) as conn:
            row = conn.execute(f"SELECT {_COLUMNS} FROM transfers WHERE idempotency_key = ?",
                               (key,)).fetchone()
        return _row_json(row) if row is not None else None

    def all(self) -> list[dict[str, Any]]:
        with contextlib.closing(_connect(self.db_path)) as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM transfers ORDER BY seq").fetchall()
        return [_row_json(row) for row in rows]


class _Handler(BaseHTTPRequestHandler):
    server: BankServer
    server_version = "CairnFakeBank/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{time.time():.6f} bank pid={os.getpid()} {format % args}\n")

    def _query(self) -> tuple[str, dict[str, str]]:
        parts = urllib.parse.urlsplit(self.path)
        return parts.path, dict(urllib.parse.parse_qsl(parts.query))

    def _knob(self, query: dict[str, str], name: str, default: int) -> float:
        try:
            return max(0, int(query.get(name, default))) / 1000
        except ValueError:
            return default / 1000

    def _caller_hung_up(self) -> bool:
        """Whether the caller closed its connection while the request waited
        (a request abandoned before it is processed is dropped, like a
        cancelled request, so a caller killed early leaves no transfer)."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            peeked: bytes = self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True
        return peeked == b""

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path, query = self._query()
        time.sleep(self._knob(query, "delay_ms", self.server.delay_ms))
        if path == "/health":
            self._send(HTTPStatus.OK, {"status": "ok", "pid": os.getpid(), "db": str(self.server.db_path)})
        elif path == "/transfers":
            self._send(HTTPStatus.OK, {"transfers": self.server.all()})
        elif path.startswith("/transfers/by-key/"):
            key = urllib.parse.unquote(path.removeprefix("/transfers/by-key/"))
            found = self.server.by_key(key)
            if found is None:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no transfer with idempotency key {key!r}"})
            else:
                self._send(HTTPStatus.OK, found)
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route GET {path}"})

    def do_POST(self) -> None:
        path, query = self._query()
        if path != "/transfers":
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route POST {path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "body too large"})
            return
        raw = self.rfile.read(length)
        try:
            request = _parse_transfer_request(raw)
        except _Invalid as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        time.sleep(self._knob(query, "delay_ms", self.server.delay_ms))
        if self._caller_hung_up():
            self.close_connection = True  # cancelled before it was processed: nothing happened
            self.log_message("POST /transfers dropped: the caller hung up before it was processed")
            return
        created, transfer = self.server.create(request)
        time.sleep(self._knob(query, "reply_delay_ms", self.server.reply_delay_ms))
        if query.get("drop_reply") == "1":
            self.close_connection = True  # committed, but the caller never hears of it
            return
        if created:
            self._send(HTTPStatus.CREATED, transfer)
            return
        same = all(transfer[field] == request[field] for field in ("from", "to", "amount_cents", "memo"))
        if not same:
            self._send(HTTPStatus.CONFLICT, {"error": "idempotency key reused with different parameters",
                                             "transfer": transfer})
            return
        self._send(HTTPStatus.OK, transfer, {"Idempotent-Replayed": "true"})


def serve(
    db_path: Path, port: int, ready_file: Path | None, delay_ms: int = 0, reply_delay_ms: int = 0
) -> None:
    server = BankServer(("127.0.0.1", port), db_path, delay_ms, reply_delay_ms)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        if ready_file is not None:  # written only once the socket listens; atomically
            tmp = ready_file.with_name(ready_file.name + ".tmp")
            tmp.write_text(str(server.server_address[1]))
            os.replace(tmp, ready_file)
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cairn.demo.bank", description="A fake bank for demos.")
    parser.add_argument("--db", type=Path, required=True, help="SQLite file of the bank's ledger")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--ready-file", type=Path, default=None, help="gets the port once listening")
    parser.add_argument("--delay-ms", type=int, default=int(os.environ.get("CAIRN_BANK_DELAY_MS", "0")))
    parser.add_argument("--reply-delay-ms", type=int,
                        default=int(os.environ.get("CAIRN_BANK_REPLY_DELAY_MS", "0")))
    args = parser.parse_args(argv)
    serve(args.db, args.port, args.ready_file, args.delay_ms, args.reply_delay_ms)
    return 0


# -- the client ---------------------------------------------------------------------------------


class BankError(Exception):
    """The bank could not be reached or answered with an error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BankUnavailable(BankError):
    """No usable answer (connection refused or dropped, timeout, 5xx): whether
    a transfer request took effect is *unknown*."""


class BankRejected(BankError):
    """The bank refused the request (4xx): it was not applied."""


#: the variable a demo hands its workers the bank's URL in (``BankClient.from_env``)
BANK_URL_ENV = "CAIRN_BANK_URL"


class BankClient:
    """A tiny client of the fake bank (urllib only)."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    @classmethod
    def from_env(cls) -> BankClient:
        """The bank ``$CAIRN_BANK_URL`` names: a demo's workers call the bank the
        demo started, on whatever port it got."""
        url = os.environ.get(BANK_URL_ENV)
        if not url:
            raise RuntimeError(f"${BANK_URL_ENV} is not set: where is the bank?")
        return cls(url)

    def __repr__(self) -> str:
        return f"BankClient({self.base_url!r})"

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return int(response.status), json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            with exc:
                payload = exc.read()
            try:
                detail = json.loads(payload or b"null")
            except json.JSONDecodeError:
                detail = payload.decode(errors="replace")
            return exc.code, detail
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            raise BankUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    def _checked(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        status, payload = self._request(method, path, body)
        if status in ok:
            return payload
        error = payload.get("error") if isinstance(payload, dict) else payload
        message = f"{method} {path}: HTTP {status}: {error}"
        if 400 <= status < 500:
            raise BankRejected(message, status)
        raise BankUnavailable(message, status)

    def create_transfer(
        self,
        *,
        idempotency_key: str,
        from_account: str,
        to_account: str,
        amount_cents: int,
        memo: str = "",
        **knobs: int,
    ) -> Transfer:
        """POST a transfer; a repeated key returns the original transfer.
        ``knobs`` (``delay_ms``, ``reply_delay_ms``, ``drop_reply``) go into
        the query string."""
        query = f"?{urllib.parse.urlencode(knobs)}" if knobs else ""
        body = {"idempotency_key": idempotency_key, "from": from_account, "to": to_account,
                "amount_cents": amount_cents, "memo": memo}
        payload = self._checked("POST", f"/transfers{query}", body, ok=(200, 201))
        return msgspec.convert(payload, Transfer)

    def transfer_by_key(self, key: str) -> Transfer | None:
        status, payload = self._request("GET", f"/transfers/by-key/{urllib.parse.quote(key, safe='')}")
        if status == 404:
            return None
        if status != 200:
            raise BankUnavailable(f"GET /transfers/by-key/{key}: HTTP {status}: {payload}", status)
        return msgspec.convert(payload, Transfer)

    def transfers(self) -> list[Transfer]:
        payload = self._checked("GET", "/transfers")
        return msgspec.convert(payload["transfers"], list[Transfer])

    def health(self) -> dict[str, Any]:
        payload: dict[str, Any] = self._checked("GET", "/health")
        return payload


# -- running the bank as a subprocess -------------------------------------------------------------


@dataclass
class BankProcess(Child):
    """A running bank subprocess (``start``); ``stop`` ends and reaps it."""

    url: str
    db_path: Path

    tail_lines = 20

    @classmethod
    def start(
        cls,
        db_path: Path,
        *,
        delay_ms: int = 0,
        reply_delay_ms: int = 0,
        timeout: float = 20.0,
        env: dict[str, str] | None = None,
    ) -> BankProcess:
        db_path = db_path.resolve()
        db_path.parent.mkdir(parents=True, exist_ok=True)
        ready = db_path.with_name(db_path.name + ".port")
        ready.unlink(missing_ok=True)
        log_path = db_path.with_name(db_path.name + ".log")
        log = log_path.open("ab")
        command = [sys.executable, "-m", "cairn.demo.bank", "--db", str(db_path), "--port", "0",
                   "--ready-file", str(ready), "--delay-ms", str(delay_ms),
                   "--reply-delay-ms", str(reply_delay_ms)]
        proc = launch(command, log, env if env is not None else child_env())
        bank = cls(proc=proc, log_path=log_path, log=log, url="", db_path=db_path)
        deadline = time.monotonic() + timeout
        try:
            while not ready.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"the bank exited with code {proc.returncode}: {bank.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the bank did not listen within {timeout:g}s: {bank.log_tail()}")
                time.sleep(0.01)
            bank.url = f"http://127.0.0.1:{int(ready.read_text())}"
            bank.client().health()
        except BaseException:
            bank.stop()
            raise
        return bank

    def client(self, timeout: float = 10.0) -> BankClient:
        return BankClient(self.url, timeout)

    def __enter__(self) -> BankProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@contextlib.contextmanager
def running_bank(db_path: Path, **options: Any) -> Iterator[BankProcess]:
    """``with running_bank(path) as bank:`` a bank subprocess for the block."""
    bank = BankProcess.start(db_path, **options)
    try:
        yield bank
    finally:
        bank.stop()


if __name__ == "__main__":
    sys.exit(main())
