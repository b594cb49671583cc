"""Retention policies as an operator sets them, and the controller run on
demand (issue 26 part 3): ``cairn retention set|ls|rm|plan|run``, and
``App.operator.retention`` in Python.

A policy change is an operator action: the store records its actor
(``updated_by``) with the policy, in the transaction that checks the whole
set (``store.retention.check``), and a removal is logged with its actor
(nothing of the policy is left to carry it), like a memory deletion.
``plan`` and ``run`` are the controller's (``worker.retention``): ``run``
takes the controller's lease like a worker's side loop does, so it never
deletes alongside one.
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager
from typing import Any

from cairn.api.actors import acting
from cairn.errors import InvalidArgument
from cairn.store import retention as rt
from cairn.store.contract import Store
from cairn.store.retention import Policy
from cairn.worker.retention import Controller, Plan

log = logging.getLogger("cairn.retention")


class Retention:
    """The retention policies of one store, acted on as ``actor``."""

    def __init__(self, store: Store, actor: str) -> None:
        self._store = store
        self.actor = actor

    def set(self, data_class: str, keep: float | str | None, *, tenant: str | None = None,
            workflow: str | None = None) -> Policy:
        """Keep ``data_class`` of ``tenant``'s runs of ``workflow`` (``None``:
        every one without a policy of its own) for ``keep`` (seconds, a period
        such as ``"30d"``, or ``None``/``"forever"``). ``InvalidArgument`` for
        a bad class, period or scope, or an audit policy shorter than the
        history it covers; nothing is stored then."""
        checked = rt.policy(tenant, workflow, data_class, keep)
        with self._acting(checked, "retention.set", {"keep": checked.keep}):
            stored = self._store.set_retention_policy(checked, self.actor)
        log.info("retention policy set by %s: %s", self.actor, stored.describe())
        return stored

    def policies(self, tenant: str | None = None) -> list[Policy]:
        """The policies of ``tenant`` and the installation's defaults (``*``)."""
        return self._store.retention_policies(tenant)

    def remove(self, data_class: str, *, tenant: str | None = None, workflow: str | None = None) -> bool:
        """Remove a policy (refused if audit records would then outlive
        less than their history); false when there was none."""
        checked = rt.policy(tenant, workflow, data_class, None)
        with self._acting(checked, "retention.remove", {}):
            gone = self._store.remove_retention_policy(checked.tenant, checked.workflow, checked.data_class)
        if gone:
            log.info("retention policy removed by %s: %s of tenant %s workflow %s", self.actor,
                     checked.data_class, checked.tenant, checked.workflow)
        return gone

    def plan(self) -> Plan:
        """What a controller pass now would delete, class by class (changes nothing)."""
        return Controller(self._store, self._holder()).plan()

    def run(self, *, batch: int = 500) -> Plan:
        """One controller pass now, holding the controller's lease;
        ``InvalidArgument`` if a worker's controller holds it."""
        done = Controller(self._store, self._holder(), batch=batch).run()
        if done is None:
            raise InvalidArgument("another retention controller (a worker's) holds the lease: it "
                                  "enforces the policies now; try again once its pass is over")
        return done

    def _acting(self, policy: Policy, action: str, change: dict[str, Any]) -> AbstractContextManager[None]:
        """The operator log's record of a policy change (the installation's
        defaults, tenant ``*``, under the installation's log, ``''``)."""
        tenant = "" if policy.tenant == "*" else policy.tenant
        return acting(self._store, self.actor, tenant, "retention", f"{policy.workflow}/{policy.data_class}",
                      action, {"tenant": policy.tenant, "workflow": policy.workflow,
                               "class": str(policy.data_class), **change})

    def _holder(self) -> str:
        return f"{self.actor}#{os.getpid()}"


__all__ = ["Retention"]
