"""The role and token a run was started with, as its executions read them.

A run started through the HTTP API (or ``cairn mcp serve``) with a token
records that token's role and id in its row (``NewRun.started_role``,
``started_token``); one started by the app's own code or the CLI records
them only when told (``app.start(..., started_role=...)``, ``cairn start
--role``); a schedule's tick records the role its declaration gives
(``app.schedule(..., role=...)``, none by default); a graph run's replay or
fork records the role of whoever replays or forks it (the HTTP token's, or
as told), never its origin's. Per-tool authorization by role (``engine.access``) reads them here,
from the store, once per execution: a run resumed on another worker, after
a crash or a week's wait, is authorized with the rights it started with,
never with the worker's. The database refuses any change of either column
(SQLite 0024, PostgreSQL 0033), so what is read once stays true.

Every reader of the two columns goes through ``started_with``; a child run
inherits its parent's pair (``inherited``), so starting a child is no way
to shed or gain rights.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

from cairn.store.contract import Store
from cairn.store.records import STARTED_ROLES

__all__ = ["NOBODY", "StartedWith", "inherited", "rank", "started_with"]


@dataclass(frozen=True, slots=True)
class StartedWith:
    """``role``: a token role (``None``: started without a token);
    ``token``: the token's public id."""

    role: str | None = None
    token: str | None = None


#: a run started without a token
NOBODY = StartedWith()
class Execution(Protocol):
    """What is read here of an execution (``engine.execution.Execution``,
    which imports this module: named by shape, not by import)."""

    @property
    def store(self) -> Store: ...

    @property
    def run_id(self) -> str: ...


_READ: weakref.WeakKeyDictionary[Execution, StartedWith] = weakref.WeakKeyDictionary()


def started_with(ex: Execution) -> StartedWith:
    """What ``ex``'s run was started with, read from its row at the first
    question of the execution (a missing row: nobody, so no rights)."""
    found = _READ.get(ex)
    if found is None:
        pair = ex.store.started_with(ex.run_id)
        found = NOBODY if pair is None else StartedWith(*pair)
        _READ[ex] = found
    return found


def inherited(ex: Execution) -> StartedWith:
    """What a child of ``ex``'s run is started with: its parent's pair."""
    return started_with(ex)


def rank(role: str | None) -> int:
    """A role's place in the order viewer < operator < admin < installation
    (-1: none, below them all)."""
    return STARTED_ROLES.index(role) if role in STARTED_ROLES else -1
