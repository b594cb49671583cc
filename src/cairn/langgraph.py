"""LangGraph's ``BaseCheckpointSaver`` on Cairn's store (issue 24, part 1).

``CairnSaver(app, tenant="acme")`` (or a store, or a store URL) lets a
LangGraph graph keep its checkpoints, pending writes and metadata in Cairn's
SQLite or PostgreSQL database: ``graph.compile(checkpointer=CairnSaver(app))``.
The saver is bound to one tenant: every row it writes or reads is that
tenant's, so another tenant's thread is "not found" (and on PostgreSQL a
tenant's role is held to its grants by row-level security as well).

Storage is incremental without the graph opting in to LangGraph's delta
channels (``cairn.store.checkpointsql``): values are stored once per thread
by digest (compressed when long), a list channel that grew stores only its
new items against an earlier version chosen so that a read walks about
log2(versions) rows (``next_base``; the value a node wrote and the item
appended to the list are the same row), and a channel whose value is not a
list is held by the checkpoint's own row (``INLINE``), not a row of its own;
on PostgreSQL every other version of a list is too, as a tail over the last
version stored as a row (``TAIL``).

Writes are fenced: the saver that wrote a thread and lost it to another
saver (another process took it since) is refused with ``ThreadTaken``, so
two processes never fork a thread's chain (``cairn.store.checkpointsql``).

Decoding is guarded: the default serializer is LangGraph's
``JsonPlusSerializer`` with a strict msgpack allowlist (LangGraph's safe
types plus ``allowlist=``), never its pickle fallback; a serializer that
allows pickle or every module is refused; a stored row of type ``pickle`` is
refused, and a msgpack row is scanned before it is decoded, so a constructor
or method call outside the allowlist is refused rather than executed or
silently turned into its raw arguments. A row that cannot be decoded raises
``UnreadableCheckpoint`` naming the checkpoint, never ``None``.

Requires ``langgraph`` (the ``langgraph`` extra; ``bench`` and ``dev`` have it too).
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import hashlib
import itertools
import operator
import secrets
import threading
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from cairn.errors import InvalidArgument, MissingExtra, UnreadableCheckpoint
from cairn.graph.diff import Change
from cairn.graph.diff import diff as state_diff
from cairn.lgdictionary import MARK as DICT_MARK
from cairn.lgdictionary import Dictionaries
from cairn.security.envelope import Place, SealError, deflate_raw
from cairn.store import open_store
from cairn.store.checkpointsql import (
    REF_SIZE,
    BlobRow,
    CheckpointRow,
    Holder,
    Named,
    Snapshot,
    SQLCheckpoints,
    Stale,
    ThreadKey,
    ValueRow,
    WriteRow,
    is_literal,
    join_names,
    literal,
    literal_bytes,
    pack_refs,
    unpack_refs,
)
from cairn.store.contract import Store
from cairn.store.sealed import SealedStore
from cairn.store.sealing import Sealer

try:
    import ormsgpack
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde import _msgpack as lg_msgpack
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
    from langgraph.checkpoint.serde.jsonplus import (
        EXT_CONSTRUCTOR_KW_ARGS,
        EXT_CONSTRUCTOR_POS_ARGS,
        EXT_CONSTRUCTOR_SINGLE_ARG,
        EXT_DELTA_SNAPSHOT,
        EXT_METHOD_SINGLE_ARG,
        EXT_NUMPY_ARRAY,
        EXT_PYDANTIC_V1,
        EXT_PYDANTIC_V2,
        JsonPlusSerializer,
    )
except ImportError as exc:
    raise MissingExtra("cairn.langgraph", "langgraph") from exc

#: A list channel's chain of bases is restated whole once it is this deep,
#: so a read walks at most this many rows per channel (a restatement costs
#: 8 bytes per item, not the items). A saver's own appends keep chains far
#: shorter (``Spine``): about log2 of the list's versions.
MAX_CHAIN = 256
#: A list read as a chain of this many rows or more is restated whole by the
#: reader's next version of it, not stored against it: each saver that reads
#: a thread and writes it (a run resumed by a new execution every turn) adds
#: a row on top of the one it read, and a read walks every row of a chain.
READ_CHAIN = 32
#: How many channels' last known list (version, items, their digests) a saver keeps.
LIST_CACHE = 256
#: threads whose last forget a saver keeps apart (``CairnSaver._forgot``); past it, it forgets all
GENS_KEPT = 4096
#: when a saver last forgot a thread: (its last forget of everything, of the thread; 0: never)
Gen = tuple[int, int]
#: How many value rows a saver remembers committing (``CairnSaver._stored``).
STORED_CACHE = 1024
#: How many listed checkpoints are read in one transaction (``list``'s pages).
LIST_PAGE = 16
#: Serializer types a row may have; anything else (``pickle`` above all) is refused.
KNOWN_TYPES = frozenset({"null", "bytes", "bytearray", "json", "msgpack"})
#: A value or checkpoint this long is stored zlib-compressed (its type
#: prefixed ``ZLIB``) when that saves at least ``COMPRESS_GAIN`` bytes: a
#: 1 KB message of prose takes about 2/3 of its bytes, and the table's
#: pages hold more rows (SQLite kept 3 rows of 1 KB a 4 KB page). Rows
#: stored before stay as they are and read as before.
COMPRESS_AT = 128
COMPRESS_GAIN = 16
ZLIB = "zlib:"
#: A value or row stored since migration 0030 / 0043 is raw DEFLATE (no zlib
#: header and checksum: 6 bytes a row) primed with ``ZDICT_1``, a preset
#: dictionary of what LangGraph's checkpoints, metadata and messages spell
#: (msgpack keys, channel names, a version, a timestamp, a UUID): a checkpoint
#: of the bench graph (356 bytes of msgpack) took 227 bytes with ``ZLIB`` and
#: takes about 135. The dictionary is fixed forever (a row names it by the
#: prefix); ``ZLIB`` rows stored before read as before. The serializer's own
#: checks (allowlist, no pickle) run on the inflated bytes as on any row.
ZDICT = "zd1:"
#: A checkpoint is DEFLATEd at level 6, not 1 (issue 24, 2026-12-06): the
#: bench graph's 386 bytes of msgpack took 142 bytes at 1 and take 137 at 6,
#: in about the same time (~20 us: a checkpoint is a few hundred bytes).
#: Metadata is compressed whatever its length on PostgreSQL (its kind stored
#: as '', a store's ``lg_pack_metadata``): LangGraph's loop
#: writes ~29 bytes of msgpack a checkpoint (source, step, parents), which
#: the dictionary's templates take to ~10 (stored when it saves
#: ``COMPRESS_GAIN``). Rows stored before stay as they are and read as before.
CHECKPOINT_LEVEL = 6
#: the preset dictionary of ``ZDICT`` rows (msgpack of templates: never change it)
ZDICT_1 = bytes.fromhex(
    "97b76c616e67636861696e5f636f72652e6d65737361676573a941494d657373616765ac48756d616e4d657373616765"
    "ab546f6f6c4d657373616765ac746f6f6c5f63616c6c5f6964a5696e707574a67570646174658aa7636f6e74656e74a0"
    "b16164646974696f6e616c5f6b776172677380b1726573706f6e73655f6d6574616461746180a474797065a568756d61"
    "6ea46e616d65c0a26964c0a76578616d706c65c2aa746f6f6c5f63616c6c7390b2696e76616c69645f746f6f6c5f6361"
    "6c6c7390ae75736167655f6d65746164617461c086a6736f75726365a46c6f6f70a47374657000a7706172656e747380"
    "a672756e5f6964a0a97468726561645f6964a0ad636865636b706f696e745f6e73a088a17604a27473d920323032362d"
    "30312d30315430303a30303a30302e3030303030302b30303a3030a26964d92430303030303030302d303030302d3030"
    "30302d303030302d303030303030303030303030ae6368616e6e656c5f76616c75657380b06368616e6e656c5f766572"
    "73696f6e7383a95f5f73746172745f5fb1303030303030303030302e303030303030a86d65737361676573b130303030"
    "3030303030302e303030303030aa6272616e63683a746f3ab1303030303030303030302e303030303030ad7665727369"
    "6f6e735f7365656e83a95f5f696e7075745f5f80a95f5f73746172745f5f81a95f5f73746172745f5fb1303030303030"
    "303030302e303030303030ad5f5f696e746572727570745f5f80b0757064617465645f6368616e6e656c7392aa627261"
    "6e63683a746f3aa86d65737361676573ad70656e64696e675f73656e647390"
)
#: the most bytes a compressed row may expand to (a damaged or hostile row
#: claiming more is refused, not inflated in memory)
INFLATE_LIMIT = 256 * 1024 * 1024
#: The key of a checkpoint (as stored: LangGraph never sees it) holding its
#: channel versions inline, ``{channel: digest of its value, or None when
#: empty}``: every channel of ``channel_versions`` whose value is not a list,
#: those the checkpoint wrote and those it carries from its parent. A
#: super-step's plain channels (``n``, ``branch:to:<node>`` in the bench) were
#: a row of ``lg_blobs`` each, ~87 bytes on SQLite with its key (thread,
#: namespace, channel, version); inline they take a digest (9 bytes of
#: msgpack) in a row compressed anyway. A list channel keeps its rows (its
#: versions are bases of later ones, found by version). A checkpoint stored
#: before has no such key: all its channels are rows, read as before.
INLINE = "_cv"
#: The key of a checkpoint (as stored) holding the list channels it names as a
#: *tail* (PostgreSQL since 2026-12-06, issue 24: a store's ``lg_tail_every`` > 1): ``{channel:
#: [base version, [digests of the items after it]]}``, the base a version stored
#: as a row of ``lg_blobs``. A saver's own appends store a list's version ``j``
#: (counted from its root) as a row only when ``j`` is a multiple of
#: ``lg_tail_every``, and in between as a tail on the last such row
#: (``next_base``): on PostgreSQL a row of ``lg_blobs`` cost ~225 bytes a
#: super-step at 3,000 (tuple header, key columns, a key entry) for ~50 bytes
#: of digests. A checkpoint that carries a tailed channel from its parent
#: carries its tail (``_carried``). What the row names for the server
#: (``names``, ``refs``) is the base version and the tail's digests, so
#: reads, garbage collection and copies treat a tail as inline values over
#: a stored version. A checkpoint stored before has no such key.
TAIL = "_lt"
#: what a write through ``CairnSaver._held_write`` returns
_W = TypeVar("_W")
#: the table a sealed checkpoint row is bound to (its ``Place``)
TABLE = "lg_checkpoints"

#: item digests of a list, the new value rows of a write (``list`` is a method of the saver)
Digests = list[int]
ValueRows = list[ValueRow]
#: a channel of a thread: (thread id, namespace, channel)
ListKey = tuple[str, str, str]
#: the list versions a new version of a channel may name as its base, newest
#: first: (index, version, items) of each (see ``next_base``)
Spine = tuple[tuple[int, str, int], ...]
#: a checkpoint's tailed list channels (``TAIL``): channel -> (base version, item digests)
Tails = dict[str, tuple[str, Digests]]
#: what a saver keeps of a checkpoint it wrote or read (``_record``): its channel
#: versions, its inline record and its tails
Record = tuple[dict[str, str], dict[str, int | None], Tails]
#: a value's bytes -> an inflater primed with the thread dictionary they name, and the stream
#: after their header; ``None`` if they name none (``cairn.lgdictionary.Dictionaries.inflater``)
Inflater = Callable[[bytes], "tuple[zlib._Decompress, bytes] | None"]


@dataclass(frozen=True, slots=True)
class KnownList:
    """A list channel as this saver last wrote or read it: its version, its
    items (the objects themselves, so that a later list starting with the
    same objects is known without encoding them), their packed digests, and
    the spine of versions a next one may be stored against."""

    version: str
    items: tuple[Any, ...]
    refs: bytes
    spine: Spine = ()

    def bases(self) -> Spine:
        """Its spine, or the list itself as a root when it has none."""
        return self.spine or KnownList.root(self.version, (), self.refs).spine

    @classmethod
    def root(cls, version: str, items: tuple[Any, ...], refs: bytes) -> KnownList:
        """A list the saver writes whole, or read: index 0 of the spines after it."""
        return cls(version, items, refs, ((0, version, len(refs) // REF_SIZE),))


def next_base(spine: Spine, every: int = 1) -> tuple[int, tuple[int, str, int], Spine]:
    """The base of the next version of a list whose versions since its root
    are ``spine``, and the spine without what the next version no longer
    needs: version ``j`` (counted from the root, 0) is stored against
    version ``j - lowbit(j)``, as a Fenwick tree links its nodes, so a read
    walks at most log2(j) + 1 rows to the root and a list of n versions
    stores about n * log2(n) / 2 item digests in all (basing each version
    on the previous one walked up to n rows, and restated the list whole
    every ``MAX_CHAIN`` versions). ``j - lowbit(j)`` is always on the spine
    of ``j - 1``: clearing the lowest set bits of ``j - 1`` one by one reaches it.

    ``every`` > 1 (``TAIL``): a version ``j`` that is not a multiple of it is
    stored against the last multiple (``j - j % every``, the newest row on
    the spine), a multiple against ``j - lowbit(j)`` (a multiple too), so a
    base is always a multiple, which is on the spine as above."""
    j = spine[0][0] + 1
    target = j - j % every if j % every else j - (j & -j)
    kept = tuple(e for e in spine if e[0] <= target)
    return j, kept[0], kept

_CONSTRUCTORS = (EXT_CONSTRUCTOR_SINGLE_ARG, EXT_CONSTRUCTOR_POS_ARGS, EXT_CONSTRUCTOR_KW_ARGS,
                 EXT_PYDANTIC_V1, EXT_PYDANTIC_V2)


class StoreOwner(Protocol):
    """What has a store (a ``cairn.App``): named by its attribute, so this
    module needs nothing above the store (``cairn.lgdurable``, below the
    API, builds savers)."""

    @property
    def store(self) -> Store: ...


class CairnSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on one tenant's LangGraph threads in Cairn's store.

    ``lease``: a run's lease epoch fencing every write (``cairn.lgdurable``):
    refused once a later lease wrote the thread (``cairn.store.checkpointsql``)."""

    def __init__(self, source: StoreOwner | Store | str, *, tenant: str = "default",
                 serde: SerializerProtocol | None = None,
                 allowlist: Collection[tuple[str, ...]] = (), lease: int | None = None) -> None:
        if not tenant:
            raise InvalidArgument("CairnSaver needs a tenant")
        chosen = serde if serde is not None else JsonPlusSerializer(
            allowed_msgpack_modules=tuple(allowlist) or None)
        if serde is not None and allowlist:
            raise InvalidArgument("CairnSaver takes serde= or allowlist=, not both "
                                  "(use saver.with_allowlist)")
        _refuse_unsafe(chosen)
        super().__init__(serde=chosen)
        self._owned: Store | None = None
        if isinstance(source, str):
            self._owned = open_store(source)
            store: Any = self._owned
        else:
            store = getattr(source, "store", source)  # an App, or a store
        #: encryption at rest: the store's sealer, when the store seals (``_sealed``)
        self._sealer: Sealer | None = None
        if isinstance(store, SealedStore):
            self._sealer, store = store.sealer, store.inner
        if not isinstance(store, SQLCheckpoints):
            raise InvalidArgument(f"CairnSaver needs a SQL store, not {type(store).__name__}")
        if self._sealer is None and store.data_keys(tenant):  # type: ignore[attr-defined]
            raise InvalidArgument(f"tenant {tenant!r} of this database is encrypted: CairnSaver needs the "
                                  "App (or a store opened with its keyring), or it would write plaintext")
        self._rows: SQLCheckpoints[Any] = store
        self.tenant = tenant
        self._lists: OrderedDict[ListKey, KnownList] = OrderedDict()
        #: checkpoints this saver last wrote or read: (thread, namespace, id) ->
        #: (channel versions, inline record), so a put carries its parent's
        #: inline channels without reading the parent (``_carried``)
        self._records: OrderedDict[tuple[str, str, str], Record] = OrderedDict()
        #: list versions between rows of ``lg_blobs`` are tails (``TAIL``) where the store says so
        self._tail_every = max(1, int(getattr(store, "lg_tail_every", 1)))
        #: metadata compressed whatever its length where the store says so (``CHECKPOINT_LEVEL``)
        self._pack_metadata = bool(getattr(store, "lg_pack_metadata", False))
        self._lock = threading.Lock()
        #: this saver's id as a thread's writer, and the epoch it holds each thread it wrote at
        self._owner = secrets.token_hex(8)
        self._held: dict[str, tuple[int | None, int | None]] = {}
        #: when this saver last forgot each thread (``_forget_thread``: a number of ``_forgets``)
        #: and everything (``_forgot_all``): a read or write remembers what it learnt only if
        #: neither changed since it began (``_capture``), so nothing learnt before a forget
        #: outlives it. Its entries go all at once, with everything remembered, past ``GENS_KEPT``.
        self._forgets = itertools.count(1)
        self._forgot: dict[str, int] = {}
        self._forgot_all = 0
        #: held while a first write reads its thread's count (``_expecting``)
        self._first_writes = threading.Lock()
        self.lease = lease
        #: list items this saver encoded lately, by identity: id -> (the item, its value row), so
        #: the message a node wrote (its pending write) is not serialized, hashed and compressed
        #: again when the next checkpoint appends it to the list (issue 24, 2026-12-07: ~25 us a
        #: super-step); the item is kept, so its id is not reused while it is here. Not when
        #: the store seals (a value's digest is keyed there). An item mutated in place after it
        #: was encoded is not seen as changed, as ``_list_blob`` does not see it either.
        self._encoded: OrderedDict[int, tuple[Any, ValueRow, ValueRow | None]] = OrderedDict()
        #: the threads' own compression dictionaries (``cairn.lgdictionary``); the third part of an
        #: entry of ``_encoded`` is the dictionary row its value row needs stored beside it
        self._dictionaries = Dictionaries(ZDICT_1, digest, self._stored_dictionary,
                                          making=self._sealer is None)
        #: (thread, digest) of value rows this saver committed lately: a put does not send them
        #: again (on PostgreSQL no statement then: a round trip a super-step). A saver already
        #: takes the items of a list it holds as stored (``_list_blob`` sends only new ones); a
        #: delete or prune through this saver forgets them (``_forget``).
        self._stored: OrderedDict[tuple[str, int], None] = OrderedDict()
        #: this saver's ``put_writes`` in flight, per (thread, namespace, checkpoint id)
        self._writing: dict[tuple[str, str, str], int] = {}
        self._written = threading.Condition(self._lock)

    def close(self) -> None:
        """Close the store if the saver opened it (from a URL)."""
        if self._owned is not None:
            self._owned.close()

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> CairnSaver:
        """A copy whose serializer also allows ``extra_allowlist`` (sharing the store)."""
        clone = super().with_allowlist(extra_allowlist)
        assert isinstance(clone, CairnSaver)
        _refuse_unsafe(clone.serde)
        return clone

    # -- reads --------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        key = self._key(config)
        decoded: dict[str, Any] = {}
        held: dict[str, KnownList] = {}
        gen = self._capture(key.thread_id)
        with self._lock:
            lists = {ch: known.refs for (t, ns, ch), known in self._lists.items()
                     if t == key.thread_id and ns == key.ns}
        snap = self._rows.lg_read(key, get_checkpoint_id(config), lambda r: self._versions(r, decoded, gen),
                                  functools.partial(self._knows, key.thread_id, key.ns, held), self._opener,
                                  lists)
        return None if snap is None else self._tuple(snap, decoded, held, gen)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        conf = config["configurable"] if config else {}
        if (config is not None and conf.get("thread_id") is not None and conf.get("checkpoint_ns") is not None
                and conf.get("checkpoint_id") is None and not filter):
            # a history page: one statement a page where the store can (PostgreSQL)
            paged = self._list_pages(self._key(config), get_checkpoint_id(before) if before else None, limit)
            if paged is not None:
                yield from paged
                return
        gens = self._captured_all()  # before the rows are read: what they say is as new or newer
        rows = self._rows.lg_list(self.tenant, conf.get("thread_id"), conf.get("checkpoint_ns"),
                                  conf.get("checkpoint_id"), get_checkpoint_id(before) if before else None,
                                  None if filter else limit)
        left = limit
        page: builtins.list[tuple[CheckpointRow, Any]] = []
        for row in rows:
            if left is not None and left <= 0:
                break
            metadata = self._load(row.metadata_kind, row.metadata, row, "metadata")
            if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                continue
            if left is not None:
                left -= 1
            page.append((row, metadata))
            if len(page) == LIST_PAGE:
                yield from self._page(page, gens)
                page = []
        yield from self._page(page, gens)

    def _list_pages(self, key: ThreadKey, before: str | None, limit: int | None
                    ) -> Iterator[CheckpointTuple] | None:
        """A namespace's checkpoints, newest first, a page of ``LIST_PAGE``
        per statement (``lg_read_page``: rows, chains, writes and values at
        once); ``None`` when the first page cannot be read so (SQLite, rows
        written before migration 0045, a damaged row: ``list`` reads as
        before). A later page that cannot is listed and read as before."""
        first = self._read_page(key, before, LIST_PAGE if limit is None else min(limit, LIST_PAGE))
        if first is None:
            return None
        return self._more_pages(key, first, limit)

    def _more_pages(self, key: ThreadKey, page: builtins.list[CheckpointTuple], limit: int | None
                    ) -> Iterator[CheckpointTuple]:
        left = limit
        while True:
            yield from page
            if left is not None:
                left -= len(page)
            if len(page) < LIST_PAGE or (left is not None and left <= 0):
                return
            last = page[-1].config["configurable"]["checkpoint_id"]
            asked = LIST_PAGE if left is None else min(left, LIST_PAGE)
            read = self._read_page(key, last, asked)
            if read is None:  # read as before, from this page on
                gens = self._captured_all()
                rows = self._rows.lg_list(self.tenant, key.thread_id, key.ns, None, last, left)
                listed = [(row, self._load(row.metadata_kind, row.metadata, row, "metadata")) for row in rows]
                for at in range(0, len(listed), LIST_PAGE):
                    yield from self._page(listed[at:at + LIST_PAGE], gens)
                return
            page = read

    def _read_page(self, key: ThreadKey, before: str | None, limit: int
                   ) -> builtins.list[CheckpointTuple] | None:
        """One page in one statement (``lg_read_page``), or ``None``."""
        kept: dict[str, tuple[dict[str, Any], dict[str, KnownList]]] = {}
        gen = self._capture(key.thread_id)

        def asking(row: CheckpointRow) -> tuple[Any, Any]:
            decoded: dict[str, Any] = {}
            held: dict[str, KnownList] = {}
            kept[row.checkpoint_id] = (decoded, held)
            return (functools.partial(self._versions, decoded=decoded, gen=gen),
                    functools.partial(self._knows, row.thread_id, row.ns, held))

        with self._lock:
            lists = {ch: known.refs for (t, ns, ch), known in self._lists.items()
                     if t == key.thread_id and ns == key.ns}
        snaps = self._rows.lg_read_page(key, before, limit, asking, self._opener, lists)
        if snaps is None:
            return None
        out = []
        for snap in snaps:
            decoded, held = kept[snap.row.checkpoint_id]
            metadata = self._load(snap.row.metadata_kind, snap.row.metadata, snap.row, "metadata")
            out.append(self._tuple(snap, decoded, held, gen, metadata))
        return out

    def _page(self, page: Sequence[tuple[CheckpointRow, Any]], gens: Callable[[str], Gen]
              ) -> Iterator[CheckpointTuple]:
        """The tuples of a page of listed rows (with their metadata), read in
        one transaction; ``gens``: each thread's ``_capture`` from before the
        rows were listed."""
        asked = []
        kept: builtins.list[tuple[dict[str, Any], dict[str, KnownList]]] = []
        for row, _ in page:
            decoded: dict[str, Any] = {}
            held: dict[str, KnownList] = {}
            asked.append((row, functools.partial(self._versions, decoded=decoded, gen=gens(row.thread_id)),
                          functools.partial(self._knows, row.thread_id, row.ns, held)))
            kept.append((decoded, held))
        snaps = self._rows.lg_snapshots(self.tenant, asked, self._opener)
        for snap, (decoded, held), (row, metadata) in zip(snaps, kept, page, strict=True):
            yield self._tuple(snap, decoded, held, gens(row.thread_id), metadata)

    # -- writes -------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        key = self._key(config)
        return self._held_write(key, lambda holder, gen: self._put(key, holder, gen, config, checkpoint,
                                                                   metadata, new_versions))

    def _put(self, key: ThreadKey, holder: Holder, gen: Gen, config: RunnableConfig, checkpoint: Checkpoint,
             metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        c: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = c.pop("channel_values")
        blobs: builtins.list[BlobRow] = []
        rows: ValueRows = []
        lists: dict[ListKey, KnownList] = {}
        tails: Tails = {}
        # a plain channel (a value, or empty) goes inline in the row, not to a row of its own
        plain: dict[str, int | None] = {}
        for channel, version in new_versions.items():
            if channel not in values:
                plain[channel] = None
                continue
            value = values[channel]
            if type(value) is not list:
                plain[channel] = self._encode(value, rows, key.thread_id)[1][0]
                continue
            ver = str(version)
            list_key = (key.thread_id, key.ns, channel)
            with self._lock:
                known = self._lists.get(list_key)
            blob, spine = self._list_blob(key.thread_id, channel, ver, value, known, rows)
            lists[list_key] = KnownList(ver, tuple(value), blob.refs, spine)
            if blob.base is not None and spine[0][0] % self._tail_every:  # between rows: a tail
                tails[channel] = (blob.base, unpack_refs(blob.added))
                continue
            blobs.append(blob)
        parent = config["configurable"].get("checkpoint_id")
        versions = {str(k): str(v) for k, v in c["channel_versions"].items()}
        inline, carried = self._carried(key, gen, None if parent is None else str(parent), versions,
                                        new_versions)
        tails = {ch: t for ch, t in {**carried, **tails}.items() if ch in versions}
        inline.update(plain)  # never a channel carried: those are the ones this put did not write
        for channel in self._never_stored(key, None if parent is None else str(parent), versions,
                                          new_versions, {**inline, **dict.fromkeys(tails)}):
            inline[channel] = None  # named but never stored: the channel is empty, and reads so
        c[INLINE] = inline
        if tails:
            c[TAIL] = {ch: [base, digests] for ch, (base, digests) in tails.items()}
        del c["id"]  # the row's key holds it (``_with_id``)
        ckind, cdata = packed(*self._dump(c), level=CHECKPOINT_LEVEL)
        full_metadata = get_checkpoint_metadata(config, metadata)
        mkind, mdata = self._dump(full_metadata)
        if self._pack_metadata:  # whatever its length (see CHECKPOINT_LEVEL)
            mkind, mdata = packed(mkind, mdata, at=0)
        rows = self._unstored(key.thread_id, rows)
        if self._sealer is not None:
            rows = self._sealed(key.thread_id, rows)
            at = _position(key.ns, checkpoint["id"])
            cdata = self._sealer.seal(Place(self.tenant, key.thread_id, TABLE, at, "checkpoint"), cdata)
            mdata = self._sealer.seal(Place(self.tenant, key.thread_id, TABLE, at, "metadata"), mdata)
        if parent is not None:
            self._await_writes((key.thread_id, key.ns, str(parent)))
        # what the server may read of the row (PostgreSQL reads a checkpoint in one statement with them)
        names = join_names({k: tails[k][0] if k in tails else v
                            for k, v in versions.items() if k not in inline})
        refs = pack_refs([d for d in [*inline.values(), *(d for _, ds in tails.values() for d in ds)]
                          if d is not None and not is_literal(d)])
        row = CheckpointRow(key.thread_id, key.ns, checkpoint["id"], parent, ckind, cdata, mkind, mdata,
                            names, refs)
        run_id = full_metadata.get("run_id")
        self._held[key.thread_id] = self._rows.lg_put(
            key, holder, row, None if run_id is None else str(run_id), blobs, rows, max_depth=MAX_CHAIN)
        self._committed(key.thread_id, rows, gen)
        self._remember(key.thread_id, lists, gen)
        self._record((key.thread_id, key.ns, checkpoint["id"]), versions, inline, tails, gen)
        return {"configurable": {"thread_id": key.thread_id, "checkpoint_ns": key.ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        writing = self._begin_writes(config)
        try:
            self._put_writes(config, writes, task_id, task_path)
        finally:
            self._end_writes(writing)

    def _put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                    task_path: str) -> None:
        key = self._key(config)
        self._held_write(key, lambda holder, gen: self._put_writes_held(key, holder, gen, config, writes,
                                                                        task_id, task_path))

    def _put_writes_held(self, key: ThreadKey, holder: Holder, gen: Gen, config: RunnableConfig,
                         writes: Sequence[tuple[str, Any]], task_id: str, task_path: str) -> None:
        rows: ValueRows = []
        stored: builtins.list[WriteRow] = []
        for i, (channel, value) in enumerate(writes):
            kind, digests = self._encode(value, rows, key.thread_id)
            stored.append(WriteRow(task_id, WRITES_IDX_MAP.get(channel, i), channel, task_path, kind,
                                   pack_refs(digests)))
        rows = self._unstored(key.thread_id, rows)
        if self._sealer is not None:
            rows = self._sealed(key.thread_id, rows)
        checkpoint_id = str(config["configurable"]["checkpoint_id"])
        self._held[key.thread_id] = self._rows.lg_put_writes(key, holder, checkpoint_id, stored, rows)
        self._committed(key.thread_id, rows, gen)

    def delete_thread(self, thread_id: str) -> None:
        self._rows.lg_delete_thread(self.tenant, str(thread_id))
        self._held.pop(str(thread_id), None)
        self._forget()

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            self._rows.lg_delete_runs(self.tenant, [str(r) for r in run_ids], self._versions)
            self._forget()

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        if self._sealer is not None:
            self._copy_sealed(str(source_thread_id), str(target_thread_id))
            return
        self._rows.lg_copy_thread(self.tenant, str(source_thread_id), str(target_thread_id))

    def _copy_sealed(self, source: str, target: str) -> None:
        """``copy_thread`` when the store seals: each row is bound to its
        thread, so a row copied as it is would not open as the target's; the
        source's checkpoints are read, oldest first, and put again with their
        pending writes (stored incrementally as any put, sealed for the target)."""
        found = [*self.list({"configurable": {"thread_id": source}})]
        for t in reversed(found):  # newest first within each namespace
            conf = t.config["configurable"]
            parent = t.parent_config["configurable"].get("checkpoint_id") if t.parent_config else None
            where: dict[str, Any] = {"thread_id": target, "checkpoint_ns": conf["checkpoint_ns"]}
            at: Any = {"configurable": {**where, "checkpoint_id": parent} if parent else where}
            self.put(at, t.checkpoint, t.metadata, t.checkpoint["channel_versions"])
            tasks: dict[str, builtins.list[tuple[str, Any]]] = {}
            for task_id, channel, value in t.pending_writes or ():
                tasks.setdefault(task_id, []).append((channel, value))
            for task_id, writes in tasks.items():
                self.put_writes({"configurable": {**where, "checkpoint_id": conf["checkpoint_id"]}}, writes,
                                task_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgument(f"unknown prune strategy {strategy!r} (use 'keep_latest' or 'delete')")
        if thread_ids:
            self._rows.lg_prune(self.tenant, [str(t) for t in thread_ids], strategy == "keep_latest",
                                self._versions)
            self._forget()

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The version after ``current``: its number plus one, zero-padded so
        versions compare as strings, then a random tag, so two branches of a
        thread forked from one checkpoint never name different values alike."""
        if current is None:
            number = 0
        elif isinstance(current, (int, float)):
            number = int(current)
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:010d}.{secrets.token_hex(3)}"

    # -- time travel (issue 24, part 3) ----------------------------------------------------

    def values(self, thread_id: str, checkpoint_id: str | None = None, *, ns: str = "",
               internal: bool = False) -> dict[str, Any]:
        """The thread's channel values at ``checkpoint_id`` (its latest
        checkpoint if ``None``): the graph's state, without LangGraph's own
        channels (``__start__``, ``branch:to:<node>``, ...) unless
        ``internal``. A checkpoint this tenant does not have is an
        ``InvalidArgument`` naming it."""
        conf: dict[str, Any] = {"thread_id": str(thread_id), "checkpoint_ns": ns}
        if checkpoint_id is not None:
            conf["checkpoint_id"] = str(checkpoint_id)
        found = self.get_tuple({"configurable": conf})
        if found is None:
            what = "no checkpoint" if checkpoint_id is None else f"no checkpoint {checkpoint_id!r}"
            raise InvalidArgument(f"LangGraph thread {thread_id!r} of tenant {self.tenant!r} has {what}"
                                  + (f" in namespace {ns!r}" if ns else ""))
        channels = found.checkpoint["channel_values"]
        return {k: v for k, v in channels.items() if internal or not is_internal_channel(k)}

    def diff(self, thread_id: str, a: str | None, b: str | None, *, other_thread: str | None = None,
             ns: str = "", internal: bool = False) -> builtins.list[Change]:
        """What changed from checkpoint ``a`` of the thread to checkpoint
        ``b`` (of ``other_thread`` if given; ``None``: the latest), as
        ``cairn.graph.diff`` reports it for graph runs: a list that grew as
        ``appended`` with the new items, a dict's changes by key path, a
        replaced value old -> new; a message is the dict of its fields."""
        before = self.values(thread_id, a, ns=ns, internal=internal)
        after = self.values(other_thread if other_thread is not None else thread_id, b, ns=ns,
                            internal=internal)
        return state_diff(before, after)

    # -- async (the store is synchronous: each call runs in a thread) ---------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: [*self.list(config, filter=filter, before=before, limit=limit)])
        for item in found:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        # in flight from here, before the first await: LangGraph's loop starts
        # this task before the put of the next checkpoint, which waits for it
        writing = self._begin_writes(config)
        try:
            await asyncio.to_thread(self._put_writes, config, writes, task_id, task_path)
        finally:
            self._end_writes(writing)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(lambda: self.prune(thread_ids, strategy=strategy))

    # -- pending writes before the checkpoint that follows them ---------------------------

    def _begin_writes(self, config: RunnableConfig) -> tuple[str, str, str]:
        """Count a ``put_writes`` on its checkpoint as in flight until ``_end_writes``."""
        conf = config["configurable"]
        writing = (str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")), str(conf["checkpoint_id"]))
        with self._lock:
            self._writing[writing] = self._writing.get(writing, 0) + 1
        return writing

    def _end_writes(self, writing: tuple[str, str, str]) -> None:
        with self._lock:
            left = self._writing[writing] - 1
            if left:
                self._writing[writing] = left
            else:
                del self._writing[writing]
                self._written.notify_all()

    def _await_writes(self, parent: tuple[str, str, str]) -> None:
        """Wait until none of this saver's ``put_writes`` on checkpoint
        ``parent`` is in flight (whether it committed or failed).

        LangGraph's loop hands a super-step's pending writes and the next
        checkpoint to its background executor with no order between them
        (LangGraph issue 8039): without this wait the checkpoint could start
        committing while a finished node's writes are still on their way, and
        a crash then loses both, so the node runs again on resume. With it,
        by the time a checkpoint's transaction begins, the writes of its
        parent that this saver was handed are durable."""
        with self._written:
            if parent in self._writing:  # most often none is: no predicate to make and call
                self._written.wait_for(lambda: parent not in self._writing)

    # -- encoding -----------------------------------------------------------------------

    def _key(self, config: RunnableConfig) -> ThreadKey:
        conf = config["configurable"]
        return ThreadKey(self.tenant, str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")))

    def _held_write(self, key: ThreadKey, write: Callable[[Holder, Gen], _W]) -> _W:
        """``write(holder)`` for ``key``'s thread (``_expecting``), made again
        whole while it is refused as stale (``Stale``: nothing written; the
        saver forgets the thread, ``_stale``). Once more at most after each
        collection it missed: a write that expects no count is never stale."""
        while True:
            holder = self._expecting(key)
            try:
                return write(holder, self._capture(key.thread_id))
            except Stale as stale:
                self._stale(key, stale)

    def _expecting(self, key: ThreadKey) -> Holder:
        """The holder a write of ``key``'s thread names, taken before the write
        consults this saver's memory: the epoch this saver last held the thread
        at and the collection count that memory was made under. With no count
        (no write yet, or the thread was deleted), the thread's count is read
        and then what this saver remembers of the thread (from reads) is
        forgotten: nothing vouches for it. In that order, so everything the
        write then reads of the thread (its parent's row) and every read that
        begins after the forget is as new as the count, or newer, and a
        collection before the write commits refuses it (``Stale``): a first
        write that expected no count was never refused, and one whose reads
        raced a prune was stored naming what the prune took. The lists it read
        are kept if what they name is still stored, read after the count
        (``_still_stored``)."""
        epoch, collected = self._held.get(key.thread_id, (None, None))
        if collected is None:
            # one read a thread, not one a write (LangGraph's first put and put_writes begin at
            # once): the writes that begin before this one commits expect the same count
            with self._first_writes:
                epoch, collected = self._held.get(key.thread_id, (None, None))
                if collected is None:
                    with self._lock:
                        read = {k: v for k, v in self._lists.items() if k[0] == key.thread_id}
                    collected = self._rows.lg_collected(key)
                    self._forget_thread(key.thread_id)
                    self._remember(key.thread_id, self._still_stored(read), self._capture(key.thread_id))
                    self._held[key.thread_id] = (None, collected)
        return Holder(self._owner, epoch, self.lease, collected)

    def _still_stored(self, lists: Mapping[ListKey, KnownList]) -> dict[ListKey, KnownList]:
        """The lists of ``lists`` (read before a first write read the thread's
        count) whose versions a next version may be stored against are rows
        of ``lg_blobs`` and whose items beyond them (a tail) are stored values,
        read now: then a collection before the write commits refuses it
        (``Stale``), as for anything it reads after the count. Forgetting them
        instead, a saver a request (each reading the thread, then writing it)
        restated every list whole in every first write: 8 bytes an item, a
        request (1.4 MB over 600 checkpoints of one list, against 23 KB)."""
        kept = {}
        for (thread_id, ns, channel), known in lists.items():
            rows = [e for e in known.bases() if e[0] % self._tail_every == 0]
            covered = max((e[2] for e in rows), default=0)
            tail = unpack_refs(known.refs[covered * REF_SIZE:])
            if rows and self._rows.lg_present(ThreadKey(self.tenant, thread_id, ns), channel,
                                              {e[1] for e in rows}, tail):
                kept[(thread_id, ns, channel)] = known
        return kept

    def _stale(self, key: ThreadKey, stale: Stale) -> None:
        """A write was refused, nothing written: the thread was collected or
        deleted since this saver's memory of it was made (``Stale``). Forget
        it; the write is made again whole, expecting the count now (or, the
        thread deleted, as this saver's first)."""
        self._forget_thread(key.thread_id)
        with self._lock:
            if stale.collected is None:
                self._held.pop(key.thread_id, None)
            else:
                epoch = self._held.get(key.thread_id, (None, None))[0]
                self._held[key.thread_id] = (epoch, stale.collected)

    def hold(self, thread_id: str) -> None:
        """Take thread ``thread_id`` now, writing nothing else: from here on
        a writer it was taken from is refused (before this saver reads it)."""
        key = ThreadKey(self.tenant, str(thread_id), "")

        def take(holder: Holder, gen: Gen) -> None:
            self._held[key.thread_id] = self._rows.lg_put_writes(key, holder, "", [], [])

        self._held_write(key, take)

    def _dump(self, value: Any) -> tuple[str, bytes]:
        kind, data = self.serde.dumps_typed(value)
        if "pickle" in kind or _looks_pickled(data):
            raise InvalidArgument(f"CairnSaver never stores pickles (the serializer returned one, "
                                  f"type {kind!r})")
        if not kind:  # SQLite's pending rows are the ones of kind '' (lg_put_record): never a value's
            raise InvalidArgument("CairnSaver needs a serializer type: the serializer returned an empty one")
        return kind, bytes(data)

    def _list_blob(self, thread_id: str, channel: str, version: str, value: builtins.list[Any],
                   known: KnownList | None, rows: ValueRows) -> tuple[BlobRow, Spine]:
        """A list channel's blob, as the items it gained over a version of
        ``known``'s spine when it only grew (``next_base``), and its spine.
        Items are recognised by identity first: LangGraph's
        reducers build a new list holding the old items, so only the new
        ones are encoded (a list whose items are not those objects, e.g.
        read by another saver, is encoded whole and compared by digest).
        An item mutated in place after it was stored is not seen as
        changed; LangGraph itself stores a channel only when a node wrote
        to it, so it does not see such a change either."""
        if known is not None and len(known.items) <= len(value) and all(
                map(operator.is_, known.items, value)):
            _, digests = self._encode(value[len(known.items):], rows, thread_id)
            refs = known.refs + pack_refs(digests)
        else:
            _, digests = self._encode(value, rows, thread_id)
            refs = pack_refs(digests)
            if known is None or not refs.startswith(known.refs):
                return BlobRow(channel, version, "list", refs), KnownList.root(version, (), refs).spine
        spine = known.bases()
        index, (_, base, count), kept = next_base(spine, self._tail_every)
        # every version on a spine holds a prefix of ``known``'s items, so of ``value``'s
        grown = ((index, version, len(refs) // REF_SIZE), *kept)
        return BlobRow(channel, version, "list", refs, base, refs[count * REF_SIZE:]), grown

    def _encode(self, value: Any, rows: ValueRows, thread_id: str) -> tuple[str, Digests]:
        """``value`` as ``('list', item digests)`` or ``('value', [digest])``
        in thread ``thread_id``; its value rows are added to ``rows``, with the
        dictionary rows they are compressed with (``cairn.lgdictionary``)."""
        items = value if type(value) is list else [value]
        digests: Digests = []
        # a plain value (a counter, a flag) may be a literal; a list's items are rows, as messages are
        plain = type(value) is not list and self._sealer is None
        cached = type(value) is list and self._sealer is None
        encoded = self._encoded
        for item in items:
            if cached:
                hit = encoded.get(id(item))
                if hit is not None and hit[0] is item:  # encoded lately (``_encoded``)
                    rows.append(hit[1])
                    if hit[2] is not None:  # its dictionary (another thread's, if it was encoded there)
                        rows.append(hit[2])
                    digests.append(hit[1].digest)
                    continue
            kind, data = self._dump(item)
            # LangGraph's None is ("null", b""): the literal of no bytes (never a msgpack value's)
            short = literal(data) if plain and (kind == "msgpack" or (kind == "null" and not data)) else None
            if short is not None:  # a counter, a flag: the ref holds it, no row (never when sealed)
                digests.append(short)
                continue
            d = self._digest(kind, data)  # of the value as serialized: a compressed copy is the same value
            row, needs = self._value_row(thread_id, d, kind, data)
            rows.append(row)
            if needs is not None:
                rows.append(needs)
            digests.append(d)
            if cached:
                with self._lock:
                    encoded[id(item)] = (item, row, needs)
                    if len(encoded) > LIST_CACHE:
                        encoded.popitem(last=False)
        return ("list" if type(value) is list else "value"), digests

    def _value_row(self, thread_id: str, d: int, kind: str, data: bytes) -> tuple[ValueRow, ValueRow | None]:
        """A value's row: compressed with the thread's dictionary when it has
        one (and the dictionary's row, to be stored with it), else ``packed``."""
        if self._dictionaries.making and len(data) >= COMPRESS_AT:
            small = self._dictionaries.pack(thread_id, data)
            if small is not None:
                return ValueRow(d, ZDICT + kind, small[0]), small[1]
        return ValueRow(d, *packed(kind, data)), None

    def _unstored(self, thread_id: str, rows: ValueRows) -> ValueRows:
        """``rows`` without those this saver committed lately to the thread
        (``_stored``), each once (a dictionary row comes with each value
        compressed with it)."""
        out: ValueRows = []
        seen: set[int] = set()
        with self._lock:
            stored = self._stored
            for r in rows:
                if (thread_id, r.digest) in stored:  # kept as used lately: a thread's dictionary row
                    stored.move_to_end((thread_id, r.digest))  # comes with every value it compressed
                elif r.digest not in seen:
                    seen.add(r.digest)
                    out.append(r)
        return out

    def _committed(self, thread_id: str, rows: ValueRows, gen: Gen) -> None:
        """Remember ``rows`` as committed to the thread (``_stored``) by a write that began at ``gen``."""
        if not rows:
            return
        with self._lock:
            if self._current(thread_id) != gen:
                return
            stored = self._stored
            for r in rows:
                stored[(thread_id, r.digest)] = None
                stored.move_to_end((thread_id, r.digest))
            while len(stored) > STORED_CACHE:
                stored.popitem(last=False)

    def _knows(self, thread_id: str, ns: str, held: dict[str, KnownList], channel: str, refs: bytes) -> bool:
        """Whether this saver holds the items of a list whose digests are
        ``refs`` (the list it last wrote or read for the channel starts with
        them), kept in ``held`` for the read that asked. A value is stored
        under the digest of its bytes, so the items it holds are what
        decoding the stored values would give."""
        with self._lock:
            known = self._lists.get((thread_id, ns, channel))
        if known is None or not known.refs.startswith(refs):
            return False
        held[channel] = known
        return True

    def _remember(self, thread_id: str, lists: Mapping[ListKey, KnownList], gen: Gen,
                  longer_kept: bool = False) -> None:
        """Keep ``lists`` (of thread ``thread_id``) as the channels' last known
        lists, learnt by a read or write that began at ``gen`` (a read, with
        ``longer_kept``, does not replace a list that extends what it read)."""
        with self._lock:
            if self._current(thread_id) != gen:
                return
            for k, v in lists.items():
                old = self._lists.get(k)
                if longer_kept and old is not None and old.refs.startswith(v.refs):
                    continue
                self._lists[k] = v
                self._lists.move_to_end(k)
            while len(self._lists) > LIST_CACHE:
                self._lists.popitem(last=False)

    def _forget(self) -> None:
        with self._lock:
            self._forget_all()

    def _forget_all(self) -> None:
        self._forgot_all = next(self._forgets)
        self._forgot.clear()
        self._lists.clear()
        self._records.clear()
        self._stored.clear()

    def _current(self, thread_id: str) -> Gen:
        return self._forgot_all, self._forgot.get(thread_id, 0)

    def _capture(self, thread_id: str) -> Gen:
        """When this saver last forgot ``thread_id`` (or everything): taken as
        a read or write begins, and compared when it would remember what it
        learnt. A read whose snapshot came before another saver's collection
        and that returns after this saver's next write (which counted the
        collection) was remembered and built on: the rows it names could be
        gone. Each forget since the read began now voids what it learnt."""
        with self._lock:
            return self._current(thread_id)

    def _captured_all(self) -> Callable[[str], Gen]:
        """``_capture`` of every thread at once (a listing of several threads)."""
        with self._lock:
            everything, forgot = self._forgot_all, dict(self._forgot)
        return lambda thread_id: (everything, forgot.get(thread_id, 0))

    def _forget_thread(self, thread_id: str) -> None:
        """Forget what this saver remembers of one thread (``_expecting``, ``_stale``)."""
        with self._lock:
            if len(self._forgot) >= GENS_KEPT:
                self._forget_all()
                return
            self._forgot[thread_id] = next(self._forgets)
            for k in [k for k in self._lists if k[0] == thread_id]:
                del self._lists[k]
            for r in [r for r in self._records if r[0] == thread_id]:
                del self._records[r]
            for v in [v for v in self._stored if v[0] == thread_id]:
                del self._stored[v]

    def _record(self, at: tuple[str, str, str], versions: dict[str, str],
                inline: dict[str, int | None], tails: Tails, gen: Gen) -> None:
        """Keep checkpoint ``at``'s channel versions, inline record and tails
        (``_carried``), learnt by a read or write that began at ``gen``."""
        with self._lock:
            if self._current(at[0]) != gen:
                return
            self._records[at] = (versions, inline, tails)
            self._records.move_to_end(at)
            while len(self._records) > LIST_CACHE:
                self._records.popitem(last=False)

    def _carried(self, key: ThreadKey, gen: Gen, parent: str | None, versions: Mapping[str, str],
                 new_versions: ChannelVersions) -> tuple[dict[str, int | None], Tails]:
        """The inline channels and the tails (``TAIL``) a new checkpoint carries
        from ``parent``: each channel it did not write whose version is the
        parent's and inline or a tail in the parent's row (one this saver does
        not hold is read; a parent that is gone or unreadable carries nothing,
        and its channels are looked up as rows of ``lg_blobs`` by version, as
        before the inline record)."""
        if parent is None:
            return {}, {}
        at = (key.thread_id, key.ns, parent)
        with self._lock:
            held = self._records.get(at)
        if held is None:
            row = self._rows.lg_row(key, parent)
            if row is None:
                return {}, {}
            decoded: dict[str, Any] = {}
            try:
                self._versions(row, decoded, gen)
            except UnreadableCheckpoint:
                return {}, {}
            held = decoded["versions"], decoded["inline"], decoded["tails"]
        theirs, inline, tails = held
        kept = [ch for ch, ver in versions.items() if ch not in new_versions and theirs.get(ch) == ver]
        return {ch: inline[ch] for ch in kept if ch in inline}, {ch: tails[ch] for ch in kept if ch in tails}

    def _never_stored(self, key: ThreadKey, parent: str | None, versions: Mapping[str, str],
                      new_versions: ChannelVersions, inline: Mapping[str, int | None]) -> builtins.list[str]:
        """The channels a new checkpoint names at a version no row holds: not
        written by it, not inline, not named by its parent at that version and
        not a list this saver holds at it (LangGraph's own loop never does
        this; a hand-made checkpoint may). They go inline as empty, so every
        version left in ``names`` is one a row holds, and a read that finds
        one missing raises ``UnreadableCheckpoint`` instead of reading the
        channel as empty (its row was deleted or damaged, not never written).
        Only channels no record accounts for cost a look-up (``lg_stored``)."""
        theirs: Mapping[str, str] = {}
        if parent is not None:
            with self._lock:
                held = self._records.get((key.thread_id, key.ns, parent))
            theirs = held[0] if held is not None else {}
        unknown = {}
        with self._lock:  # once for every channel (issue 24, 2026-12-07: a put's few microseconds)
            for channel, version in versions.items():
                if channel in inline or channel in new_versions or theirs.get(channel) == version:
                    continue
                known = self._lists.get((key.thread_id, key.ns, channel))
                if known is None or known.version != version:
                    unknown[channel] = version
        if not unknown:
            return []
        stored = self._rows.lg_stored(key, unknown)
        return [channel for channel in unknown if channel not in stored]

    # -- encryption at rest -------------------------------------------------------------

    def _digest(self, kind: str, data: bytes) -> int:
        """A value's digest: keyed by the tenant's data key when the store
        seals (a plain digest of the plaintext beside its ciphertext would let
        whoever reads the table confirm a guessed value)."""
        if self._sealer is None:
            return digest(kind, data)
        keys = self._sealer.keys
        version, _ = keys.writer(self.tenant)
        return digest(kind, data, keys.nonce_key(self.tenant, version))

    def _sealed(self, thread_id: str, rows: ValueRows) -> ValueRows:
        """``rows`` sealed for the thread's values table, each bound to its
        tenant, thread and digest: a value copied to another tenant, thread
        or digest does not open. (A value is shared by every checkpoint,
        channel and write of the thread that holds it, by digest, so it is
        bound to that, not to one of them; what names it, a channel version
        or a pending write, is a digest in a row bound to its checkpoint.)"""
        sealer = self._sealer
        assert sealer is not None
        return [ValueRow(v.digest, v.kind, sealer.seal(
            Place(self.tenant, thread_id, "lg_values", str(v.digest), "value"), v.data)) for v in rows]

    def _opener(self, thread_id: str, d: int, data: bytes) -> bytes:
        """A fetched value's bytes, opened when the store seals."""
        if self._sealer is None:
            return data
        try:
            return self._sealer.open(Place(self.tenant, thread_id, "lg_values", str(d), "value"), data)
        except SealError as exc:
            raise UnreadableCheckpoint(f"a value of thread {thread_id!r}: refused: {exc}") from None

    # -- decoding -----------------------------------------------------------------------

    def _load(self, kind: str, data: bytes, row: CheckpointRow, what: str) -> Any:
        """Decode one stored value of ``row``, refusing what must not run."""
        if self._sealer is not None and what in ("checkpoint", "metadata"):
            place = Place(self.tenant, row.thread_id, TABLE, _position(row.ns, row.checkpoint_id), what)
            try:
                data = self._sealer.open(place, data)
            except SealError as exc:
                raise UnreadableCheckpoint(f"{_name(row)}: refused its {what}: {exc}") from None
        kind, data = unpacked(kind, data, row, what, self._inflater(row.thread_id))
        serde = self.serde
        if isinstance(serde, JsonPlusSerializer):
            if kind not in KNOWN_TYPES:
                raise UnreadableCheckpoint(f"{_name(row)}: refused its {what}: serializer type {kind!r} "
                                           "is not allowed")
            # a msgpack extension (what could construct or call) starts with one
            # of these bytes: a row holding none of them anywhere holds none
            if kind == "msgpack" and data.translate(None, _NOT_EXT_START):
                try:
                    _scan(data, _allowed(serde))
                except UnreadableCheckpoint as exc:
                    raise UnreadableCheckpoint(f"{_name(row)}: refused its {what}: {exc}") from None
                except Exception as exc:
                    raise UnreadableCheckpoint(f"{_name(row)}: cannot decode its {what}: {exc}") from None
        if "pickle" in kind or _looks_pickled(data):
            raise UnreadableCheckpoint(f"{_name(row)}: refused its {what}: a pickle payload")
        try:
            return serde.loads_typed((kind, data))
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            raise UnreadableCheckpoint(f"{_name(row)}: cannot decode its {what}: {problem}") from None

    def _items(self, digests: Digests, values: Mapping[int, tuple[str, bytes]], row: CheckpointRow,
               what: str) -> builtins.list[Any]:
        """The items of a list channel. With LangGraph's own serializer, a
        msgpack item holding no extension and no pickle is what
        ``loads_typed`` would give without its hook, so it is unpacked
        directly (a list of thousands of items is read item by item: the
        checks of ``_load`` per item cost more than the decoding); anything
        else, or an item that does not unpack, goes through ``_load``."""
        direct = type(self.serde).loads_typed is JsonPlusSerializer.loads_typed
        out: builtins.list[Any] = []
        unpack, option = ormsgpack.unpackb, ormsgpack.OPT_NON_STR_KEYS
        inflater = self._inflater(row.thread_id)
        # the first long values, towards the thread's own dictionary (``Dictionaries.learn``)
        learnt: builtins.list[bytes] = []
        room = self._dictionaries.source_bytes if self._dictionaries.making else 0
        for d in digests:
            found = self._value(values, d)
            if found is None:
                raise UnreadableCheckpoint(f"{_name(row)}: its {what} names a value that is not stored")
            kind, data = unpacked(*found, row, what, inflater)
            if room > 0 and len(data) >= COMPRESS_AT:
                learnt.append(data)
                room -= len(data)
            if (direct and kind == "msgpack" and not data.translate(None, _NOT_EXT_START)
                    and not _looks_pickled(data)):
                try:
                    out.append(unpack(data, option=option))
                    continue
                except Exception:
                    pass
            out.append(self._load(kind, data, row, what))
        if learnt:
            self._dictionaries.learn(row.thread_id, learnt)
        return out

    def _inflater(self, thread_id: str) -> Inflater:
        """What inflates the thread's values compressed with its own dictionaries."""
        return functools.partial(self._dictionaries.inflater, thread_id)

    def _stored_dictionary(self, thread_id: str, d: int | None) -> tuple[int, bytes] | None:
        """A dictionary's row (``SQLCheckpoints.lg_dictionary``), opened when
        the store seals (a dictionary made before encryption was adopted)."""
        found = self._rows.lg_dictionary(self.tenant, thread_id, d)
        if found is None:
            return None
        try:
            return found[0], self._opener(thread_id, found[0], found[1])
        except UnreadableCheckpoint as exc:
            raise LookupError(f"its compression dictionary {found[0]} does not open ({exc})") from None

    def _value(self, values: Mapping[int, tuple[str, bytes]], d: int) -> tuple[str, bytes] | None:
        """The stored value ``d`` names: its row if fetched (a digest written
        before literals may have a literal's tag: its row comes first), else
        the msgpack bytes ``d`` holds itself when it is a literal
        (``checkpointsql.literal``; the literal of no bytes, never a msgpack
        value's, is LangGraph's ``None``, ``("null", b"")``); never under encryption, where every value
        is sealed and bound to its thread: there a literal is not stored."""
        found = values.get(d)
        if found is None and self._sealer is None:
            data = literal_bytes(d)
            if data is not None:
                return ("msgpack", data) if data else ("null", b"")
        return found

    def _versions(self, row: CheckpointRow, decoded: dict[str, Any] | None = None,
                  gen: Gen | None = None) -> Named:
        """What ``row`` names: its channel versions stored as rows, and the
        digests of its inline channels (``INLINE``); ``decoded`` receives the
        checkpoint (without its inline record), its versions and the record,
        which is remembered (``_record``) when the read began at ``gen``.
        An inline record that is not one is refused, naming the checkpoint."""
        checkpoint = self._load(row.checkpoint_kind, row.checkpoint, row, "checkpoint")
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("channel_versions"), dict):
            raise UnreadableCheckpoint(f"checkpoint {row.checkpoint_id!r} of thread {row.thread_id!r}: "
                                       "its checkpoint is not a LangGraph checkpoint")
        if "id" not in checkpoint:
            checkpoint = _with_id(checkpoint, row.checkpoint_id)
        inline = checkpoint.pop(INLINE, {})
        if not isinstance(inline, dict) or not all(
                isinstance(k, str) and (v is None or (type(v) is int and -2**63 <= v < 2**63))
                for k, v in inline.items()):
            raise UnreadableCheckpoint(f"{_name(row)}: refused its checkpoint: its inline channel versions "
                                       "are malformed")
        tails = _tails(checkpoint.pop(TAIL, {}), inline, row)
        versions = {str(k): str(v) for k, v in checkpoint["channel_versions"].items()}
        if decoded is not None:
            decoded.update(checkpoint=checkpoint, versions=versions, inline=inline, tails=tails)
            if gen is not None:
                self._record((row.thread_id, row.ns, row.checkpoint_id), versions, inline, tails, gen)
        return Named({k: tails[k][0] if k in tails else v for k, v in versions.items() if k not in inline},
                     [*(d for d in inline.values() if d is not None),
                      *(d for ch, (_, ds) in tails.items() if ch in versions for d in ds)])

    def _tuple(self, snap: Snapshot, decoded: dict[str, Any], held: Mapping[str, KnownList], gen: Gen,
               metadata: Any = None) -> CheckpointTuple:
        row = snap.row
        checkpoint = decoded.get("checkpoint")
        if checkpoint is None:  # a checkpoint with no channels: versions_of still ran
            self._versions(row, decoded, gen)
            checkpoint = decoded["checkpoint"]
        values = snap.values

        def item(d: int, what: str) -> Any:
            found = self._value(values, d)
            if found is None:
                raise UnreadableCheckpoint(f"checkpoint {row.checkpoint_id!r} of thread {row.thread_id!r}: "
                                           f"its {what} names a value that is not stored")
            return self._load(found[0], found[1], row, what)

        channel_values: dict[str, Any] = {}
        lists: dict[ListKey, KnownList] = {}
        versions = decoded["versions"]
        for channel, version in versions.items():
            if channel not in decoded["inline"] and channel not in snap.chains:
                raise UnreadableCheckpoint(f"{_name(row)}: its channel {channel!r} at version {version!r} "
                                           "is not stored")
        for channel, d in decoded["inline"].items():
            if d is not None and channel in versions:
                channel_values[channel] = item(d, f"channel {channel!r}")
        for channel, chain in snap.chains.items():
            kind = chain[-1][0]
            if kind == "empty":
                continue
            what = f"channel {channel!r}"
            if kind == "value":
                channel_values[channel] = item(unpack_refs(chain[-1][1])[0], what)
                continue
            refs = b"".join(r for _, r in chain)
            tail = decoded["tails"].get(channel)  # items after the stored version (``TAIL``), fetched
            whole = refs if tail is None else refs + pack_refs(tail[1])
            known = held.get(channel)  # its values were not fetched: this saver holds its items
            if known is None:  # or it holds them now (an earlier checkpoint of a listed page)
                with self._lock:
                    latest = self._lists.get((row.thread_id, row.ns, channel))
                if latest is not None and latest.refs.startswith(refs):
                    known = latest
            if known is not None and known.refs.startswith(whole):
                channel_values[channel] = [*known.items[:len(whole) // REF_SIZE]]
                continue
            if known is not None:  # it holds the stored version's items, not the tail's
                items = [*known.items[:len(refs) // REF_SIZE], *self._items(unpack_refs(whole[len(refs):]),
                                                                            values, row, what)]
            else:
                items = self._items(unpack_refs(whole), values, row, what)
            channel_values[channel] = items
            if len(chain) >= READ_CHAIN:  # the next version restates the list (``READ_CHAIN``)
                continue
            # a saver's next version of the list is stored against a stored version: the one read,
            # or a tail's base. After a tail it is a row (index ``_tail_every``, a multiple): as a
            # tail again it would repeat the read tail's items, and a saver a turn (each reading
            # the thread, then writing it) stored every item since the base in every checkpoint
            lists[(row.thread_id, row.ns, channel)] = (
                KnownList.root(versions[channel], tuple(items), refs) if tail is None else
                KnownList(versions[channel], tuple(items), whole,
                          ((self._tail_every - 1, versions[channel], len(whole) // REF_SIZE),
                           (0, tail[0], len(refs) // REF_SIZE))))
        self._remember(row.thread_id, lists, gen, longer_kept=True)
        # in the checkpoint's order of channels, inline or rows
        channel_values = {k: channel_values[k] for k in versions if k in channel_values}
        pending = []
        for w in snap.writes:
            what = f"pending write {w.task_id!r}/{w.idx}"
            got = [item(d, what) for d in unpack_refs(w.refs)]
            pending.append((w.task_id, w.channel, got if w.kind == "list" else got[0]))
        if metadata is None:
            metadata = self._load(row.metadata_kind, row.metadata, row, "metadata")
        conf = {"thread_id": row.thread_id, "checkpoint_ns": row.ns}
        full = cast(Checkpoint, {**checkpoint, "channel_values": channel_values})
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": row.checkpoint_id}},
            checkpoint=full,
            metadata=metadata,
            parent_config=({"configurable": {**conf, "checkpoint_id": row.parent_id}}
                           if row.parent_id else None),
            pending_writes=pending,
        )


#: every byte but the first byte of a msgpack extension (ext 8/16/32, fixext 1-16):
#: ``data.translate(None, _NOT_EXT_START)`` is empty when ``data`` holds none
_NOT_EXT_START = bytes(b for b in range(256) if b not in (0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8))


def _tails(found: Any, inline: Mapping[str, Any], row: CheckpointRow) -> Tails:
    """A checkpoint's tails (``TAIL``) as stored: ``{channel: [base version,
    [digest, ...]]}``, no channel also inline; anything else is refused, naming the checkpoint."""
    def digests_of(ds: Any) -> Digests | None:
        if isinstance(ds, list) and all(type(d) is int and -2**63 <= d < 2**63 for d in ds):
            return ds
        return None

    out: Tails = {}
    if isinstance(found, dict):
        for channel, tail in found.items():
            if (not isinstance(channel, str) or channel in inline or not isinstance(tail, list)
                    or len(tail) != 2 or not isinstance(tail[0], str) or (ds := digests_of(tail[1])) is None):
                break
            out[channel] = (tail[0], ds)
        else:
            return out
    raise UnreadableCheckpoint(f"{_name(row)}: refused its checkpoint: its list tails are malformed")


def _position(ns: str, checkpoint_id: str) -> str:
    """Where a sealed checkpoint row is, in its thread: its namespace and id
    (the namespace's length first, so no two pairs read alike)."""
    return f"{len(ns)}:{ns}{checkpoint_id}"


def _name(row: CheckpointRow) -> str:
    """How an error names the checkpoint ``row``."""
    name = f"checkpoint {row.checkpoint_id!r} of thread {row.thread_id!r}"
    return f"{name} (namespace {row.ns!r})" if row.ns else name


def _with_id(checkpoint: dict[str, Any], checkpoint_id: str) -> dict[str, Any]:
    """``checkpoint`` as LangGraph gave it: a put stores it without its
    ``id`` (branch lgpgdisk), which is the row's key already; 34 of the ~167
    compressed bytes of the bench graph's checkpoint, a uuid's random hex
    digits. It goes back after ``ts``, where LangGraph puts it. A checkpoint
    stored before keeps its own ``id`` and is read as stored."""
    out: dict[str, Any] = {}
    for key, value in checkpoint.items():
        out[key] = value
        if key == "ts":
            out["id"] = checkpoint_id
    out.setdefault("id", checkpoint_id)
    return out


def packed(kind: str, data: bytes, *, at: int | None = None, level: int = 1) -> tuple[str, bytes]:
    """A value as stored: compressed when long (``at``, else ``COMPRESS_AT``) and worth it (``ZDICT``)."""
    if len(data) >= (COMPRESS_AT if at is None else at):
        small = deflate_raw(data, level, ZDICT_1)
        if len(small) + COMPRESS_GAIN <= len(data):
            return ZDICT + kind, small
    return kind, data


def unpacked(kind: str, data: bytes, row: CheckpointRow, what: str,
             inflater: Inflater | None = None) -> tuple[str, bytes]:
    """The value ``packed`` stored, or compressed with a thread's own
    dictionary (``inflater``, ``cairn.lgdictionary``); a row that does not
    inflate, or inflates beyond ``INFLATE_LIMIT``, or names a dictionary not
    stored or damaged, is an ``UnreadableCheckpoint`` naming ``row``."""
    if kind.startswith(ZDICT):
        primed = None
        if inflater is not None and data[:1] == DICT_MARK:
            try:
                primed = inflater(data)
            except LookupError as exc:
                raise UnreadableCheckpoint(f"{_name(row)}: cannot decompress its {what}: {exc}") from None
        if primed is None:
            inflate = zlib.decompressobj(-15, zdict=ZDICT_1)
        else:
            inflate, data = primed
        kind = ZLIB + kind[len(ZDICT):]
    elif kind.startswith(ZLIB):
        inflate = zlib.decompressobj()
    else:
        return kind, data
    try:
        whole = inflate.decompress(data, INFLATE_LIMIT)
    except zlib.error as exc:
        raise UnreadableCheckpoint(f"{_name(row)}: cannot decompress its {what}: {exc}") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise UnreadableCheckpoint(f"{_name(row)}: cannot decompress its {what}: it is truncated or "
                                   f"inflates beyond {INFLATE_LIMIT:,} bytes")
    return kind[len(ZLIB):], whole


def is_internal_channel(name: str) -> bool:
    """Whether a channel is LangGraph's own (``__start__``, ``__pregel_tasks``,
    ``branch:to:<node>``, ...) rather than a field of the graph's state."""
    return name.startswith(("__", "branch:"))


def digest(kind: str, data: bytes, key: bytes = b"") -> int:
    """A value's 64-bit digest (signed, as the databases' BIGINT): values are
    deduplicated per thread under it, so two different values of one thread
    colliding is a 2**-64 chance per pair. ``key``: a tenant's secret, when
    its values are sealed (BLAKE2b keyed: at most 64 bytes of it)."""
    raw = hashlib.blake2b(kind.encode() + b"\0" + data, digest_size=8, key=key[:64]).digest()
    d = int.from_bytes(raw, "little", signed=True)
    # never a literal's tag (checkpointsql.literal): one bit of the tag flipped, a 2**-16 chance
    return d ^ (1 << 48) if is_literal(d) else d


def _looks_pickled(data: bytes) -> bool:
    """Whether ``data`` is a pickle (protocol 2 or later: ``\\x80``, the
    protocol, ..., ``.``), whatever type a custom serializer called it: a
    serializer wrapping ``pickle`` is refused too, not only LangGraph's fallback."""
    return len(data) >= 3 and data[0] == 0x80 and 2 <= data[1] <= 5 and data.endswith(b".")


def _refuse_unsafe(serde: SerializerProtocol) -> None:
    """Refuse a serializer that could run what a row holds: LangGraph's with
    its pickle fallback, or one allowing every module."""
    inner = serde.serde if isinstance(serde, EncryptedSerializer) else serde
    if isinstance(inner, JsonPlusSerializer):
        if inner.pickle_fallback:
            raise InvalidArgument("CairnSaver never uses pickle: pass a JsonPlusSerializer "
                                  "without pickle_fallback")
        if _allowed(inner) is True or getattr(inner, "_allowed_json_modules", None) is True:
            raise InvalidArgument("CairnSaver needs a serializer with an allowlist, not one allowing every "
                                  "module (JsonPlusSerializer(allowed_msgpack_modules=[...]))")


def _allowed(serde: JsonPlusSerializer) -> Any:
    """The msgpack allowlist of ``serde`` (a set of ``(module, name)``, ``None`` or ``True``)."""
    return getattr(serde, "_allowed_msgpack_modules", None)


def _scan(data: bytes, allowed: Any) -> None:
    """Walk a msgpack row without constructing anything, refusing any
    constructor or method its serializer would not allow (LangGraph's own hook
    would hand back the raw arguments instead, or call it if allowed)."""
    refused: list[str] = []  # ormsgpack replaces an error raised by the hook by its own

    def permitted(module: Any, name: Any) -> bool:
        key = (module, name)
        listed = isinstance(allowed, (set, frozenset)) and key in allowed
        return key in lg_msgpack.SAFE_MSGPACK_TYPES or listed

    def hook(code: int, payload: bytes) -> None:
        inner = ormsgpack.unpackb(payload, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
        if code == EXT_DELTA_SNAPSHOT:
            return None
        if code == EXT_NUMPY_ARRAY:
            if "O" in str(inner[0]):
                refused.append("a numpy array of Python objects")
        elif code in _CONSTRUCTORS:
            if not permitted(inner[0], inner[1]):
                refused.append(f"{inner[0]}.{inner[1]} is not in the allowlist")
        elif code == EXT_METHOD_SINGLE_ARG:
            if (inner[0], inner[1], inner[3]) not in lg_msgpack.SAFE_MSGPACK_METHODS:
                refused.append(f"a call of {inner[0]}.{inner[1]}.{inner[3]}")
        else:
            refused.append(f"an unknown msgpack extension {code}")
        return None

    try:
        ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
    except Exception:
        if not refused:
            raise
    if refused:
        raise UnreadableCheckpoint(refused[0])


__all__ = ["CairnSaver", "digest", "is_internal_channel"]
