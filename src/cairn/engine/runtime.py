"""What an execution needs from its surroundings, bundled once per process."""

from __future__ import annotations

from dataclasses import dataclass, field

from cairn.codec.payloads import PayloadCodec
from cairn.engine.bundles import Registry
from cairn.engine.definitions import WorkflowDef
from cairn.engine.observe import Observer
from cairn.engine.schedules import Schedule
from cairn.memory.policy import MemoryPolicy
from cairn.security.secrets import Secrets
from cairn.store.contract import Store
from cairn.workspace.local import Workspaces


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
    #: where this process keeps runs' workspace directories (``engine.workspace``)
    workspaces: Workspaces = field(default_factory=Workspaces)
