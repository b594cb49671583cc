"""What an execution needs from its surroundings, bundled once per process."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from cairn.codec.payloads import PayloadCodec
from cairn.engine.bundles import Registry
from cairn.engine.definitions import WorkflowDef
from cairn.engine.observe import Observer
from cairn.engine.schedules import Schedule
from cairn.memory.policy import MemoryPolicy
from cairn.security.secrets import Secrets
from cairn.store.contract import Store
from cairn.workspace.local import Workspaces


class Handed:
    """Values an execution of this process computed and recorded only by
    reference, kept for the caller that drives the run here: a graph run
    records ``{"step": n}`` and its final state as checkpoint ``n``, which
    ``app.run`` would otherwise read back whole from the store (every
    checkpoint's appends: ~10% of a 300-super-step run's time). Keyed by
    ``(run id, epoch, what)``: only the holder that finished the run put the
    value under the run's final epoch. At most ``size`` are kept (a worker
    finishing runs for other processes never takes them)."""

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._values: OrderedDict[tuple[str, int, Any], Any] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: tuple[str, int, Any], value: Any) -> None:
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._size:
                self._values.popitem(last=False)

    def take(self, key: tuple[str, int, Any]) -> Any:
        """The value put under ``key`` (``None``: none), taken out."""
        with self._lock:
            return self._values.pop(key, None)


@dataclass(slots=True)
class Runtime:
    store: Store
    payloads: PayloadCodec
    workflows: dict[str, WorkflowDef] = field(default_factory=dict)
    #: a run taken over more often than this is quarantined
    max_recoveries: int = 5
    #: strict replay also compares the recorded arguments of each step
    check_inputs: bool = True
    #: how often one run may rewind after logical failures before it fails
    max_rewinds: int = 3
    #: resolves ``cairn.Secret`` references where they are used (``App(secrets=...)``)
    secrets: Secrets = field(default_factory=Secrets)
    #: the schedules declared on the app, by (tenant, name): the workers fire them
    schedules: dict[tuple[str, str], Schedule] = field(default_factory=dict)

    #: workflow versions, prompts, model settings and tools, and the bundles
    #: served (``engine.bundles``); ``workflows`` maps each name to its newest version
    registry: Registry = field(default_factory=Registry)
    #: told of every claim this process executes and of each entry it records
    #: (``engine.observe``; live spans and metrics); ``None``: nothing is
    #: observed and nothing is paid for it
    observer: Observer | None = None
    #: retention of the memory tiers and the embedder of search (``App(memory=...)``)
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    #: values recorded by reference that executions here hand to the caller driving the run
    handed: Handed = field(default_factory=Handed)
    #: where this process keeps runs' workspace directories (``engine.workspace``)
    workspaces: Workspaces = field(default_factory=Workspaces)
