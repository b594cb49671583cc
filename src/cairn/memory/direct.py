"""Memory outside any run: an operator's (``Operator.memory``) or an
integration's (the LangGraph store adapter). Reads and writes go straight to
the store, each write in its own transaction, recorded with the ``actor``
that made it (the provenance of a memory written outside a run)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cairn.codec.payloads import PayloadCodec
from cairn.errors import InvalidArgument
from cairn.memory.api import Memory
from cairn.memory.policy import MemoryPolicy
from cairn.store.contract import Store
from cairn.store.memrecords import MemoryWrite, Provenance


class DirectChannel:
    """Plain reads; each write committed at once as ``actor``."""

    def __init__(self, store: Store, codec: PayloadCodec, policy: MemoryPolicy, tenant: str, actor: str,
                 *, thread_id: str | None = None) -> None:
        if not tenant:
            raise InvalidArgument("memory needs a tenant")
        self.store = store
        self.codec = codec
        self.policy = policy
        self.tenant = tenant
        self.actor = actor
        self.run_id: str | None = None
        self.thread_id = thread_id

    def read(self, name: str, args: tuple[Any, ...], result_type: Any, read: Callable[[], Any]) -> Any:
        return read()

    def write(self, name: str, args: tuple[Any, ...], write: MemoryWrite) -> None:
        self.store.write_memory(self.tenant, (write,), Provenance(actor=self.actor))


def direct_memory(store: Store, codec: PayloadCodec, policy: MemoryPolicy, tenant: str, actor: str) -> Memory:
    """The memory of ``tenant`` as ``actor`` sees and writes it."""
    return Memory(DirectChannel(store, codec, policy, tenant, actor))


__all__ = ["DirectChannel", "direct_memory"]
