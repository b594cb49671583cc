"""Payload encoding: typed JSON, no pickle, large values to the artifact store."""

from __future__ import annotations

import dataclasses
import enum
import sqlite3
import sys
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pydantic
import pytest

import cairn
from cairn.codec import values
from cairn.store.records import EventType
from tests.timing import NAP


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Invoice:
    number: int
    issued: date
    due: datetime
    amount: Decimal
    blob: bytes
    id: UUID
    color: Color
    tags: tuple[str, ...]
    grace: timedelta


class Customer(pydantic.BaseModel):
    name: str
    vip: bool = False


def test_round_trip_of_supported_types() -> None:
    invoice = Invoice(1, date(2026, 1, 2), datetime(2026, 1, 2, 3, 4, tzinfo=UTC), Decimal("9.99"),
                      b"\x00\xff", uuid4(), Color.RED, ("a", "b"), timedelta(seconds=90))
    assert values.decode(values.encode(invoice), Invoice) == invoice
    customer = Customer(name="Ada", vip=True)
    assert values.decode(values.encode(customer), Customer) == customer
    assert values.decode(values.encode([customer]), list[Customer]) == [customer]


def test_encoding_is_deterministic() -> None:
    assert values.encode({"b": 1, "a": 2}) == values.encode({"a": 2, "b": 1}) == b'{"a":2,"b":1}'


def test_unsupported_values_fail_clearly() -> None:
    class Opaque:
        pass

    with pytest.raises(cairn.PayloadError, match="cannot encode"):
        values.encode(Opaque())


@pytest.mark.parametrize(
    "crafted",
    [
        b'{"__reduce__": ["os.system", ["echo pwned"]]}',
        b'{"py/object": "os.system", "$type": "subprocess.Popen"}',
        b'{"__class__": "builtins.eval", "args": ["__import__(\'os\')"]}',
        b'"\\u0000cos\\nsystem\\n(S\'echo\'\\ntR."',  # a pickle program smuggled as a string
    ],
)
def test_crafted_payloads_cannot_import_or_call(crafted: bytes) -> None:
    modules_before = set(sys.modules)
    plain = values.decode(crafted)  # untyped: stays plain JSON data
    assert isinstance(plain, dict | str)
    with pytest.raises(cairn.PayloadError):
        values.decode(crafted, Invoice)  # typed: must validate, never construct something else
    assert set(sys.modules) == modules_before  # nothing was imported


def test_undecodable_step_result_names_run_and_step(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/p.db")

    @app.step()
    def produce() -> int:
        return 5

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> int:
        value = produce()
        ctx.sleep(NAP)
        return value

    app.start(w, run_id="bad")
    claim = app.store.claim_run("bad", "x", 5.0, 5)
    assert claim is not None
    from cairn.engine.executor import execute

    assert execute(app.runtime, claim, "x").status == "suspended"
    # corrupt the recorded result behind the engine's back
    conn = sqlite3.connect(tmp_path / "p.db")
    conn.execute("UPDATE history SET payload = ? WHERE run_id = 'bad' AND position = 0", (b'"not an int"',))
    conn.commit()
    conn.close()
    # a recorded value that no longer decodes parks the run (issue 21): the code's type changed, or
    # the row did; either way an operator decides, and a deployed fix resumes it with cairn retry
    with pytest.raises(cairn.RunSuspended, match="incompatible") as parked:
        app.resume("bad")
    message = str(parked.value)
    assert "step 'produce' at position 0 of run 'bad'" in message
    app.close()


def test_large_values_go_to_the_artifact_store(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/big.db", inline_limit=1024)

    @app.step()
    def big() -> str:
        return "x" * 5000

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> int:
        return len(big())

    assert app.run(w, run_id="big") == 5000
    entry = next(e for e in app.history("big") if e.event is EventType.STEP_COMPLETED)
    assert entry.payload is not None
    assert entry.payload.data is None
    assert entry.payload.ref is not None
    artifact = tmp_path / "big.db.artifacts" / entry.payload.ref[:2] / entry.payload.ref
    assert artifact.read_bytes() == values.encode("x" * 5000)
    # a missing artifact is a clear error, not a crash
    with pytest.raises(cairn.PayloadError, match="missing"):
        app.store.get_artifact("0" * 64)
    app.close()


def test_workflow_inputs_are_validated_against_annotations(app: cairn.App) -> None:
    @app.workflow(name="greet")
    def greet(ctx: cairn.Context, customer: Customer, times: int = 1) -> str:
        return " ".join([f"hi {customer.name}"] * times)

    handle = app.start_json("greet", {"customer": {"name": "Ada"}, "times": 2})
    assert app.resume(handle.run_id) == "hi Ada hi Ada"
    with pytest.raises(cairn.PayloadError, match="times"):
        app.start_json("greet", {"customer": {"name": "Ada"}, "times": "many"})
    with pytest.raises(cairn.PayloadError, match="does not fit"):
        app.start_json("greet", {"nobody": 1})


def test_unencodable_workflow_result_fails_the_run_clearly(app: cairn.App) -> None:
    @app.workflow(name="leaky")
    def leaky(ctx: cairn.Context) -> Any:
        return object()

    with pytest.raises(cairn.RunFailed, match="cannot encode"):
        app.run(leaky, run_id="leak")
