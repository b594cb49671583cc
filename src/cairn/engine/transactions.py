"""Transactional steps: a step whose body runs SQL on the store's own database,
inside the transaction that records the step (``@app.transaction``).

A plain step that writes a row to the user's database and then records its
result commits twice: a crash in between leaves the row without the record,
and the step runs again on recovery (two orders). Here the body gets a
``cairn.Tx`` on the store's connection, inside ``Store.transact``: the fence,
the user's statements, the encoded result and the journal entry are one
transaction, so a crash anywhere leaves both or neither, and replay returns
the recorded result without running the body (docs/design.md,
"Transactional steps").

The protocol is a step's (``engine.steps``), with one difference: the
function it asks its driver to call is the whole transaction, not the bare
body, since the body must run inside it. Bodies are sync only: a body holds
the database's write transaction (on SQLite the one writer lock of the
database), and an ``await`` inside it would hold that lock while waiting
for something else. A transaction called from an ``async def`` workflow is
called without ``await``, like a sync step, and blocks its event loop for as
long as its body runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from cairn import faults
from cairn.engine.definitions import StepDef
from cairn.engine.drive import Invoke, Protocol, run_sync
from cairn.engine.execution import CURRENT, Call, Execution
from cairn.engine.steps import STEP_INFO, input_hash
from cairn.errors import CairnError, StoreError, TransactionMisuse
from cairn.faults import fault_point
from cairn.retry import RetryPolicy
from cairn.store.records import Payload
from cairn.store.transactions import Tx

P = ParamSpec("P")
R = TypeVar("R")

#: the ``step_kind`` of a transactional step's journal entries
KIND = "transaction"


def build(fn: Callable[..., Any], name: str | None, retry: RetryPolicy) -> StepDef:
    """What ``@app.transaction`` records about ``fn``: a step definition,
    refused at decoration if it cannot be a transaction's body."""
    what = f"transaction {name or fn.__qualname__}"
    if inspect.iscoroutinefunction(fn):
        raise TypeError(f"{what} is async: a transaction's body must be sync (it holds the database's "
                        "write transaction; an await there would hold that lock while waiting)")
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise TypeError(f"{what} must take the transaction handle (cairn.Tx) as its first parameter")
    definition = StepDef.build(fn, name, retry)
    if definition.secrets is not None:
        raise TypeError(f"{what} takes a SecretValue parameter: a transaction's body talks to Cairn's own "
                        "database only; resolve secrets in a step or tool")
    return definition


class Transaction(Generic[P, R]):
    """A function made into a transactional step by ``@app.transaction``.

    The function takes a ``cairn.Tx`` first; the workflow calls it without
    one (``place_order(item)``), and Cairn passes the handle of the step's
    transaction. Outside a workflow there is no transaction to run it in:
    call ``.fn(tx, ...)`` with a handle of your own to unit-test the body.
    """

    def __init__(self, definition: StepDef) -> None:
        self.definition = definition
        self.fn = definition.fn
        functools.update_wrapper(self, definition.fn)
        self._what = f"transaction {definition.name!r}"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        execution = CURRENT.get(None)
        if execution is None:
            raise CairnError(f"{self._what} was called outside a workflow: a transactional step runs in "
                             "the transaction of its journal record (call .fn(tx, ...) to test the body)")
        result: R = run_sync(_journaled(execution, self.definition, args, kwargs, self._what))
        return result


class _BodyFailed(BaseException):
    """Carries the body's own exception out of the store's transaction, so
    that an ``OSError`` the body raised is its failure (by its retry policy)
    and not taken for the database's (which abandons the execution)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _journaled(
    execution: Execution, definition: StepDef, args: tuple[Any, ...], kwargs: dict[str, Any], what: str
) -> Protocol[Any]:
    """Replay the recorded outcome, or run the transaction once: its body,
    the encoding of its result and the record, committed together."""
    call = execution.begin(KIND, definition.name, input_hash(args, kwargs, what))
    if call.recorded is not None:
        return execution.replay(call, definition.result_type)
    token = STEP_INFO.set((execution.run, definition.name, call.position, call.attempt,
                           execution.journal.generation(call.position)))
    try:
        value = yield Invoke(_run, (execution, call, definition, args, kwargs), None, None, what)
    except TransactionMisuse as exc:  # the same code would do it again: never retried
        execution.fail_call(call, exc, False, None)
    except Exception as exc:
        execution.fail_by_policy(call, exc, definition.retry)
    finally:
        STEP_INFO.reset(token)
    return value


def _run(
    execution: Execution, call: Call, definition: StepDef, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    def body(tx: Tx) -> tuple[Payload, Any]:
        try:
            value = definition.fn(tx, *args, **kwargs)
            if faults.ARMED:
                fault_point("transaction.after_body")
            # Encoded inside the transaction: a result that cannot be recorded
            # rolls the user's rows back with it (the step's failure).
            return execution.prepare(call, value, definition.result_type)
        except StoreError:
            raise  # the database failed under the handle: the execution's problem
        except Exception as exc:
            raise _BodyFailed(exc) from None

    try:
        return execution.transact(call, body)
    except _BodyFailed as failed:
        raise failed.error from None


__all__ = ["KIND", "Transaction", "build"]
