"""A payout app whose ``pay`` tool can be left uncertain (see tests/cli/effects.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from cairn.engine.executor import execute
from cairn.store.records import RunStatus
from tests.cli.effects import build_app


@pytest.fixture
def app(tmp_path: Path) -> Iterator[cairn.App]:
    application = build_app(f"sqlite:///{tmp_path / 'cairn.db'}")
    yield application
    application.close()


@pytest.fixture
def bank(tmp_path: Path) -> dict[str, str]:
    return {"ledger": str(tmp_path / "ledger.jsonl"), "outage": str(tmp_path / "outage")}


def stuck_payment(app: cairn.App, bank: dict[str, str], mode: str, run_id: str = "pay-1") -> str:
    """A ``payout`` run parked in ``needs_attention``: ``pay`` raised
    ``TimeoutError`` after (``mode="after"``) or before applying the transfer."""
    Path(bank["outage"]).write_text(mode)
    app.start("payout", "ada", 40, bank["ledger"], bank["outage"], run_id=run_id)
    claim = app.store.claim_run(run_id, "w-test", 5.0, 5)
    assert claim is not None
    assert execute(app.runtime, claim, "w-test").status == "suspended"
    assert app.get_run(run_id).status is RunStatus.NEEDS_ATTENTION
    Path(bank["outage"]).unlink()  # the bank is back
    return run_id
