"""When the PostgreSQL store runs a failed transaction again
(``postgres._again_after``): a deadlock victim or a serialization failure
(SQLSTATE class 40) while attempts are left, never any other error, never past
the last attempt, and an error a caller maps (``errors``) leaves as what it means."""

from __future__ import annotations

import pytest
from psycopg import errors as pg_errors

from cairn.errors import StoreError
from cairn.store import postgres
from cairn.store.postgres import _TX_ATTEMPTS, _again_after


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres.time, "sleep", lambda seconds: None)


@pytest.mark.parametrize("error", [pg_errors.DeadlockDetected, pg_errors.SerializationFailure])
def test_a_rollback_victim_runs_again_until_the_last_attempt(error: type[Exception]) -> None:
    for attempt in range(1, _TX_ATTEMPTS):
        _again_after(error("victim"), attempt, None)  # returns: the caller tries again
    with pytest.raises(error):
        _again_after(error("victim"), _TX_ATTEMPTS, None)


@pytest.mark.parametrize("error", [pg_errors.UniqueViolation, pg_errors.QueryCanceled, RuntimeError])
def test_any_other_error_is_raised_at_once(error: type[Exception]) -> None:
    with pytest.raises(error):
        _again_after(error("not a victim"), 1, None)


def test_an_error_the_caller_maps_leaves_as_what_it_means() -> None:
    def errors(exc: Exception) -> BaseException | None:
        return StoreError("meant") if isinstance(exc, pg_errors.RaiseException) else None

    with pytest.raises(StoreError, match="meant"):
        _again_after(pg_errors.RaiseException("LGT01"), 1, errors)
    _again_after(pg_errors.DeadlockDetected("victim"), 1, errors)  # not mapped: run again
