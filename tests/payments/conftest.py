"""Fixtures for the payments tests: a bank process, worker processes, the agent.

Everything that starts a process registers it here, and the fixtures'
finalizers SIGKILL (workers) or stop (bank) and reap every one of them, pass
or fail. No wait is unbounded: ``wait_until`` polls against a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import pytest

import cairn
from cairn.demo.bank import BankClient, BankProcess, Transfer
from tests import processes
from tests.acceptance.harness import process_state, wait_until, write_locked

REPO_ROOT = Path(__file__).resolve().parents[2]
PAYMENTS_SPEC = "cairn.demo.payments:app"
#: what a payments worker imports, short of the app's module itself (it builds its App from
#: ``$CAIRN_DB`` at import, so each worker imports it afresh)
WORKER_PRELOAD = (*processes.WORKER_PRELOAD, "cairn.demo.bank", "cairn.models.scripted", "rich.console",
                  "rich.table", "rich.text")

__all__ = ["REPO_ROOT", "Proc", "World", "wait_until"]


@dataclass
class Proc:
    """A child process with its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes] | processes.Forked
    log_path: Path
    #: the log file this process opened for the child (a forked child opens its own)
    log: IO[bytes] | None
    signals: list[tuple[float, str]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: signal.Signals) -> float:
        at = time.time()
        self.popen.send_signal(sig)
        self.signals.append((at, sig.name))
        return at

    def kill(self) -> float:
        """SIGKILL and reap; the time of the kill."""
        at = self.send(signal.SIGKILL) if self.alive() else time.time()
        self.popen.wait(timeout=10)
        return at

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} (pid {self.pid}) still running after {timeout}s:\n"
                                 f"{self.log_tail()}") from None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop_outside_write_lock(self, db_path: Path, attempts: int = 25) -> float:
        """SIGSTOP at a moment the process holds no SQLite write lock (a process
        frozen inside a write transaction blocks everyone: a property of SQLite,
        not what a kill-switch test is about). The time of the stop that stuck."""
        for _ in range(attempts):
            at = self.send(signal.SIGSTOP)
            wait_until(lambda: process_state(self.pid) == "T", 5, f"pid {self.pid} to stop")
            if not write_locked(db_path):
                return at
            self.send(signal.SIGCONT)
            time.sleep(0.005)
        raise AssertionError(f"{self.name} held the write lock at each of {attempts} stops")


class Procs:
    """Every child process a test started; ``cleanup`` kills and reaps them all,
    then ends the zygotes they were forked from."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs: list[Proc] = []
        self.zygotes: dict[str, processes.Zygote] = {}

    def _log_path(self, name: str) -> Path:
        return self.directory / f"{len(self.procs):03d}-{name}.log"

    def spawn(self, name: str, command: list[str], env: dict[str, str]) -> Proc:
        log_path = self._log_path(name)
        log = log_path.open("wb")
        popen = processes.start(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        proc = Proc(name, popen, log_path, log)
        self.procs.append(proc)
        return proc

    def fork(self, name: str, module: str, args: list[str], env: dict[str, str],
             preload: tuple[str, ...] = ()) -> Proc:
        """``python -m module args``, forked from a zygote that imported
        ``module`` and ``preload`` once (``processes.Zygote``): a real process
        all the same, its start without the imports."""
        zygote = self.zygotes.get(module)
        if zygote is None:
            zygote = processes.Zygote(module, preload=preload,
                                      log=self.directory / f"zygote-{module}.log")
            self.zygotes[module] = zygote
        log_path = self._log_path(name)
        proc = Proc(name, zygote.spawn(args, env=env, log=log_path), log_path, None)
        self.procs.append(proc)
        return proc

    def describe(self, tail: int = 15) -> str:
        return "\n".join(f"--- {p.name} pid={p.pid} exit={p.popen.poll()} ---\n{p.log_tail(tail)}"
                         for p in self.procs)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(signal.SIGKILL)  # stopped processes die too
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - would leak a process
                print(f"could not reap {proc.name} pid {proc.pid}", file=sys.stderr)
            if proc.log is not None:
                proc.log.close()
        for zygote in self.zygotes.values():
            zygote.close()
        self.zygotes.clear()


def order_book(n: int) -> list[dict[str, Any]]:
    """``n`` orders that all deserve a refund, amounts 100 + i cents (distinct)."""
    return [{"order_id": f"ORD-T{i:02d}", "customer": f"Customer {i}", "account": f"acct_c{i:02d}",
             "item": f"item {i}", "amount_cents": 100 + i, "status": "refund_requested",
             "note": "test refund"} for i in range(n)]


@dataclass
class World:
    """One test's Cairn database, bank, order book, model-ask counter and workers."""

    directory: Path
    bank: BankProcess
    procs: Procs
    payments: ModuleType
    apps: list[cairn.App] = field(default_factory=list)

    @property
    def db_path(self) -> Path:
        return self.directory / "cairn.db"

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.db_path}"

    @property
    def orders_path(self) -> Path:
        return self.directory / "orders.json"

    @property
    def asks_path(self) -> Path:
        return self.directory / "model-asks.jsonl"

    def client(self) -> BankClient:
        return self.bank.client()

    def transfers(self) -> list[Transfer]:
        return self.client().transfers()

    def asks(self) -> int:
        counted: int = self.payments.count_asks(self.asks_path)
        return counted

    def write_orders(self, n: int) -> list[str]:
        orders = order_book(n)
        self.orders_path.write_text(json.dumps(orders))
        return [o["order_id"] for o in orders]

    def app(self, **options: Any) -> cairn.App:
        """An App in the test process on the shared database, serving the refund agent."""
        app: cairn.App = self.payments.open_app(self.db_url, **options)
        self.apps.append(app)
        return app

    def env(self, faults: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "CAIRN_FAULTS"}
        env.update({"CAIRN_DB": self.db_url, self.payments.BANK_URL_ENV: self.bank.url,
                    self.payments.ORDERS_ENV: str(self.orders_path),
                    self.payments.ASKS_ENV: str(self.asks_path), "PYTHONUNBUFFERED": "1"})
        if faults:
            env["CAIRN_FAULTS"] = faults
        return env

    def cli_worker(self, worker_id: str, *, lease: float = 1.0, faults: str | None = None,
                   app_spec: str = PAYMENTS_SPEC) -> Proc:
        """``python -m cairn worker``: the real CLI."""
        command = [sys.executable, "-m", "cairn", "worker", "--app", app_spec, "--db", self.db_url,
                   "--worker-id", worker_id, "--lease", f"{lease:g}", "--poll", "0.02", "--concurrency", "1"]
        return self.procs.spawn(worker_id, command, self.env(faults))

    def chaos_worker(self, worker_id: str, *, lease: float, app_spec: str = PAYMENTS_SPEC) -> Proc:
        """A worker that tolerates many takeovers (see ``tests.payments.run_worker``),
        forked from a zygote that imported Cairn and the app's dependencies once:
        the chaos test starts some sixty of them, and a fresh interpreter spent
        ~0.5 s of a quiet machine's CPU on those imports (seconds under load)."""
        args = ["--app", app_spec, "--db", self.db_url, "--worker-id", worker_id, "--lease", f"{lease:g}",
                "--max-recoveries", "1000"]
        return self.procs.fork(worker_id, "tests.payments.run_worker", args, self.env(),
                               preload=WORKER_PRELOAD)

    def close(self) -> None:
        for app in self.apps:
            app.close()
        self.apps.clear()


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


@pytest.fixture
def payments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``cairn.demo.payments`` imported afresh with ``$CAIRN_DB`` in ``tmp_path``
    (the module builds an App at import), forgotten again afterwards."""
    import importlib

    monkeypatch.setenv("CAIRN_DB", f"sqlite:///{tmp_path / 'module-import.db'}")
    sys.modules.pop("cairn.demo.payments", None)
    module = importlib.import_module("cairn.demo.payments")
    yield module
    module.app.close()
    sys.modules.pop("cairn.demo.payments", None)


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    spawned = Procs(tmp_path)
    try:
        yield spawned
    finally:
        if request.node.stash.get(_FAILED, False):
            print(f"\nprocess logs (in {tmp_path}):\n{spawned.describe()}")
        spawned.cleanup()


@pytest.fixture
def start_bank(tmp_path: Path) -> Iterator[Callable[..., BankProcess]]:
    """``start_bank(**options)`` starts a bank process; all are stopped at the end."""
    banks: list[BankProcess] = []

    def start(name: str = "bank", **options: Any) -> BankProcess:
        bank = BankProcess.start(tmp_path / f"{name}.db", **options)
        banks.append(bank)
        return bank

    try:
        yield start
    finally:
        for bank in banks:
            bank.stop()


@pytest.fixture
def make_world(
    tmp_path: Path, procs: Procs, payments: ModuleType, start_bank: Callable[..., BankProcess]
) -> Iterator[Callable[..., World]]:
    """``make_world(**bank_options)``: a database, a bank and room for workers."""
    worlds: list[World] = []

    def make(**bank_options: Any) -> World:
        world = World(tmp_path, start_bank(**bank_options), procs, payments)
        worlds.append(world)
        return world

    try:
        yield make
    finally:
        for world in worlds:
            world.close()
