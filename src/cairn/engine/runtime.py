"""What an execution needs from its surroundings, bundled once per process."""

from __future__ import annotations

from dataclasses import dataclass, field

from cairn.codec.payloads import PayloadCodec
from cairn.engine.bundles import Registry
from cairn.engine.definitions import WorkflowDef
from cairn.engine.schedules import Schedule
from cairn.memory.embedders import Embedder
from cairn.security.secrets import Secrets
from cairn.store.contract import Store


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
    #: embeds long-term memory items for search; ``cairn worker`` runs its indexer (``App(embedder=...)``)
    embedder: Embedder | None = None

    #: workflow versions, prompts, model settings and tools, and the bundles
    #: served (``engine.bundles``); ``workflows`` maps each name to its newest version
    registry: Registry = field(default_factory=Registry)
