"""The fake bank: a separate process with its own SQLite ledger and an HTTP API."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import sqlite3
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairn.demo.bank import BANK_URL_ENV, BankClient, BankProcess, BankRejected, BankUnavailable
from tests.timing import SLACK

StartBank = Callable[..., BankProcess]


def call(bank: BankProcess, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
    """One raw HTTP request: (status, headers, decoded JSON body)."""
    parts = urllib.parse.urlsplit(bank.url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        data = None if body is None else json.dumps(body)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        return response.status, dict(response.getheaders()), json.loads(raw) if raw else None
    finally:
        conn.close()


def transfer_body(
    key: str = "key-1", amount: int = 1250, to: str = "acct_b", memo: str = "refund"
) -> dict[str, Any]:
    return {"idempotency_key": key, "from": "acct_shop", "to": to, "amount_cents": amount, "memo": memo}


@pytest.mark.slow
def test_post_creates_then_replays_the_original(start_bank: StartBank) -> None:
    bank = start_bank()
    status, _, created = call(bank, "POST", "/transfers", transfer_body())
    assert status == 201
    assert created["id"].startswith("tr_")
    assert (created["idempotency_key"], created["from"], created["to"]) == ("key-1", "acct_shop", "acct_b")
    assert (created["amount_cents"], created["memo"]) == (1250, "refund")
    assert created["created_at"] == pytest.approx(time.time(), abs=30)

    time.sleep(0.01)
    status, headers, again = call(bank, "POST", "/transfers", transfer_body())
    assert status == 200
    assert headers.get("Idempotent-Replayed") == "true"
    assert again == created  # the ORIGINAL transfer: same id, same created_at

    _, _, listing = call(bank, "GET", "/transfers")
    assert listing["transfers"] == [created]


@pytest.mark.slow
def test_reused_key_with_other_parameters_is_refused(start_bank: StartBank) -> None:
    bank = start_bank()
    assert call(bank, "POST", "/transfers", transfer_body(amount=100))[0] == 201
    status, _, body = call(bank, "POST", "/transfers", transfer_body(amount=101))
    assert status == 409
    assert body["transfer"]["amount_cents"] == 100
    with pytest.raises(BankRejected) as refused:
        bank.client().create_transfer(idempotency_key="key-1", from_account="acct_shop", to_account="acct_b",
                                      amount_cents=100, memo="another memo")
    assert refused.value.status == 409
    assert len(bank.client().transfers()) == 1


@pytest.mark.slow
def test_lookup_by_key_and_404(start_bank: StartBank) -> None:
    bank = start_bank()
    client = bank.client()
    created = client.create_transfer(idempotency_key="order 7/refund?x=1", from_account="acct_shop",
                                     to_account="acct_c", amount_cents=5, memo="")
    assert client.transfer_by_key("order 7/refund?x=1") == created  # keys are URL-quoted
    assert client.transfer_by_key("order 7") is None
    status, _, body = call(bank, "GET", "/transfers/by-key/never-seen")
    assert status == 404
    assert "never-seen" in body["error"]
    assert call(bank, "GET", "/nowhere")[0] == 404
    assert call(bank, "POST", "/elsewhere", {})[0] == 404


@pytest.mark.parametrize(
    "body",
    [
        {"from": "a", "to": "b", "amount_cents": 1},  # no key
        {"idempotency_key": "", "from": "a", "to": "b", "amount_cents": 1},
        {"idempotency_key": "k", "from": "a", "to": "b", "amount_cents": 0},
        {"idempotency_key": "k", "from": "a", "to": "b", "amount_cents": -5},
        {"idempotency_key": "k", "from": "a", "to": "b", "amount_cents": True},
        {"idempotency_key": "k", "from": "a", "to": "b", "amount_cents": 1.5},
        {"idempotency_key": "k", "from": "a", "to": "a", "amount_cents": 1},
        {"idempotency_key": "k", "to": "b", "amount_cents": 1},
        {"idempotency_key": "k", "from": "a", "to": "b", "amount_cents": 1, "memo": 3},
        ["not", "an", "object"],
    ],
)
@pytest.mark.slow
def test_invalid_requests_are_refused_and_change_nothing(start_bank: StartBank, body: Any) -> None:
    bank = start_bank()
    status, _, answer = call(bank, "POST", "/transfers", body)
    assert status == 400, answer
    assert bank.client().transfers() == []


@pytest.mark.slow
def test_separate_process_with_its_own_database(start_bank: StartBank, tmp_path: Path) -> None:
    bank = start_bank("ledger")
    health = bank.client().health()
    assert health["status"] == "ok"
    assert health["pid"] == bank.pid != os.getpid()
    assert Path(health["db"]) == tmp_path / "ledger.db"
    port_file = tmp_path / "ledger.db.port"
    assert int(port_file.read_text()) == urllib.parse.urlsplit(bank.url).port
    assert not (tmp_path / "ledger.db.port.tmp").exists()  # written atomically, then renamed

    created = bank.client().create_transfer(idempotency_key="k", from_account="a", to_account="b",
                                            amount_cents=42, memo="m")
    # the ledger is an ordinary SQLite file, committed before the response
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        rows = conn.execute("SELECT id, idempotency_key, amount_cents FROM transfers").fetchall()
        assert rows == [(created.id, "k", 42)]
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):  # keys enforced by the schema itself
            conn.execute("INSERT INTO transfers (id, idempotency_key, from_account, to_account, "
                         "amount_cents, memo, created_at) VALUES ('tr_x', 'k', 'a', 'b', 1, '', 0)")
    conn.close()


@pytest.mark.slow
def test_committed_transfer_survives_a_bank_crash(start_bank: StartBank, tmp_path: Path) -> None:
    first = start_bank("crashy")
    created = first.client().create_transfer(idempotency_key="k", from_account="a", to_account="b",
                                             amount_cents=7, memo="")
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=10)
    second = start_bank("crashy")  # same database file, new process
    assert second.pid != first.pid
    assert second.client().transfer_by_key("k") == created
    status, _, again = call(second, "POST", "/transfers",
                            {"idempotency_key": "k", "from": "a", "to": "b", "amount_cents": 7, "memo": ""})
    assert (status, again["id"]) == (200, created.id)


@pytest.mark.slow
def test_concurrent_posts_with_one_key_make_one_transfer(start_bank: StartBank) -> None:
    bank = start_bank(delay_ms=20)  # the requests overlap in the bank's threads
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: call(bank, "POST", "/transfers", transfer_body("same")), range(16)))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200] * 15 + [201]
    assert len({body["id"] for _, _, body in results}) == 1
    assert len(bank.client().transfers()) == 1


@pytest.mark.slow
def test_fault_knobs_delay_and_lost_reply(start_bank: StartBank) -> None:
    bank = start_bank()
    client = bank.client()
    started = time.monotonic()
    client.create_transfer(idempotency_key="slow", from_account="a", to_account="b", amount_cents=1,
                           delay_ms=150, reply_delay_ms=150)
    assert time.monotonic() - started >= 0.3
    # the bank commits, then drops the connection: the caller cannot tell what happened...
    with pytest.raises(BankUnavailable):
        client.create_transfer(idempotency_key="lost", from_account="a", to_account="b", amount_cents=2,
                               drop_reply=1)
    # ...but a lookup by key can
    found = client.transfer_by_key("lost")
    assert found is not None
    assert found.amount_cents == 2


@pytest.mark.slow
def test_server_wide_delay_holds_the_reply_after_the_commit(start_bank: StartBank) -> None:
    bank = start_bank(reply_delay_ms=300)
    client = bank.client()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.create_transfer, idempotency_key="k", from_account="a", to_account="b",
                              amount_cents=3)
        deadline = time.monotonic() + 5 * SLACK
        while client.transfer_by_key("k") is None:  # committed while the caller still waits
            assert time.monotonic() < deadline, "the transfer was never committed"
            time.sleep(0.01)
        assert not pending.done()
        assert pending.result(timeout=5).amount_cents == 3


@pytest.mark.slow
def test_unreachable_bank_is_unavailable_not_rejected(start_bank: StartBank) -> None:
    bank = start_bank()
    url = bank.url
    bank.stop()
    with pytest.raises(BankUnavailable):
        BankClient(url, timeout=2).transfer_by_key("k")


@pytest.mark.slow
def test_a_request_abandoned_before_processing_is_dropped(start_bank: StartBank) -> None:
    bank = start_bank(delay_ms=300)
    parts = urllib.parse.urlsplit(bank.url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    conn.request("POST", "/transfers", body=json.dumps(transfer_body("abandoned")),
                 headers={"Content-Type": "application/json"})
    conn.close()  # the caller dies while the bank is still waiting to process the request
    time.sleep(0.6)
    assert bank.client().transfers() == []
    assert "dropped: the caller hung up" in bank.log_tail()
    # a caller that waits gets its transfer
    assert bank.client().create_transfer(idempotency_key="patient", from_account="a", to_account="b",
                                         amount_cents=1).amount_cents == 1


def test_a_worker_reaches_the_bank_its_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BANK_URL_ENV, "http://127.0.0.1:9/")
    assert BankClient.from_env().base_url == "http://127.0.0.1:9"
    monkeypatch.setenv(BANK_URL_ENV, "")
    with pytest.raises(RuntimeError, match=r"\$CAIRN_BANK_URL is not set"):
        BankClient.from_env()
