"""The memory API, written once over a *channel* that says how reads and
writes happen where it is used:

* in a step or tool body (``op.memory``, ``step_info().memory``): writes are
  buffered and commit with the step's journal entry; reads go to the store
  (a body does not see its own buffered writes: they exist once it is
  recorded);
* in workflow code (``ctx.memory``): every read and every write is a
  journaled call, so replay sees what the first execution saw and a write
  commits with its own entry;
* for an operator (``Operator.memory``): straight to the store, with the
  actor recorded.

Values are JSON (the codec layer: large ones are offloaded to the artifact
store as payloads are); namespaces are tuples of labels (``store.namespaces``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cairn.codec.payloads import PayloadCodec
from cairn.errors import CairnError, InvalidArgument
from cairn.memory.policy import MemoryPolicy
from cairn.store.contract import Store
from cairn.store.memrecords import (
    ItemDelete,
    ItemPut,
    MemoryItem,
    MemoryWrite,
    RunDelete,
    RunMemory,
    RunPut,
    ThreadAppend,
    ThreadCompact,
    ThreadMessage,
)
from cairn.store.namespaces import decode_namespace, encode_namespace, encode_prefix
from cairn.store.records import check_subject


@dataclass(frozen=True, slots=True)
class Item:
    """A long-term item: its value (JSON), metadata, version and provenance
    (the run, position and operation that wrote it, or the operator)."""

    namespace: tuple[str, ...]
    key: str
    value: Any
    metadata: dict[str, Any] | None
    version: int
    created_at: float
    updated_at: float
    expires_at: float | None
    index_text: str | None = None
    run_id: str | None = None
    position: int | None = None
    operation_id: str | None = None
    actor: str | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a thread (``kind``: ``message`` or ``summary``)."""

    index: int
    kind: str
    value: Any
    created_at: float
    run_id: str | None = None
    position: int | None = None
    operation_id: str | None = None
    actor: str | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    item: Item
    score: float


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The best items for a query, and how many items in scope are not
    indexed yet (their embedding is pending): search never hides that."""

    hits: list[Hit]
    unindexed: int


class Channel(Protocol):
    """How a ``Memory`` reads and writes (see the module doc)."""

    store: Store
    codec: PayloadCodec
    policy: MemoryPolicy
    tenant: str
    run_id: str | None
    thread_id: str | None

    def read(self, name: str, args: tuple[Any, ...], result_type: Any, read: Callable[[], Any]) -> Any:
        """The value of ``read()`` (journaled in a workflow)."""
        ...

    def write(self, name: str, args: tuple[Any, ...], write: MemoryWrite) -> None:
        """Apply ``write`` (buffered in a step, journaled in a workflow)."""
        ...


class Memory:
    """Run, thread and long-term memory of one tenant (and run, if any)."""

    def __init__(self, channel: Channel) -> None:
        self._c = channel

    # -- long-term items --------------------------------------------------------------

    def put(
        self, namespace: Sequence[str], key: str, value: Any, *, index: str | None = None,
        metadata: Mapping[str, Any] | None = None, ttl: float | None = None, subject: str | None = None,
    ) -> None:
        """Put ``value`` under ``key`` of ``namespace`` (a new version).
        ``index``: the text semantic search embeds (``None``: not searchable).
        ``ttl``: seconds it lives (default: the namespace's ``Retention``).
        ``subject``: whose data it is (erasure by subject); default: the
        writing run's subject."""
        check_subject(subject)
        ns = _ns(namespace)
        _check_key(key)
        if ttl is not None and not ttl > 0:
            raise InvalidArgument(f"a memory TTL must be a positive number of seconds, not {ttl!r}")
        if ttl is None:
            ttl = self._c.policy.for_namespace(namespace).ttl
        meta = None if metadata is None else dict(metadata)
        payload, _ = self._c.codec.dump(value)
        if meta is not None:
            self._c.codec.dump(meta)  # refused early if it is not JSON
        given = (list(namespace), key, value, index, meta, ttl) + ((subject,) if subject is not None else ())
        self._c.write("put", given, ItemPut(ns, key, payload, meta, index, ttl, subject))

    def get(self, namespace: Sequence[str], key: str) -> Item | None:
        """The live item (``None``: absent or expired)."""
        ns = _ns(namespace)
        refresh = self._c.policy.for_namespace(namespace).refresh_on_read

        def read() -> Item | None:
            found = self._c.store.memory_item(self._c.tenant, ns, key, refresh=refresh)
            return None if found is None else item_of(found, self._c.codec)

        result: Item | None = self._c.read("get", (list(namespace), key), Item | None, read)
        return result

    def delete(self, namespace: Sequence[str], key: str) -> None:
        self._c.write("delete", (list(namespace), key), ItemDelete(_ns(namespace), key))

    def list(self, prefix: Sequence[str] = (), *, limit: int = 100) -> list[Item]:
        """Live items under the namespace ``prefix``, by namespace and key."""
        encoded = _ns(prefix, prefix=True)

        def read() -> list[Item]:
            found = self._c.store.memory_items(self._c.tenant, encoded, limit=limit)
            return [item_of(i, self._c.codec) for i in found]

        result: list[Item] = self._c.read("list", (list(prefix), limit), list[Item], read)
        return result

    def search(
        self, prefix: Sequence[str], query: str, *, k: int = 10, filter: Mapping[str, Any] | None = None
    ) -> SearchResult:
        """The ``k`` items under ``prefix`` whose index text is nearest to
        ``query`` (the policy's embedder), with ``filter`` on metadata."""
        encoded = _ns(prefix, prefix=True)
        embedder = self._c.policy.embedder
        store = self._c.store
        if embedder is None:
            raise CairnError("memory search needs an embedder: App(memory=MemoryPolicy(embedder=...))")

        def read() -> SearchResult:
            [vector] = embedder.embed([query])
            found = store.search_memory(self._c.tenant, encoded, vector, k, filter, embedder=embedder.name)
            hits = []
            for hit in found.hits:
                item = store.memory_item(self._c.tenant, hit.namespace, hit.key)
                if item is not None:
                    hits.append(Hit(item_of(item, self._c.codec), float(hit.score)))
            return SearchResult(hits, int(found.unindexed))

        result: SearchResult = self._c.read("search", (list(prefix), query, k, filter), SearchResult, read)
        return result

    # -- the other tiers ----------------------------------------------------------------

    @property
    def run(self) -> RunScratch:
        """This run's own memory (deleted with the run)."""
        if self._c.run_id is None:
            raise CairnError("run memory exists only inside a run")
        return RunScratch(self._c, self._c.run_id)

    def thread(self, thread_id: str | None = None, *, ttl: float | None = None) -> Thread:
        """Thread memory: of ``thread_id``, default the run's thread. ``ttl``:
        the thread's retention from its next append on (default: the policy's)."""
        chosen = thread_id if thread_id is not None else self._c.thread_id
        if not chosen:
            raise InvalidArgument("no thread: the run has no thread_id and none was given")
        _check_key(chosen, "a thread id")
        if ttl is not None and not ttl > 0:
            raise InvalidArgument(f"a memory TTL must be a positive number of seconds, not {ttl!r}")
        return Thread(self._c, chosen, ttl)


class RunScratch:
    """A run's scratch keys: JSON values, deleted with the run."""

    def __init__(self, channel: Channel, run_id: str) -> None:
        self._c = channel
        self._run_id = run_id

    def put(self, key: str, value: Any) -> None:
        _check_key(key)
        payload, _ = self._c.codec.dump(value)
        self._c.write("run.put", (key, value), RunPut(key, payload))

    def get(self, key: str, default: Any = None) -> Any:
        def read() -> Any:
            found = self._c.store.run_memory(self._run_id, key, tenant=self._c.tenant)
            return [self._c.codec.load(found[0].value, what=f"run memory {key!r}")] if found else []

        found: list[Any] = self._c.read("run.get", (key,), list[Any], read)
        return found[0] if found else default

    def delete(self, key: str) -> None:
        self._c.write("run.delete", (key,), RunDelete(key))

    def items(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            found = self._c.store.run_memory(self._run_id, tenant=self._c.tenant)
            return {m.key: self._c.codec.load(m.value, what=f"run memory {m.key!r}") for m in found}

        result: dict[str, Any] = self._c.read("run.items", (), dict[str, Any], read)
        return result


class Thread:
    """The ordered messages of one thread, shared by the runs of the thread."""

    def __init__(self, channel: Channel, thread_id: str, ttl: float | None = None) -> None:
        self._c = channel
        self.thread_id = thread_id
        self._ttl = ttl if ttl is not None else channel.policy.threads.ttl

    def append(self, *messages: Any) -> None:
        """Append ``messages`` in order (each a JSON value)."""
        payloads = tuple(self._c.codec.dump(m)[0] for m in messages)
        self._c.write("thread.append", (self.thread_id, list(messages), self._ttl),
                      ThreadAppend(self.thread_id, payloads, self._ttl))

    def window(self, last: int | None = None, *, after: int = -1, limit: int = 1000) -> list[Message]:
        """The ``last`` messages, or those after index ``after`` (at most ``limit``), in order."""
        if last is not None and last < 1:
            raise InvalidArgument(f"a window of the last {last} messages is empty")
        refresh = self._c.policy.threads.refresh_on_read

        def read() -> list[Message]:
            found = self._c.store.thread_messages(self._c.tenant, self.thread_id, after=after, last=last,
                                                  limit=limit, refresh=refresh)
            return [message_of(m, self._c.codec) for m in found]

        result: list[Message] = self._c.read("thread.window", (self.thread_id, last, after, limit),
                                             list[Message], read)
        return result

    def compact(self, upto: int, summary: Any) -> None:
        """Replace the messages with index < ``upto`` by one ``summary``
        message (at index ``upto - 1``): the compaction hook, e.g. with a
        summary a step computed from ``window(...)``."""
        payload, _ = self._c.codec.dump(summary)
        self._c.write("thread.compact", (self.thread_id, upto, summary),
                      ThreadCompact(self.thread_id, upto, payload))

    def compact_with(self, keep: int, summarize: Callable[[list[Message]], Any]) -> bool:
        """Compact everything but the last ``keep`` messages with
        ``summarize(messages)`` (in a workflow, make it a step so its result
        is journaled); false when there is nothing to compact."""
        messages = self.window()
        if len(messages) <= keep + 1:
            return False
        older = messages[: len(messages) - keep]
        self.compact(older[-1].index + 1, summarize(older))
        return True


def item_of(item: MemoryItem, codec: PayloadCodec) -> Item:
    """The user's view of a stored item (its value decoded as JSON)."""
    p = item.provenance
    value = codec.load(item.value, what=f"memory item {item.key!r}")
    return Item(decode_namespace(item.namespace), item.key, value, item.metadata, item.version,
                item.created_at, item.updated_at, item.expires_at, item.index_text, p.run_id, p.position,
                p.operation_id, p.actor, item.tenant)


def message_of(message: ThreadMessage, codec: PayloadCodec) -> Message:
    p = message.provenance
    value = codec.load(message.value, what=f"message {message.index} of thread {message.thread_id!r}")
    return Message(message.index, message.kind, value, message.created_at, p.run_id, p.position,
                   p.operation_id, p.actor)


def run_memory_value(entry: RunMemory, codec: PayloadCodec) -> Any:
    return codec.load(entry.value, what=f"run memory {entry.key!r}")


def _check_key(key: str, what: str = "a memory key") -> None:
    """Keys, labels and thread ids are text on both backends: PostgreSQL
    text cannot hold NUL, so neither backend takes it (one behaviour)."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{what} must be a non-empty string, not {key!r}")
    if "\x00" in key:
        raise InvalidArgument(f"{what} {key!r} contains NUL")


def _ns(labels: Sequence[str], *, prefix: bool = False) -> str:
    encoded = encode_prefix(labels) if prefix else encode_namespace(labels)
    for label in labels:
        _check_key(label, "a namespace label")
    return encoded


__all__ = ["Channel", "Hit", "Item", "Memory", "Message", "RunScratch", "SearchResult", "Thread",
           "item_of", "message_of"]
