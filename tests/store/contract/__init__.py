"""The store contract suite: every backend must pass all of it.

The suite is split by topic, one module each (runs, claims, children,
leases, fencing, operator, attention, budgets, halt, artifacts, prune,
invariants); ``StoreContract`` brings them together, and the helpers live in
``helpers``. Their names are re-exported here, so ``from tests.store.contract
import ...`` works as it did when the suite was one module.

A backend's test module subclasses ``StoreContract`` and provides two
fixtures: ``clock`` (a ``FakeClock``) and ``store`` (a fresh, empty store
built with that clock). The tests speak only through the ``Store`` protocol,
so they pin the documented domain rules, never one backend's internals.

Time never passes by itself here: tests move ``clock`` explicitly, which makes
lease expiry and timers deterministic.
"""

from __future__ import annotations

from tests.store.contract.approvals import ApprovalsContract
from tests.store.contract.artifacts import ArtifactsContract
from tests.store.contract.attention import AttentionContract
from tests.store.contract.budgets import BudgetsContract
from tests.store.contract.children import ChildrenContract
from tests.store.contract.claims import ClaimsContract
from tests.store.contract.fencing import FencingContract
from tests.store.contract.halt import HaltContract
from tests.store.contract.helpers import (
    FENCED_OPS,
    HOLDER_CASES,
    LEASE,
    LOSS_SCENARIOS,
    SECURITY_ERROR,
    STATES,
    WF,
    FakeClock,
    assert_gap_free,
    claim,
    claimable_ids,
    ev,
    exercise_every_writer,
    family,
    finish,
    halt,
    intent,
    needs_attention,
    new_run,
    park,
    put_in_state,
    running,
    types,
)
from tests.store.contract.invariants import InvariantsContract
from tests.store.contract.leases import LeasesContract
from tests.store.contract.mailbox import MailboxContract
from tests.store.contract.operator import OperatorContract
from tests.store.contract.prune import PruneContract
from tests.store.contract.runs import RunsContract


class StoreContract(
    RunsContract,
    ClaimsContract,
    ChildrenContract,
    LeasesContract,
    FencingContract,
    OperatorContract,
    AttentionContract,
    BudgetsContract,
    HaltContract,
    ArtifactsContract,
    PruneContract,
    InvariantsContract,
    MailboxContract,
    ApprovalsContract,
):
    """Subclass and provide ``store`` and ``clock`` fixtures (see module doc)."""


__all__ = [
    "FENCED_OPS",
    "HOLDER_CASES",
    "LEASE",
    "LOSS_SCENARIOS",
    "SECURITY_ERROR",
    "STATES",
    "WF",
    "FakeClock",
    "StoreContract",
    "assert_gap_free",
    "claim",
    "claimable_ids",
    "ev",
    "exercise_every_writer",
    "family",
    "finish",
    "halt",
    "intent",
    "needs_attention",
    "new_run",
    "park",
    "put_in_state",
    "running",
    "types",
]
