"""``sealed._replaced``: what a sealed store's opening and sealing of a run
record use in place of ``dataclasses.replace`` (issue 25, 2026-12-07): the
same record, without running ``__init__`` or ``__post_init__`` again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import cairn
from cairn.errors import InvalidArgument
from cairn.security.keyring import LocalKeyring
from cairn.store.records import NewRun, Payload, RunRecord
from cairn.store.sealed import _replaced


@dataclasses.dataclass(frozen=True, slots=True)
class One:
    only: int


def test_replaced_equals_dataclasses_replace_and_leaves_the_record_as_it_was(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path / 'x.db'}", keyring=LocalKeyring({"k1": b"k" * 32}, "k1"))

    @app.workflow(name="w")
    def w(ctx: cairn.Context, text: str) -> str:
        return text

    run = app.store.get_run(app.start("w", "hello").run_id)  # opened by the sealed store: _replaced
    assert isinstance(run, RunRecord)
    assert b"hello" in run.input.data
    raw = app.store.inner.get_run(run.run_id)  # type: ignore[attr-defined]
    assert raw.input.data != run.input.data  # sealed as stored, opened as read
    changes = {"input": Payload(b"{}"), "error": {"e": 1}, "priority": 7}
    before = dataclasses.astuple(raw)
    assert _replaced(raw, **changes) == dataclasses.replace(raw, **changes)
    assert dataclasses.astuple(raw) == before
    assert _replaced(raw) == raw
    assert _replaced(raw) is not raw
    assert _replaced(One(1), only=2) == One(2)
    assert _replaced(One(3)) == One(3)
    with pytest.raises(KeyError):
        _replaced(One(1), other=2)
    app.close()


def test_replaced_does_not_check_a_new_run_again() -> None:
    run = NewRun(run_id="r1", workflow="w", workflow_version="1", tenant="t", thread_id=None,
                 input=Payload(b"{}"), priority=3)
    sealed = Payload(b"\xce sealed")
    copied = _replaced(run, input=sealed)
    assert copied == dataclasses.replace(run, input=sealed)
    object.__setattr__(run, "priority", "high")  # as if it had never been checked
    assert _replaced(run, input=sealed).priority == "high"  # no __post_init__ run again
    with pytest.raises(InvalidArgument):
        dataclasses.replace(run, input=sealed)
