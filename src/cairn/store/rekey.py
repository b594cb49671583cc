"""Re-encryption after a rotation: moving a tenant's sealed values to its newest data key.

A rotation (``SealedStore.rotate``) makes a new data key seal new writes at
once; the values sealed before stay readable under their old version. A
pass here reads the tenant's sealed columns page by page (runs, history
entries, mailbox messages), opens every value sealed under an older version
and seals it again under the newest, at the same place, and writes it back
with compare-and-set on the old bytes: a row a holder changed since it was
read is left as the holder wrote it (a later pass sees it), so a pass never
overwrites a write and needs no lease. Nothing is kept between passes: a
pass killed half-way (SIGKILL included) is resumed by the next, which skips
what is already on the newest key with a header read. ``pause`` throttles
it: the seconds to sleep after each page.

Memory moves too: long-term items (value and text to embed, and the cold
copies of their values: thawed, sealed again, frozen again), run memory,
thread messages; and approvers' decision comments.

Artifacts move first, in place: a sealed store names each by an address
that survives re-encryption (``cairn.store.sealedartifacts``), so its bytes
are sealed again at that name and written back compare-and-set on the bytes
read (``replace_artifact``: a collection since leaves nothing to write), and
no row naming it changes, ``history.payload_ref`` (in the audit chain's
links) included. An artifact stored before addresses (named by the hash of
its sealed bytes) keeps its name and is sealed at it from then on.
Workspace objects (``store.wssealed``) are at such addresses already: each
is sealed again at its own, compare-and-set on the old bytes.

LangGraph checkpoints (``cairn.langgraph.CairnSaver``) move too: a thread's
values (``lg_values``, at their digest) and its checkpoints and metadata
(``lg_checkpoints``), each sealed again at its own place. Their digests are
not changed: a value keeps the digest it was stored under (the rows naming
it stay as they are), and the place it is bound to names that digest.

``SEALED_COLUMNS`` lists every column of the schema that holds sealed bytes,
and the pass that moves it; a test reads both dialects' schemas and fails on
a column holding bytes that neither it nor ``PLAIN_COLUMNS`` names, and
after a pass finds no value left on an older key in any table. A ``verify``
pass (``cairn keys verify``) reads the same pages and opens every value at
its place, so what rotation covers is what verification covers.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from cairn.errors import PayloadError
from cairn.security.envelope import HEADER_SIZE, MAGIC, Place, SealError
from cairn.store.coldvalues import freeze, thaw
from cairn.store.retention import EXPIRED_TAG
from cairn.store.rows import LINK_TAG, unpack_payload

#: detail keys the database reads itself, kept in plaintext beside ``"sealed"`` (``cairn.store.sealed``)
PLAIN_DETAIL = frozenset({"usage", "cost", "from_position", "step_kind", "name", "sealed_at"})
#: the keys an entry's detail may hold beside ``"sealed"``: those, and what the store adds around
#: a sealed detail itself (``lifecycle.resolve_operation``); anything else is refused when read
BESIDE_SEALED = PLAIN_DETAIL | {"resolved_by", "position", "done", "actor"}


class Sealing(Protocol):
    """What a pass uses of a ``SealedStore`` (named here, not imported: the
    sealed store calls this module)."""

    inner: Any
    sealer: Any
    keys: Any
    artifacts: Any

_DECODE = msgspec.json.Decoder()
_ENCODE = msgspec.json.Encoder()


#: how a sealed operator text starts in a JSON column (``Sealer.seal_text``)
REASON_PREFIX = "cairn-sealed:"

#: every column that holds sealed values -> the pass of ``Rekeyer`` that moves (and verifies) it
SEALED_COLUMNS: dict[tuple[str, str], str] = {
    ("runs", "input"): "_runs", ("runs", "result"): "_runs", ("runs", "error"): "_runs",
    ("history", "payload"): "_history", ("history", "detail"): "_history",
    ("history_payloads", "data"): "_history",
    ("mailbox", "payload"): "_mailbox",
    ("approvals", "comment"): "_approvals",
    ("memory_items", "value"): "_items", ("memory_items", "index_text"): "_items",
    ("memory_item_cold", "value"): "_cold",
    ("memory_run", "value"): "_run_memory",
    ("memory_thread_messages", "value"): "_threads",
    ("workspace_objects", "data"): "_workspace",
    ("artifacts", "data"): "_artifacts",  # PostgreSQL's artifact store (SQLite's: files, the same pass)
    ("lg_values", "data"): "_lg_values",
    ("lg_checkpoints", "checkpoint"): "_lg_checkpoints", ("lg_checkpoints", "metadata"): "_lg_checkpoints",
}
#: the columns holding bytes that are not sealed values, and why
PLAIN_COLUMNS: dict[tuple[str, str], str] = {
    ("bundles", "content"): "workflow code, not run data",
    ("data_keys", "wrapped"): "the data keys themselves, wrapped by the keyring's KEK",
    ("history", "digest"): "the audit digest (keyed when the entry is sealed)",
    ("history", "link"): "the audit chain's link (a hash)",
    ("operator_log", "digest"): "the operator log's audit digest",
    ("operator_log", "link"): "the operator log's audit link",
    ("lg_blobs", "refs"): "value digests (keyed when the saver seals)",
    ("lg_writes", "refs"): "value digests (keyed when the saver seals)",
    ("lg_checkpoints", "writes"): "a parent's folded lg_writes rows: channels, task ids, value digests",
    ("lg_checkpoints", "refs"): "value digests the row names (keyed when the saver seals)",
    ("lg_checkpoints", "checkpoint_id"): "a checkpoint id packed (PostgreSQL 0050): as SQLite's text",
    ("lg_checkpoints", "parent_id"): "a parent checkpoint id packed (PostgreSQL 0049), as in SQLite's text",
    ("lg_writes", "checkpoint_id"): "a checkpoint id packed (PostgreSQL 0050): as SQLite's text",
    ("memory_vectors", "embedding"): "embeddings stay plaintext vectors (docs/design.md)",
    ("retention_deleted", "head"): "the audit chain's last link of a deleted run",
    ("run_archives", "last_link"): "the audit chain's last link of an archived run",
}


def reason_place(tenant: str) -> Place:
    """Where operator text is sealed: one tenant, any run (one reason goes to every run an action reaches)."""
    return Place(tenant, "-", "operator", "-", "reason")


@dataclass(slots=True)
class Progress:
    """What a pass (or a status scan) found: values per key version, and
    how many it moved to the newest, or left (changed while it worked)."""

    tenant: str
    newest: int
    versions: Counter[int] = field(default_factory=Counter)
    moved: int = 0
    raced: int = 0
    #: artifacts the tenant's rows name, per key version (0: plaintext), as found before any was moved
    artifacts: Counter[int] = field(default_factory=Counter)
    #: of ``moved`` and ``raced``, how many were artifacts
    artifacts_moved: int = 0
    artifacts_raced: int = 0
    #: a verifying pass: each value that does not open at its place, by place
    failures: list[str] = field(default_factory=list)

    @property
    def old(self) -> int:
        """Values still sealed under an older version than the newest."""
        return sum(n for v, n in self.versions.items() if v < self.newest)

    @property
    def old_artifacts(self) -> int:
        """Artifacts still sealed under an older version (plaintext ones are not counted: adoption does
        not seal artifacts)."""
        return sum(n for v, n in self.artifacts.items() if 0 < v < self.newest)


def version_of(data: bytes | None) -> int | None:
    """The key version in an envelope's header (``None``: not an envelope)."""
    if data is None or len(data) < HEADER_SIZE or data[0] != MAGIC:
        return None
    return int.from_bytes(data[4:8], "big")


def _sealed_json(text: Any) -> tuple[dict[str, Any], bytes] | None:
    if not isinstance(text, str):
        return None
    try:
        value = _DECODE.decode(text)
        return (value, base64.b64decode(value["sealed"], validate=True)) if isinstance(value, dict) \
            and isinstance(value.get("sealed"), str) else None
    except (msgspec.DecodeError, binascii.Error, ValueError):
        return None


class Rekeyer:
    """Moves a tenant's values to its newest data key (see the module doc)."""

    def __init__(self, store: Sealing, tenant: str, *, page: int = 200, pause: float = 0.0,
                 move: bool = True, adopt: bool = False, verify: bool = False) -> None:
        #: seal plaintext values too (turning encryption on for an existing database); counted as version 0
        self.adopt = adopt
        #: open every value at its place (nothing moved): ``Progress.failures`` lists those that do not
        self.verify = verify
        if verify:
            move = False
        self.store = store
        self.inner: Any = store.inner
        self.tenant = tenant
        self.page = page
        self.pause = pause
        self.move = move
        self.progress = Progress(tenant, store.keys.writer(tenant)[0])

    def _bytes(self, place: Place, data: bytes | None, *, packed: bool = False) -> bytes | None:
        """``data`` sealed again under the newest key if it is on an older one
        (or, adopting, sealed if it is plaintext: ``packed`` if it is stored
        as ``rows.pack_payload`` stores a history payload), else ``None``."""
        if data is None:
            return None
        version = version_of(data)
        if self.verify:
            self._check(place, data, version, packed)
        if version is None:
            if not self.adopt:
                return None
            self.progress.versions[0] += 1
            plain = unpack_payload(data, str(place), lenient=False) if packed else data
            return self.store.sealer.seal(place, plain) if self.move and plain is not None else None
        self.progress.versions[version] += 1
        if version >= self.progress.newest or not self.move:
            return None
        again: bytes = self.store.sealer.seal(place, self.store.sealer.open(place, data))
        return again

    def _check(self, place: Place, data: bytes, version: int | None, packed: bool) -> None:
        """A verifying pass: ``data`` opens at ``place`` (a value that is not
        an envelope is plaintext: a failure unless adopting; a history
        payload whose body retention removed holds nothing sealed)."""
        if version is None:
            if packed and data[:2] == EXPIRED_TAG:
                return
            if not self.store.keys.adopting():
                self.progress.failures.append(f"{place} is not encrypted (plaintext or damaged)")
            return
        try:
            self.store.sealer.open(place, data)
        except SealError as exc:
            self.progress.failures.append(str(exc))

    def _json(self, place: Place, text: Any, plain: frozenset[str] = frozenset()) -> str | None:
        """A JSON column's text with its sealed part and its operator texts
        sealed again under the newest key (adopting: plaintext JSON sealed,
        keeping ``plain`` keys in the clear); ``None`` if nothing needed it."""
        if self.adopt and isinstance(text, str) and '"sealed"' not in text:
            try:
                value = _DECODE.decode(text)
            except msgspec.DecodeError:
                return None
            if isinstance(value, dict) and any(k not in plain for k in value):
                self.progress.versions[0] += 1
                if self.move:
                    sealed = self.store.sealer.seal_json(place, value, plain)
                    return _ENCODE.encode(sealed).decode()
            return None
        if not isinstance(text, str) or ("sealed" not in text and REASON_PREFIX not in text):
            return None
        try:
            value = _DECODE.decode(text)
        except msgspec.DecodeError:
            return None
        if not isinstance(value, dict):
            return None
        changed = False
        for key, item in list(value.items()):
            if not isinstance(item, str):
                continue
            if key == "sealed":
                at, raw, prefix = place, item, ""
            elif item.startswith(REASON_PREFIX):
                at, raw, prefix = reason_place(self.tenant), item[len(REASON_PREFIX):], REASON_PREFIX
            else:
                continue
            try:
                again = self._bytes(at, base64.b64decode(raw, validate=True))
            except (binascii.Error, ValueError):
                continue
            if again is not None:
                value[key] = prefix + base64.b64encode(again).decode()
                changed = True
        return _ENCODE.encode(value).decode() if changed else None

    def _write(self, name: str, params: dict[str, Any]) -> None:
        if self.inner.rekey_set(name, params):
            self.progress.moved += 1
        else:
            self.progress.raced += 1

    def _rest(self) -> None:
        if self.pause > 0:
            time.sleep(self.pause)

    def run(self) -> Progress:
        """One pass over the tenant's artifacts, runs, entries, messages and memory."""
        self._artifacts()
        self._runs()
        self._history()
        self._mailbox()
        self._items()
        self._cold()
        self._run_memory()
        self._threads()
        self._approvals()
        self._workspace()
        self._lg_values()
        self._lg_checkpoints()
        return self.progress

    def _lg_values(self) -> None:
        """A LangGraph thread's values (``CairnSaver``), at their digest: the
        digest stays (the rows naming the value keep naming it)."""
        after_thread, after_digest, first = "", 0, True  # ``first``: from the start (a thread id may be "")
        while rows := self.inner.rekey_page("rekey_lg_values_page", {
                "tenant": self.tenant, "first": first, "after_thread": after_thread,
                "after_digest": after_digest, "limit": self.page}):
            for thread_id, digest, data in rows:
                data = bytes(data)
                new = self._bytes(Place(self.tenant, thread_id, "lg_values", str(digest), "value"), data)
                if new is not None:
                    self._write("rekey_lg_value_set", {"tenant": self.tenant, "thread_id": thread_id,
                                                       "digest": digest, "data": new, "old_data": data})
            after_thread, after_digest, first = rows[-1][0], rows[-1][1], False
            self._rest()

    def _lg_checkpoints(self) -> None:
        """A LangGraph thread's checkpoints and their metadata, each at its
        place (``lg_checkpoints``, the namespace and the checkpoint id, as
        ``cairn.langgraph._position`` names it: not imported, the saver needs
        the langgraph extra)."""
        after_thread, after_ns, after_id, first = "", "", "", True
        while rows := self.inner.rekey_page("rekey_lg_checkpoints_page", {
                "tenant": self.tenant, "first": first, "after_thread": after_thread, "after_ns": after_ns,
                "after_id": after_id, "limit": self.page}):
            for thread_id, ns, checkpoint_id, checkpoint, metadata in rows:
                checkpoint, metadata = bytes(checkpoint), bytes(metadata)
                at = f"{len(ns)}:{ns}{checkpoint_id}"
                new_checkpoint, new_metadata = (
                    self._bytes(Place(self.tenant, thread_id, "lg_checkpoints", at, kind), data)
                    for kind, data in (("checkpoint", checkpoint), ("metadata", metadata)))
                if new_checkpoint is not None or new_metadata is not None:
                    self._write("rekey_lg_checkpoint_set", {
                        "tenant": self.tenant, "thread_id": thread_id, "ns": ns,
                        "checkpoint_id": checkpoint_id, "checkpoint": new_checkpoint or checkpoint,
                        "metadata": new_metadata or metadata, "old_checkpoint": checkpoint,
                        "old_metadata": metadata})
            after_thread, after_ns, after_id, first = rows[-1][0], rows[-1][1], rows[-1][2], False
            self._rest()

    def _runs(self) -> None:
        after = ""
        while rows := self.inner.rekey_page("rekey_runs_page", {"tenant": self.tenant, "after": after,
                                                                "limit": self.page}):
            for run_id, data, result, error in rows:
                data, result = (None if d is None else bytes(d) for d in (data, result))
                at = Place(self.tenant, run_id, "runs", "-", "input")
                new_input = self._bytes(at, data)
                new_result = self._bytes(Place(self.tenant, run_id, "runs", "-", "result"), result)
                new_error = self._json(Place(self.tenant, run_id, "runs", "-", "error"), error)
                if new_input or new_result or new_error:
                    self._write("rekey_run_set", {
                        "run_id": run_id, "input": new_input or data, "result": new_result or result,
                        "error": new_error or error, "old_input": data, "old_result": result,
                        "old_error": error})
            after = rows[-1][0]
            self._rest()

    def _history(self) -> None:
        after_run, after_seq = "", 0
        while rows := self.inner.rekey_page("rekey_history_page", {
                "tenant": self.tenant, "after_run": after_run, "after_seq": after_seq, "limit": self.page}):
            for run_id, seq, position, payload, spilled, detail in rows:
                payload = None if payload is None else bytes(payload)
                linked = payload is not None and payload[:2] == LINK_TAG
                envelope = (None if spilled is None else bytes(spilled)) if linked else payload
                value = _sealed_json(detail)
                by_op = value is not None and value[0].get("sealed_at") == "op"
                at = f"op {position}" if by_op else f"seq {seq}"
                new_payload = self._bytes(Place(self.tenant, run_id, "history", at, "payload"), envelope,
                                          packed=True)
                new_detail = self._json(Place(self.tenant, run_id, "history", at, "detail"), detail,
                                        PLAIN_DETAIL)
                if new_payload is not None or new_detail is not None:  # sealed from now on: keep its
                    self.inner.store_audit_digest(run_id, seq)  # plain digest (not recomputable then)
                if new_payload is not None and linked:
                    self._write("rekey_spilled_set", {"link": payload, "payload": new_payload,
                                                      "old_payload": envelope})
                    new_payload = None
                if new_payload is not None or new_detail is not None:
                    self._write("rekey_history_set", {
                        "run_id": run_id, "seq": seq, "payload": new_payload or payload,
                        "detail": new_detail or detail, "old_payload": payload, "old_detail": detail})
            after_run, after_seq = rows[-1][0], rows[-1][1]
            self._rest()

    def _mailbox(self) -> None:
        after_run, after_seq = "", 0
        while rows := self.inner.rekey_page("rekey_mailbox_page", {
                "tenant": self.tenant, "after_run": after_run, "after_seq": after_seq, "limit": self.page}):
            for run_id, seq, key, payload in rows:
                payload = bytes(payload)
                new = self._bytes(Place(self.tenant, run_id, "mailbox", key, "payload"), payload)
                if new is not None:
                    self._write("rekey_mailbox_set", {"run_id": run_id, "seq": seq, "payload": new,
                                                      "old_payload": payload})
            after_run, after_seq = rows[-1][0], rows[-1][1]
            self._rest()

    def _items(self) -> None:
        after_ns, after_key = "", ""
        while rows := self.inner.rekey_page("rekey_items_page", {
                "tenant": self.tenant, "after_ns": after_ns, "after_key": after_key, "limit": self.page}):
            for namespace, key, value, text in rows:
                value = None if value is None else bytes(value)
                where = _ENCODE.encode([namespace, key]).decode()
                new_value = self._bytes(Place(self.tenant, "-", "memory_items", where, "value"), value)
                new_text = None
                if text is not None:
                    try:
                        sealed = base64.b64decode(text, validate=True)
                    except (binascii.Error, ValueError):
                        sealed = None
                    if version_of(sealed) is None:  # plaintext (adopting)
                        sealed = text.encode()
                    again = self._bytes(Place(self.tenant, "-", "memory_items", where, "index_text"), sealed)
                    new_text = None if again is None else base64.b64encode(again).decode()
                if new_value is not None or new_text is not None:
                    self._write("rekey_item_set", {
                        "tenant": self.tenant, "namespace": namespace, "key": key,
                        "value": new_value or value, "index_text": new_text or text,
                        "old_value": value, "old_index_text": text})
            after_ns, after_key = rows[-1][0], rows[-1][1]
            self._rest()

    def _cold(self) -> None:
        """The cold copies of items: thawed, their envelope sealed again at
        the item's value place, frozen again (compare-and-set on the old
        compressed bytes; a rewarm or a put since drops the copy: nothing to write)."""
        after_ns, after_key = "", ""
        while rows := self.inner.rekey_page("rekey_cold_page", {
                "tenant": self.tenant, "after_ns": after_ns, "after_key": after_key, "limit": self.page}):
            for namespace, key, codec, size, value in rows:
                value = bytes(value)
                where = _ENCODE.encode([namespace, key]).decode()
                held = thaw(codec, size, value, what=f"the cold copy of memory item {where}")
                again = self._bytes(Place(self.tenant, "-", "memory_items", where, "value"), held)
                if again is not None:
                    codec, size, frozen = freeze(again)
                    self._write("rekey_cold_set", {"tenant": self.tenant, "namespace": namespace, "key": key,
                                                   "codec": codec, "size": size, "value": frozen,
                                                   "old_value": value})
            after_ns, after_key = rows[-1][0], rows[-1][1]
            self._rest()

    def _run_memory(self) -> None:
        after_run, after_key = "", ""
        while rows := self.inner.rekey_page("rekey_run_memory_page", {
                "tenant": self.tenant, "after_run": after_run, "after_key": after_key, "limit": self.page}):
            for run_id, key, value in rows:
                value = bytes(value)
                new = self._bytes(Place(self.tenant, run_id, "memory_run", key, "value"), value)
                if new is not None:
                    self._write("rekey_run_memory_set", {"run_id": run_id, "key": key, "value": new,
                                                         "old_value": value})
            after_run, after_key = rows[-1][0], rows[-1][1]
            self._rest()

    def _threads(self) -> None:
        after_thread, after_idx = "", -1
        while rows := self.inner.rekey_page("rekey_thread_page", {
                "tenant": self.tenant, "after_thread": after_thread, "after_idx": after_idx,
                "limit": self.page}):
            for thread_id, idx, value in rows:
                value = bytes(value)
                new = self._bytes(Place(self.tenant, "-", "memory_threads", thread_id, "value"), value)
                if new is not None:
                    self._write("rekey_thread_set", {"tenant": self.tenant, "thread_id": thread_id,
                                                     "idx": idx, "value": new, "old_value": value})
            after_thread, after_idx = rows[-1][0], rows[-1][1]
            self._rest()

    def _approvals(self) -> None:
        """Decision comments: base64 text of an envelope (plaintext, adopting)."""
        after_run, after_request = "", ""
        while rows := self.inner.rekey_page("rekey_approvals_page", {
                "tenant": self.tenant, "after_run": after_run, "after_request": after_request,
                "limit": self.page}):
            for run_id, request_id, comment in rows:
                try:
                    sealed: bytes | None = base64.b64decode(comment, validate=True)
                except (binascii.Error, ValueError):
                    sealed = None
                if version_of(sealed) is None:  # plaintext (adopting)
                    sealed = comment.encode()
                again = self._bytes(Place(self.tenant, run_id, "approvals", request_id, "comment"), sealed)
                if again is not None:
                    self._write("rekey_approval_set", {"run_id": run_id, "request_id": request_id,
                                                       "comment": base64.b64encode(again).decode(),
                                                       "old_comment": comment})
            after_run, after_request = rows[-1][0], rows[-1][1]
            self._rest()

    def _workspace(self) -> None:
        """Workspace objects (their stored id is their address). Plaintext
        ones (stored before encryption, at their ids) are left to reading as
        they are while adopting: sealing one in place would put it at the
        wrong address."""
        after = ""
        while rows := self.inner.rekey_page("rekey_ws_page", {"tenant": self.tenant, "after": after,
                                                              "limit": self.page}):
            for address, data in rows:
                data = bytes(data)
                if version_of(data) is None:
                    continue
                # ``wssealed.place_of`` (not imported: it imports this module, through ``sealing``)
                new = self._bytes(Place(self.tenant, "-", "workspace_objects", address, "object"), data)
                if new is not None:
                    self._write("rekey_ws_set", {"tenant": self.tenant, "oid": address, "data": new,
                                                 "old_data": data})
            after = rows[-1][0]
            self._rest()

    def _artifacts(self) -> None:
        """The artifacts the tenant's rows name, counted per key version
        (plaintext ones as version 0) and, moving, those on an older key
        sealed again at their name (see the module doc). A missing one (collected
        since its row was read) is not counted."""
        after = ""
        while rows := self.inner.rekey_page("rekey_artifact_refs_page", {
                "tenant": self.tenant, "after": after, "limit": self.page}):
            for (ref,) in rows:
                try:
                    data = self.inner.read_artifact(ref)
                except PayloadError:
                    continue
                version = version_of(data) or 0
                self.progress.artifacts[version] += 1
                if not self.move or not 0 < version < self.progress.newest:
                    continue
                again = self.store.artifacts.resealed(self.tenant, ref, data)
                if self.inner.replace_artifact(ref, data, again):
                    self.progress.moved += 1
                    self.progress.artifacts_moved += 1
                else:
                    self.progress.raced += 1
                    self.progress.artifacts_raced += 1
            after = rows[-1][0]
            self._rest()
