"""Nothing is recorded that cannot be decoded (issue 9 item 15, issue 10 items 5-7).

A value that cannot make the round trip through the codec to the declared
type is refused before it is stored: at ``app.start`` for inputs, and as the
step's error (retried by its policy) for results. Each test feeds the engine
what a user's ordinary code produces: a NaN, a pydantic model with aliases,
computed fields, sets, secrets, bytes, deep nesting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest

import cairn
from cairn.codec import values
from cairn.store.records import EventType, RunStatus

ROOT = Path(__file__).resolve().parents[2]
FAST_RETRY = cairn.RetryPolicy(max_attempts=2, initial_delay=0.0, jitter=0.0)


class Account(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    user_name: str = pydantic.Field(alias="userName")
    balance: float = 0.0

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        return self.user_name.upper()


class Tagged(pydantic.BaseModel):
    tags: set[str]
    nested: dict[str, frozenset[int]] = {}


class Vault(pydantic.BaseModel):
    api_key: pydantic.SecretStr


class Blob(pydantic.BaseModel):
    name: str
    data: bytes


def _failure(app: cairn.App, run_id: str) -> dict[str, Any]:
    record = app.get_run(run_id)
    assert record.status is RunStatus.FAILED, record.status
    assert record.error is not None
    return record.error


# -- NaN and infinity -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_start_refuses_nan_and_infinity_and_stores_nothing(app: cairn.App, bad: float) -> None:
    @app.workflow(name="price")
    def price(ctx: cairn.Context, amount: float) -> float:
        return amount

    with pytest.raises(cairn.PayloadError, match="not a finite number"):
        app.start(price, bad)
    with pytest.raises(cairn.PayloadError, match="not a finite number"):
        app.start_json("price", {"amount": bad})
    with pytest.raises(cairn.PayloadError, match=r"value\['amount'\] is not a finite number"):
        app.start(price, amount=bad, run_id="r")
    assert app.list_runs() == []


def test_nan_step_result_is_the_steps_error_and_retried_by_policy(app: cairn.App) -> None:
    """Before: NaN was recorded as null, decoding it as float failed, and the
    run failed for good (``cairn retry`` replayed the same bad record)."""
    attempts: list[int] = []

    @app.step(retry=FAST_RETRY)
    def measure() -> float:
        attempts.append(1)
        return float("nan") if len(attempts) == 1 else 2.5

    @app.workflow(name="measure")
    def wf(ctx: cairn.Context) -> float:
        return measure()

    assert app.run(wf, run_id="m") == 2.5
    history = app.history("m")
    retried = [e for e in history if e.event is EventType.STEP_RETRIED]
    assert len(retried) == 1
    assert "not a finite number" in retried[0].detail["error"]["message"]  # type: ignore[index]
    assert "step 'measure'" in retried[0].detail["error"]["message"]  # type: ignore[index]
    completed = [e for e in history if e.event is EventType.STEP_COMPLETED]
    assert len(completed) == 1
    assert completed[0].payload is not None
    assert completed[0].payload.data == b"2.5"


def test_nan_step_result_without_retries_fails_clearly_and_records_nothing(app: cairn.App) -> None:
    @app.step()
    def measure() -> float:
        return float("nan")

    @app.workflow(name="measure")
    def wf(ctx: cairn.Context) -> float:
        return measure()

    with pytest.raises(cairn.RunFailed, match="not a finite number"):
        app.run(wf, run_id="m")
    assert not [e for e in app.history("m") if e.event is EventType.STEP_COMPLETED]


def test_start_refuses_an_input_the_worker_could_not_convert(app: cairn.App) -> None:
    """Before: the run was created, and failed on the worker."""

    @app.workflow(name="count")
    def count(ctx: cairn.Context, n: int, account: Account) -> int:
        return n

    with pytest.raises(cairn.PayloadError, match="input 'n' of workflow 'count'"):
        app.start(count, "seven", Account(userName="ada"))
    assert app.list_runs() == []
    handle = app.start(count, 7, Account(userName="ada"))  # a model with alias and computed field is fine
    assert app.resume(handle.run_id) == 7


# -- pydantic models ----------------------------------------------------------------------------


def test_pydantic_aliases_and_computed_fields_round_trip(app: cairn.App) -> None:
    @app.step()
    def open_account(name: str) -> Account:
        return Account(userName=name, balance=3.5)

    @app.workflow(name="accounts")
    def wf(ctx: cairn.Context, name: str) -> Account:
        return open_account(name)

    expected = Account(userName="ada", balance=3.5)
    assert app.run(wf, "ada", run_id="a") == expected
    assert app.run(wf, "ada", run_id="a") == expected  # replayed from the record
    assert app.get_run("a").status is RunStatus.COMPLETED
    # JSON from outside (the CLI's --input) may use the alias
    assert values.decode(b'{"userName": "ada", "balance": 3.5}', Account) == expected


def test_a_result_that_does_not_decode_into_the_declared_type_is_not_recorded(app: cairn.App) -> None:
    @app.step()
    def wrong() -> int:
        return "seven"  # type: ignore[return-value]

    @app.workflow(name="wrong")
    def wf(ctx: cairn.Context) -> int:
        return wrong()

    with pytest.raises(cairn.RunFailed, match=r"step 'wrong'.*cannot be recorded"):
        app.run(wf, run_id="w")
    assert not [e for e in app.history("w") if e.event is EventType.STEP_COMPLETED]


_HASH_SCRIPT = """
import pydantic
from cairn.codec import values
from cairn.engine.steps import input_hash

class Tagged(pydantic.BaseModel):
    tags: set[str]
    nested: dict[str, frozenset[str]] = {}

model = Tagged(tags={f"tag-{i}" for i in range(20)}, nested={"k": frozenset(f"v{i}" for i in range(20))})
print(input_hash((model,), {}), values.encode(model).decode())
"""


@pytest.mark.slow
def test_input_hash_of_a_model_with_sets_is_the_same_in_every_process() -> None:
    outputs = set()
    for seed in ("0", "1", "2", "3", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT / "src")}
        done = subprocess.run([sys.executable, "-c", _HASH_SCRIPT], capture_output=True, text=True, env=env,
                              timeout=60, check=True)
        outputs.add(done.stdout)
    assert len(outputs) == 1, outputs
    _, encoded = outputs.pop().split(" ", 1)
    assert json.loads(encoded)["tags"] == sorted(f"tag-{i}" for i in range(20))


def test_sets_round_trip_in_models(app: cairn.App) -> None:
    model = Tagged(tags={"b", "a"}, nested={"x": frozenset({3, 1})})
    assert values.decode(values.encode(model), Tagged) == model


# -- what cannot be recorded: a PayloadError naming step and field --------------------------------


def test_secret_str_is_refused_naming_the_field(app: cairn.App) -> None:
    @app.step()
    def load() -> Vault:
        return Vault(api_key=pydantic.SecretStr("sk-live-123"))

    @app.workflow(name="vault")
    def wf(ctx: cairn.Context) -> str:
        return load().api_key.get_secret_value()

    with pytest.raises(cairn.RunFailed):
        app.run(wf, run_id="v")
    error = _failure(app, "v")
    assert "step 'load'" in error["message"]
    assert "Vault.api_key" in error["message"]
    assert "SecretStr" in error["message"]


def test_secret_workflow_input_is_refused_at_start(app: cairn.App) -> None:
    @app.workflow(name="vault_in")
    def wf(ctx: cairn.Context, vault: Vault) -> None:
        return None

    with pytest.raises(cairn.PayloadError, match=r"Vault\.api_key.*SecretStr"):
        app.start(wf, Vault(api_key=pydantic.SecretStr("sk-live-123")))
    assert app.list_runs() == []


def test_non_utf8_bytes_in_a_model_name_step_and_field(app: cairn.App) -> None:
    @app.step()
    def fetch() -> Blob:
        return Blob(name="logo", data=b"\x89PNG\xff\xfe")

    @app.workflow(name="blob")
    def wf(ctx: cairn.Context) -> int:
        return len(fetch().data)

    with pytest.raises(cairn.RunFailed):
        app.run(wf, run_id="b")
    error = _failure(app, "b")
    assert error["type"] == "StepFailed"
    assert "step 'fetch'" in error["message"]
    assert "Blob.data" in error["message"]
    assert "UTF-8" in error["message"]


def test_text_with_a_lone_surrogate_is_a_payload_error_naming_the_step(app: cairn.App) -> None:
    """A step that returns text JSON cannot hold (a lone surrogate, as from
    a file name or an argument that is not UTF-8): the step fails with
    Cairn's error, the run ends failed, nothing half-recorded; and an input
    like it is refused when the run is started, before anything is stored."""
    @app.step()
    def name_of_a_file() -> str:
        return "report-\udcff.txt"

    @app.workflow(name="surrogate")
    def wf(ctx: cairn.Context, label: str) -> str:
        return name_of_a_file()

    with pytest.raises(cairn.RunFailed):
        app.run(wf, "ok", run_id="s")
    error = _failure(app, "s")
    assert "step 'name_of_a_file'" in error["message"]
    assert "not valid Unicode" in error["message"]
    with pytest.raises(cairn.PayloadError, match="not valid Unicode"):
        app.start(wf, "bad-\ud800", run_id="s2")
    assert app.store.get_run("s2") is None


def test_nesting_too_deep_is_a_payload_error_naming_the_step(app: cairn.App) -> None:
    @app.step()
    def deep() -> Any:
        value: list[Any] = []
        for _ in range(100_000):
            value = [value]
        return value

    @app.workflow(name="deep")
    def wf(ctx: cairn.Context) -> None:
        deep()

    with pytest.raises(cairn.RunFailed):
        app.run(wf, run_id="d")
    error = _failure(app, "d")
    assert "step 'deep'" in error["message"]
    assert "nested too deeply" in error["message"]
    assert "RecursionError" not in json.dumps(error)


# -- a write tool whose result cannot be recorded ----------------------------------------------------


def test_write_tool_with_an_unrecordable_result_needs_attention_not_failed(app: cairn.App) -> None:
    sent: list[int] = []

    @app.tool(effect="write")
    def transfer(amount: int) -> Any:
        sent.append(amount)
        return {"receipt": float("nan")}  # the money moved; its receipt cannot be recorded

    @app.workflow(name="pay")
    def wf(ctx: cairn.Context) -> Any:
        return transfer(5)

    app.start(wf, run_id="p")
    app.worker(concurrency=1, poll_interval=0.01).run(install_signals=False, max_idle=0.3)
    record = app.get_run("p")
    assert record.status is RunStatus.NEEDS_ATTENTION
    assert sent == [5]
    attention = [e for e in app.history("p") if e.event is EventType.RUN_NEEDS_ATTENTION][-1]
    assert "the effect happened but its result cannot be recorded" in attention.detail["why"]  # type: ignore[index]
    app.operator.resolve("p", 0, done=True, result={"receipt": "R-1"})
    assert app.resume("p") == {"receipt": "R-1"}
    assert sent == [5]  # never sent again
