"""Encryption at rest: a store whose run data is sealed before any row is made.

``SealedStore`` wraps a SQL store (SQLite or PostgreSQL alike) at the store
contract, the one way to the database: every value a run stores passes here
on its way in and out, with what the row mapping alone does not know, the
run's tenant. Each value becomes an envelope (``cairn.security.envelope``)
sealed with the tenant's newest data key and bound to its place:

=========================  ==================================================
value                      place (table, position, kind)
=========================  ==================================================
run input / result         ``runs``, ``-``, ``input`` / ``result``
run error (JSON)           ``runs``, ``-``, ``error``
entry payload / detail     ``history``, ``seq N``, ``payload`` / ``detail``
mailbox message (signals,  ``mailbox``, the wait key, ``payload`` (a message's
approval decisions)        ``seq`` is the store's to assign, after sealing)
artifact                   ``artifacts``, its address, ``data`` (run ``-``: shared by
                           the tenant's runs; ``cairn.store.sealedartifacts``)
memory item value / text   ``memory_items``, ``[namespace, key]``, ``value`` /
                           ``index_text`` (run ``-``)
run memory                 ``memory_run``, the key, ``value``
thread message / summary   ``memory_threads``, the thread, ``value`` (run ``-``)
operator text (a reason,   ``operator``, ``-``, ``reason`` (run ``-``)
a migration's check/reason)
approval decision comment  ``approvals``, the request id, ``comment``
=========================  ==================================================

JSON columns keep the keys the database itself reads in plaintext (a model
entry's ``usage`` and ``cost``, summed in SQL by ``run_usage``; a rewind's
``from_position``) and hold the rest under ``"sealed"``. The entry an
operator's ``resolve_operation`` writes gets its ``seq`` inside the store,
so its values are bound to ``op <position>`` (marked ``"sealed_at": "op"``).

No plaintext fallback: with encryption on, a payload that is not an
envelope, or one that does not open at the place it is read from, raises
``SealError`` naming that place. A claimed run whose values do not open
(a wrong or missing key) is parked as ``needs_attention`` with that error
and not returned, so nothing is executed or overwritten.

Not sealed (see docs/design.md, "Encryption at rest"): the JSON the store
composes itself from its own columns (a quarantine's cause, lease and budget
details: counts, times, worker names, limits; no run value). LangGraph
checkpoints are sealed by the saver (``cairn.langgraph``) with this store's
sealer. Keys and the sealing itself are ``cairn.store.sealing``; rotation,
adoption and verification passes ``cairn.store.rekey`` (whose
``SEALED_COLUMNS`` lists every sealed column); a step's entry, what a run
appends most, is sealed and digested in one pass by ``cairn.store.sealedsteps``
(``append``).
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import itertools
import operator
import secrets
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec

from cairn.errors import RunNotFound
from cairn.security.envelope import (
    Place,
    SealError,
    is_envelope,
    place_of,
    tenant_tag,
)
from cairn.security.keyring import Keyring
from cairn.store import sealedsteps
from cairn.store.auditkeys import AuditKeys
from cairn.store.contract import Store
from cairn.store.keysql import DataKeyRow
from cairn.store.lifecycle import check_artifact
from cairn.store.memrecords import (
    ItemPut,
    MemoryItem,
    MemoryWrite,
    Provenance,
    RunMemory,
    RunPut,
    ThreadAppend,
    ThreadCompact,
    ThreadMessage,
)
from cairn.store.records import (
    Approval,
    ApprovalRequest,
    ApprovalStatus,
    BundleRecord,
    Claim,
    Delivery,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
    RunFilter,
    RunRecord,
    RunStatus,
)
from cairn.store.rekey import REASON_PREFIX, Progress, Rekeyer
from cairn.store.schedules import Fired
from cairn.store.sealedartifacts import SealedArtifacts
from cairn.store.sealing import DataKeys, Sealer, context
from cairn.store.vectorindex import EmbeddingClaim
from cairn.store.wssealed import WORKSPACE_KEY, SealedObjects
from cairn.store.wssql import check_oids

if TYPE_CHECKING:

    from cairn.store.transactions import Tx

R = TypeVar("R")

#: how many runs' tenants a store remembers before it forgets them all (``SealedStore._tenant``)
TENANT_CACHE = 65536
#: how many artifacts put but not yet stored for a run a store keeps (``SealedStore.put_artifact``)
PENDING_ARTIFACTS = 64

_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()


def _run_place(run: RunRecord | NewRun, kind: str) -> Place:
    return place_of((run.tenant, run.run_id, "runs", "-", kind))


def _comment_place(tenant: str, run_id: str, request_id: str) -> Place:
    """Where an approval's decision comment is sealed: its request's row."""
    return Place(tenant, run_id, "approvals", request_id, "comment")


def _entry_position(event: HistoryEvent) -> str:
    detail = event.detail
    if isinstance(detail, dict) and detail.get("sealed_at") == "op":
        return f"op {event.position}"
    return f"seq {event.seq}"


def _with(e: HistoryEvent, payload: Payload | None, detail: dict[str, Any] | None) -> HistoryEvent:
    """``e`` with another payload and detail."""
    return HistoryEvent(e.run_id, e.seq, e.event, e.at, e.epoch, e.worker, e.position, e.step_kind, e.name,
                        e.input_hash, e.attempt, e.started_at, payload, detail)


D = TypeVar("D")


#: a frozen, slotted dataclass's fields read in one call, their slots (member descriptors) in the
#: same order, and the slots by name (``_replaced``)
_Slots = tuple[Callable[[Any], tuple[Any, ...]], tuple[Any, ...], dict[str, Any]]
#: sets a slot of an object, given the slot's member descriptor: what the generated ``__init__`` of a
#: frozen, slotted class does through ``object.__setattr__``, which its own ``__setattr__`` refuses
_SET_SLOT = types.MemberDescriptorType.__set__
#: runs an iterator to its end in C, keeping nothing
_CONSUME: Callable[[Iterable[Any]], None] = collections.deque[Any](maxlen=0).extend


#: ``_slots`` of each class ``_replaced`` has copied
_SLOTS: dict[type, _Slots] = {}


def _slots(cls: type) -> _Slots:
    """``cls``'s fields as ``_replaced`` copies them (see ``_Slots``), kept in ``_SLOTS``."""
    names = [f.name for f in dataclasses.fields(cls)]
    slots = {name: cls.__dict__[name] for name in names}
    read: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
    if len(names) == 1:  # ``attrgetter`` of one name gives the value, not a tuple of it
        one = operator.attrgetter(names[0])
        read = lambda record: (one(record),)  # noqa: E731
    found = _SLOTS[cls] = (read, tuple(slots.values()), slots)
    return found


def _replaced(record: D, **changes: Any) -> D:
    """``dataclasses.replace(record, **changes)`` for a record the store
    built and checked (a ``NewRun``, ``RunRecord``, ``Claim``), without
    running its ``__init__`` and ``__post_init__`` again: ``NewRun``'s
    checks its names with regular expressions (the largest single cost
    sealing added to a run's start in the profile), and ``replace`` itself
    loops over the fields in Python before calling ``__init__`` (opening a
    run record: 886 of the 1,759 bytecodes ``get_run`` ran with encryption
    on, sys.settrace; issue 25, 2026-12-07). Its fields are read in one call
    and set in one, slot by slot, in C; then the changed ones."""
    cls: type[Any] = type(record)
    read, slots, by_name = _SLOTS.get(cls) or _slots(cls)
    new: D = object.__new__(cls)
    _CONSUME(map(_SET_SLOT, slots, itertools.repeat(new), read(record)))
    for name, value in changes.items():
        _SET_SLOT(by_name[name], new, value)
    return new


#: the attributes of a ``SealedStore`` itself (every other one is its inner store's)
_OWN = frozenset({"inner", "keys", "sealer", "_tenants", "_pending", "_resolved", "_artifact_lock",
                  "audit_keys", "_workspace", "artifacts", "_subjects", "_hot", "acting"})


class SealedStore:
    """A store (``inner``) whose run data is sealed; see the module doc.
    Everything it does not seal is the inner store's, unchanged."""

    #: what ``cairn.store.with_keyring`` tells a sealed store by
    sealed = True

    def __init__(self, inner: Store, keyring: Keyring) -> None:
        self.inner = inner
        self.keys = DataKeys(inner, keyring)
        #: run -> its subject (``None``: none), read once per run (a run's subject never changes)
        self._subjects: dict[str, str | None] = {}
        self.sealer = Sealer(self.keys, self._subject_of, self._subjects)
        self._tenants: dict[str, str] = {}
        #: artifacts put but not yet sealed: a stand-in ref -> the plaintext (see ``put_artifact``)
        self._pending: OrderedDict[str, bytes] = OrderedDict()
        #: (stand-in ref, tenant) -> the ref of the sealed artifact stored for it
        self._resolved: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._artifact_lock = threading.Lock()
        # the audit chain digests what an entry says, keyed by its tenant (store/auditkeys.py)
        self.audit_keys = AuditKeys(inner, self.keys, self.audit_plaintext, self._tenant)
        inner.audit_digest = self.audit_keys.digest  # type: ignore[attr-defined]
        inner.audit_plain_before = self.audit_keys.plain_before_keys  # type: ignore[attr-defined]
        inner.audit_earlier = self.audit_keys.earlier  # type: ignore[attr-defined]
        # archives are sealed whole, bound to tenant and run (store/archivesql.py)
        inner.archive_sealer = self.sealer  # type: ignore[attr-defined]
        self._workspace = SealedObjects(inner, self.keys, self.sealer)
        self.artifacts = SealedArtifacts(inner, self.keys, self.sealer)
        #: what a step's sealing uses, read in one attribute lookup: every lookup on this object
        #: goes through ``__getattr__``'s hook, which the interpreter cannot specialize (about 600
        #: instructions each, a dozen a step); the inner store itself, so that a method set on it
        #: later is the one called
        self._hot: sealedsteps.Hot = (self._tenants, self.keys.writing, self._subjects, self.audit_keys.keyed,
                     self.audit_keys.known, self.sealer.seal_at, self.audit_keys.sealed, inner)
        acting = getattr(inner, "acting", None)
        if acting is not None:  # ``oplog.acting`` asks for it every run: found here, not by ``__getattr__``
            self.acting = acting

    def audit_plaintext(self, event: HistoryEvent, tenant: str | None) -> tuple[bytes | None, Any]:
        """``event``'s payload bytes and detail opened: what its audit digest covers."""
        opened = self._open_event(tenant if tenant is not None else self._tenant(event.run_id), event)
        return (None if opened.payload is None else opened.payload.data), opened.detail

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """The wrapper's own state is its own; any other attribute set on it
        (a store's ``clock``, say) is the inner store's, as it is read."""
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    # -- artifacts -------------------------------------------------------------------------

    def put_artifact(self, data: bytes) -> str:
        """A stand-in ref for ``data`` (64 random hex digits), nothing stored
        yet: the value codec puts an artifact without saying whose it is, so
        it is sealed and stored when a payload naming it is stored for a run
        (``_payload``), with that run's tenant key. Its real ref is its
        address, a keyed hash of the content per tenant that survives
        re-encryption (``cairn.store.sealedartifacts``): equal content of one
        tenant stored once, nothing shared or learnt across tenants."""
        token = secrets.token_hex(32)
        with self._artifact_lock:
            self._pending[token] = data
            while len(self._pending) > PENDING_ARTIFACTS:
                self._pending.popitem(last=False)
        return token

    def _artifact_ref(self, tenant: str, token: str, run: str = "-", subject: str | None = None) -> str:
        """The sealed artifact's ref for stand-in ``token`` in ``tenant``'s data (stored now if needed)."""
        with self._artifact_lock:
            done = self._resolved.get((token, tenant))
            data = self._pending.get(token)
        if done is not None:
            return done
        if data is None:
            raise SealError(f"artifact {token} was never stored: its value is gone (put_artifact's "
                            f"stand-ins are kept for the last {PENDING_ARTIFACTS} values)")
        if subject is None and run != "-":
            subject = self.sealer.subject_of(run)
        if subject is None:
            ref = self.artifacts.put(tenant, data)
        else:  # sealed with the subject's key, at an address of the subject's: dedup within the subject
            ref = self.artifacts.put(tenant, data, self.sealer.writer(tenant, run, subject),
                                     scope=self.keys.subject_digest(tenant, subject))
        with self._artifact_lock:
            self._resolved[(token, tenant)] = ref
            while len(self._resolved) > 16 * PENDING_ARTIFACTS:
                self._resolved.popitem(last=False)
        return ref

    def get_artifact(self, ref: str) -> bytes:
        with self._artifact_lock:
            pending = self._pending.get(ref)
        if pending is not None:
            return pending
        data = self.inner.read_artifact(ref)
        if not is_envelope(data) and self.keys.adopting():
            check_artifact(ref, data, "the artifact store")  # stored before encryption was turned on
            return data
        if len(data) < 12 or data[0] != 0xCE:
            raise SealError(f"artifact {ref} is not encrypted (plaintext or damaged): refused, "
                            "encryption is on")
        tag = bytes(data[8:12])
        tenant = self.sealer.artifact_tenants.get(ref)
        if tenant is None:  # a ref no run named here yet: whose it is, from its header
            tenant = next((t for t in self.keys.tenants() if tenant_tag(t) == tag), None)
        if tenant is None:
            raise SealError(f"artifact {ref} was sealed for a tenant without a stored data key: refused")
        return self.artifacts.open(tenant, ref, data)

    def _payload(self, place: Place, payload: Payload | None, subject: str | None = None) -> Payload | None:
        """``payload`` as stored at ``place``: its bytes sealed, or its
        artifact (a stand-in ref) sealed and stored (with ``subject``'s key,
        else the run's subject's, else the tenant's)."""
        if payload is None:
            return None
        if payload.data is not None:
            return Payload(self.sealer.seal(place, payload.data, subject), payload.ref)
        if payload.ref is not None:
            return Payload(None, self._artifact_ref(place.tenant, payload.ref, place.run, subject))
        return payload

    # -- workspace objects (``store.wssealed``) ---------------------------------------------

    def put_workspace_objects(self, run_id: str, epoch: int, objects: Mapping[str, bytes]) -> None:
        self._workspace.put(self._tenant(run_id), run_id, epoch, objects)

    def workspace_objects(self, tenant: str, oids: Collection[str]) -> dict[str, bytes]:
        return self._workspace.get(tenant, oids)

    def workspace_roots(self, tenant: str) -> set[str]:
        """The roots of plain details and of sealed ones, opened (each at
        its own place: a detail that does not open raises ``SealError``, and
        the collection then deletes nothing)."""
        roots = set(self.inner.workspace_plain_roots(tenant))
        by_run: dict[str, list[int]] = {}
        for run_id, seq in self.inner.workspace_sealed_entries(tenant):
            by_run.setdefault(run_id, []).append(seq)
        for run_id, seqs in by_run.items():
            for event in self.history_at(run_id, seqs):
                root = (event.detail or {}).get(WORKSPACE_KEY)
                if isinstance(root, str):
                    roots.add(root)
        check_oids(roots)
        return roots

    def workspace_keys(self, tenant: str, oids: Collection[str]) -> set[str]:
        return self._workspace.keys_of(tenant, oids)

    # -- places ------------------------------------------------------------------------

    def _tenant(self, run_id: str) -> str:
        """The run's tenant: remembered from every record seen (a run's tenant never changes), else read."""
        tenant = self._tenants.get(run_id)
        if tenant is None:
            run = self.inner.get_run(run_id)
            if run is None:
                raise RunNotFound(run_id)
            tenant = self._remember(run_id, run.tenant)
        return tenant

    def _subject_of(self, run_id: str) -> str | None:
        """The run's subject: remembered from its creation here, else read once."""
        try:
            return self._subjects[run_id]
        except KeyError:
            pass
        if len(self._subjects) >= TENANT_CACHE:
            self._subjects.clear()
        subject = self._subjects[run_id] = self.inner.run_subject(run_id)
        return subject

    def _remember(self, run_id: str, tenant: str) -> str:
        if len(self._tenants) >= TENANT_CACHE:  # a worker's lifetime of runs: start over, never grow
            self._tenants.clear()
        self._tenants[run_id] = tenant
        return tenant

    def _seal_event(self, tenant: str, event: HistoryEvent) -> HistoryEvent:
        """``event`` with its payload and detail sealed (once per step: no
        ``dataclasses.replace``, several times slower than the constructor;
        a step's result sealed in one call, ``Sealer.seal_at``)."""
        payload, detail = event.payload, event.detail
        if payload is None and not detail:
            return event
        at = _entry_position(event) if detail else f"seq {event.seq}"
        if payload is not None:
            data = payload.data
            if data is not None:
                payload = Payload(self.sealer.seal_at(tenant, event.run_id, "history", at, "payload", data),
                                  payload.ref)
                if not detail:  # its audit digest from the plaintext at hand (``AuditKeys.sealed``)
                    e = event  # ``_with``, written out: once per step
                    sealed = HistoryEvent(e.run_id, e.seq, e.event, e.at, e.epoch, e.worker, e.position,
                                          e.step_kind, e.name, e.input_hash, e.attempt, e.started_at, payload,
                                          detail)
                    self.audit_keys.sealed(sealed, tenant, data, detail)
                    return sealed
            else:
                payload = self._payload(Place(tenant, event.run_id, "history", at, "payload"), payload)
        if detail:
            detail = self.sealer.seal_json(Place(tenant, event.run_id, "history", at, "detail"), detail)
        return _with(event, payload, detail)

    def _open_event(self, tenant: str, event: HistoryEvent) -> HistoryEvent:
        payload, detail = event.payload, event.detail
        if detail is None:  # a step's entry: its payload alone, at ``seq N`` (``_entry_position``)
            if payload is None or payload.data is None:
                return event
            e = event  # ``_with``, written out: once per entry read (replay, recovery)
            place = place_of((tenant, e.run_id, "history", f"seq {e.seq}", "payload"))
            opened = self.sealer.open_payload(place, payload)
            return HistoryEvent(e.run_id, e.seq, e.event, e.at, e.epoch, e.worker, e.position, e.step_kind,
                                e.name, e.input_hash, e.attempt, e.started_at, opened, None)
        sealed_detail = isinstance(detail, dict) and ("sealed" in detail or any(
            isinstance(v, str) and v.startswith(REASON_PREFIX) for v in detail.values()))
        if (payload is None or payload.data is None) and not sealed_detail:
            return event
        at = _entry_position(event)
        return _with(event,
                     self.sealer.open_payload(Place(tenant, event.run_id, "history", at, "payload"), payload),
                     self.sealer.open_json(Place(tenant, event.run_id, "history", at, "detail"), detail))

    def _seal_events(self, run_id: str, events: Sequence[HistoryEvent]) -> list[HistoryEvent]:
        tenant = self._tenants.get(run_id) or self._tenant(run_id)
        if len(events) == 1:  # a step's append: no comprehension's frame
            return [self._seal_event(tenant, events[0])]
        return [self._seal_event(tenant, e) for e in events]

    def _open_events(self, run_id: str, events: Sequence[HistoryEvent]) -> list[HistoryEvent]:
        if not events:
            return []
        tenant = self._tenant(run_id)
        return [self._open_event(tenant, e) for e in events]

    def _sealed_input(self, run: NewRun) -> Payload:
        """``run``'s input sealed at its place (its tenant and subject remembered)."""
        run_id = run.run_id
        tenants, _, _, _, _, seal_at, _, _ = self._hot
        if len(tenants) >= TENANT_CACHE:  # ``_remember``, written out: once per run
            tenants.clear()
        tenants[run_id] = run.tenant
        subjects = self._subjects
        if len(subjects) >= TENANT_CACHE:
            subjects.clear()
        subjects[run_id] = run.subject
        given = run.input
        if given.data is not None:
            return Payload(seal_at(run.tenant, run_id, "runs", "-", "input", given.data), given.ref)
        return self._value(_run_place(run, "input"), given)

    def _seal_new(self, run: NewRun) -> NewRun:
        """A copy of ``run`` with its input sealed (``create_claimed_run`` swaps it in place instead)."""
        return _replaced(run, input=self._sealed_input(run))

    def _open_run(self, run: RunRecord) -> RunRecord:
        self._remember(run.run_id, run.tenant)
        return _replaced(
            run,
            input=self.sealer.open_payload(_run_place(run, "input"), run.input) or run.input,
            result=self.sealer.open_payload(_run_place(run, "result"), run.result),
            error=self.sealer.open_json(_run_place(run, "error"), run.error),
        )

    def _seal_error(self, run_id: str, error: dict[str, Any] | None) -> dict[str, Any] | None:
        if error is None:
            return None
        return self.sealer.seal_json(Place(self._tenant(run_id), run_id, "runs", "-", "error"), error,
                                     frozenset())

    def _mail_place(self, tenant: str, run_id: str, key: str) -> Place:
        return Place(tenant, run_id, "mailbox", key, "payload")

    def _open_delivery(self, tenant: str, delivery: Delivery) -> Delivery:
        place = self._mail_place(tenant, delivery.run_id, delivery.key)
        return dataclasses.replace(delivery, payload=self.sealer.open_payload(place, delivery.payload))

    def _open_approval(self, approval: Approval) -> Approval:
        tenant = approval.tenant
        request = self.sealer.open_payload(
            Place(tenant, approval.run_id, "history", f"seq {approval.request_seq}", "payload"),
            approval.request)
        decision = self.sealer.open_payload(
            self._mail_place(tenant, approval.run_id, f"approval:{approval.request_id}"), approval.decision)
        comment = self._open_text(_comment_place(tenant, approval.run_id, approval.request_id),
                                  approval.comment)
        return dataclasses.replace(approval, request=request, decision=decision, comment=comment)

    def _open_claim(self, claim: Claim, worker: str) -> Claim | None:
        """The claim opened; ``None`` if its values do not open: the run is
        then parked as ``needs_attention`` with the error (nothing else is
        written, nothing executes)."""
        run = claim.run
        try:
            return _replaced(claim, run=self._open_run(run),
                                       history=self._open_events(run.run_id, claim.history))
        except SealError as exc:
            stop = HistoryEvent(run_id=run.run_id, seq=claim.next_seq, event=EventType.RUN_NEEDS_ATTENTION,
                                at=self.inner.clock(), epoch=run.epoch, worker=worker,
                                detail={"error": {"type": "SealError", "message": str(exc)}})
            self.inner.suspend_run(run.run_id, run.epoch, stop, None, None, RunStatus.NEEDS_ATTENTION)
            return None

    # -- runs ----------------------------------------------------------------------------

    def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        record, created = self.inner.create_run(self._seal_new(run))
        return self._open_run(record), created

    def create_claimed_run(self, run: NewRun, worker: str, lease_seconds: float) -> Claim | None:
        """The run created with its input sealed, without a copy of ``run``
        or of its input: the input's bytes are swapped for the sealed ones
        for the inner store's call and put back after, whatever happens (a
        copy of the frozen record, field by field, was 32,000 instructions,
        a seventh of what sealing added to a 3-step run on main, callgrind;
        a new ``Payload`` for the sealed bytes and another for the claim's
        plaintext, 2,400 more). ``run`` and its input are the caller's,
        built for this call (``App.run``, a workspace import), and never
        shared with another thread meanwhile."""
        given = run.input
        data = given.data
        if data is None:  # an artifact's stand-in: sealed and stored, and its real ref put in
            return self._create_claimed_with(run, self._sealed_input(run), worker, lease_seconds)
        tenants, _, subjects, _, _, seal_at, _, inner = self._hot
        run_id, tenant = run.run_id, run.tenant
        if len(tenants) >= TENANT_CACHE:  # ``_remember``, written out: once per run
            tenants.clear()
        tenants[run_id] = tenant
        if len(subjects) >= TENANT_CACHE:
            subjects.clear()
        subjects[run_id] = run.subject
        given.data = seal_at(tenant, run_id, "runs", "-", "input", data)
        try:
            claim = inner.create_claimed_run(run, worker, lease_seconds)
        finally:
            given.data = data
        if claim is not None and claim.run.input is not given:  # read back, not the record passed in
            object.__setattr__(claim.run, "input", Payload(data, claim.run.input.ref))
        return claim

    def _create_claimed_with(self, run: NewRun, sealed: Payload, worker: str,
                             lease_seconds: float) -> Claim | None:
        """``create_claimed_run`` of a run whose input is an artifact: ``sealed``
        (its stored ref) swapped in for the inner store's call. Its first
        entries are the store's own (created, claimed, started): nothing to
        open, and the claim's input is the stored ref, which opens as it is."""
        given = run.input
        object.__setattr__(run, "input", sealed)
        try:
            return self.inner.create_claimed_run(run, worker, lease_seconds)
        finally:
            object.__setattr__(run, "input", given)

    def get_run(self, run_id: str) -> RunRecord | None:
        run = self.inner.get_run(run_id)
        return None if run is None else self._open_run(run)

    def list_runs(self, filter: RunFilter) -> list[RunRecord]:
        return [self._open_run(r) for r in self.inner.list_runs(filter)]

    def runs_changed(self, *args: Any, **kwargs: Any) -> list[RunRecord]:
        return [self._open_run(r) for r in self.inner.runs_changed(*args, **kwargs)]

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        return self._open_events(run_id, self.inner.history(run_id, after_seq, limit))

    def history_headers(self, run_id: str, after_seq: int = 0) -> list[HistoryEvent]:
        return self._open_events(run_id, self.inner.history_headers(run_id, after_seq))

    def history_at(self, run_id: str, seqs: Collection[int]) -> list[HistoryEvent]:
        return self._open_events(run_id, self.inner.history_at(run_id, seqs))

    def model_calls(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        return self._open_events(run_id, self.inner.model_calls(run_id, after_seq, limit))

    def latest_event(self, run_id: str, key: str) -> HistoryEvent | None:
        event = self.inner.latest_event(run_id, key)
        return None if event is None else self._open_events(run_id, [event])[0]

    def claim_runs(self, worker: str, *args: Any, **kwargs: Any) -> list[Claim]:
        claims = [self._open_claim(c, worker) for c in self.inner.claim_runs(worker, *args, **kwargs)]
        return [c for c in claims if c is not None]

    def claim_run(self, run_id: str, worker: str, lease_seconds: float, max_recoveries: int) -> Claim | None:
        claim = self.inner.claim_run(run_id, worker, lease_seconds, max_recoveries)
        return None if claim is None else self._open_claim(claim, worker)

    # -- the holder's writes -------------------------------------------------------------------

    #: a step's entry sealed and digested in one pass (``cairn.store.sealedsteps``)
    append = sealedsteps.append

    def append_memory(self, run_id: str, epoch: int, events: Sequence[HistoryEvent],
                      writes: Sequence[MemoryWrite], provenance: Provenance) -> None:
        tenant = self._tenant(run_id)
        self.inner.append_memory(run_id, epoch, [self._seal_event(tenant, e) for e in events],
                                 self._seal_writes(tenant, run_id, writes, provenance), provenance)

    def transact(self, run_id: str, epoch: int, body: Callable[[Tx], tuple[Sequence[HistoryEvent], R]]) -> R:
        def sealed(tx: Tx) -> tuple[Sequence[HistoryEvent], R]:
            events, result = body(tx)
            return self._seal_events(run_id, events), result

        return self.inner.transact(run_id, epoch, sealed)

    def suspend_run(self, run_id: str, epoch: int, event: HistoryEvent, *args: Any, **kwargs: Any) -> None:
        self.inner.suspend_run(run_id, epoch, self._seal_events(run_id, [event])[0], *args, **kwargs)

    def release_run(self, run_id: str, epoch: int, event: HistoryEvent) -> None:
        self.inner.release_run(run_id, epoch, self._seal_events(run_id, [event])[0])

    def rewind_run(self, run_id: str, epoch: int, rewound: HistoryEvent, released: HistoryEvent) -> None:
        rewound, released = self._seal_events(run_id, [rewound, released])
        self.inner.rewind_run(run_id, epoch, rewound, released)

    def finish_run(self, run_id: str, epoch: int, event: HistoryEvent, status: RunStatus,
                   result: Payload | None, error: dict[str, Any] | None) -> None:
        """The run's result sealed in place for the inner store's call and put
        back after, whatever happens (no new ``Payload``): ``result`` is the
        engine's, built for this call (``Execution.complete``)."""
        tenants, _, _, _, _, seal_at, _, inner = self._hot
        tenant = tenants.get(run_id) or self._tenant(run_id)
        if event.payload is not None or event.detail:  # a run's last entry mostly holds neither
            event = self._seal_event(tenant, event)
        sealed_error = None if error is None else self._seal_error(run_id, error)
        data = None if result is None else result.data
        if result is None or data is None:
            sealed = self._payload(Place(tenant, run_id, "runs", "-", "result"), result)
            inner.finish_run(run_id, epoch, event, status, sealed, sealed_error)
            return
        result.data = seal_at(tenant, run_id, "runs", "-", "result", data)
        try:
            inner.finish_run(run_id, epoch, event, status, result, sealed_error)
        finally:
            result.data = data

    def halt_run(self, run_id: str, epoch: int, event: HistoryEvent, error: dict[str, Any]) -> None:
        sealed = self._seal_error(run_id, error)
        assert sealed is not None
        self.inner.halt_run(run_id, epoch, self._seal_events(run_id, [event])[0], sealed)

    def start_child(self, parent_run_id: str, epoch: int, event: HistoryEvent, child: NewRun) -> RunRecord:
        record = self.inner.start_child(parent_run_id, epoch, self._seal_events(parent_run_id, [event])[0],
                                        self._seal_new(child))
        return self._open_run(record)

    def take_delivery(self, run_id: str, epoch: int, event: HistoryEvent, seq: int, *,
                      released: int | None = None) -> None:
        self.inner.take_delivery(run_id, epoch, self._seal_events(run_id, [event])[0], seq, released=released)

    def request_approval(self, run_id: str, epoch: int, event: HistoryEvent,
                         request: ApprovalRequest) -> None:
        self.inner.request_approval(run_id, epoch, self._seal_events(run_id, [event])[0], request)

    def expire_approval(self, run_id: str, epoch: int, event: HistoryEvent, request_id: str) -> bool:
        return self.inner.expire_approval(run_id, epoch, self._seal_events(run_id, [event])[0], request_id)

    # -- mailboxes and approvals ------------------------------------------------------------------

    def deliver(self, run_id: str, key: str, payload: Payload | None, *, sender: str | None = None,
                dedupe: str | None = None) -> tuple[Delivery, bool]:
        tenant = self._tenant(run_id)
        sealed = self._payload(self._mail_place(tenant, run_id, key), payload)
        delivery, new = self.inner.deliver(run_id, key, sealed, sender=sender, dedupe=dedupe)
        return self._open_delivery(tenant, delivery), new

    def deliveries(self, run_id: str, key: str | None = None, after_seq: int = 0) -> list[Delivery]:
        found = self.inner.deliveries(run_id, key, after_seq)
        return [self._open_delivery(self._tenant(run_id), d) for d in found]

    def delivery(self, run_id: str, key: str, seq: int | None = None) -> Delivery | None:
        found = self.inner.delivery(run_id, key, seq)
        return None if found is None else self._open_delivery(self._tenant(run_id), found)

    def decide_approval(self, run_id: str, request_id: str, status: ApprovalStatus, payload: Payload | None,
                        comment: str | None, *, actor: str) -> Approval:
        tenant = self._tenant(run_id)
        place = self._mail_place(tenant, run_id, f"approval:{request_id}")
        sealed = self._seal_text(_comment_place(tenant, run_id, request_id), comment)
        return self._open_approval(self.inner.decide_approval(
            run_id, request_id, status, self._payload(place, payload), sealed, actor=actor))

    def approvals(self, **kwargs: Any) -> list[Approval]:
        return [self._open_approval(a) for a in self.inner.approvals(**kwargs)]

    # -- operator actions that store a value ---------------------------------------------------------

    def resolve_operation(self, run_id: str, position: int, done: bool, result: Payload | None,
                          detail: dict[str, Any], *, actor: str | None = None) -> RunRecord:
        tenant = self._tenant(run_id)
        at = f"op {position}"
        sealed = self.sealer.seal_json(Place(tenant, run_id, "history", at, "detail"),
                                       {**detail, "sealed_at": "op"}) or {}
        payload = self._payload(Place(tenant, run_id, "history", at, "payload"), result)
        resolved = self.inner.resolve_operation(run_id, position, done, payload, sealed, actor=actor)
        return self._open_run(resolved)

    def fire_schedule(self, tenant: str, name: str, tick: float, run: NewRun | None) -> Fired:
        return self.inner.fire_schedule(tenant, name, tick, None if run is None else self._seal_new(run))

    def cancel_run(self, run_id: str, reason: str, *, actor: str | None = None) -> RunRecord:
        sealed = self.sealer.seal_text(self._tenant(run_id), reason)
        return self._open_run(self.inner.cancel_run(run_id, sealed, actor=actor))

    def retry_run(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        return self._open_run(self.inner.retry_run(run_id, actor=actor))

    def kill_runs(self, reason: str, *, run_id: str | None = None, tenant: str | None = None,
                  actor: str | None = None) -> list[RunRecord]:
        owner = tenant if tenant is not None else self._tenant(run_id) if run_id is not None else None
        sealed = reason if owner is None else self.sealer.seal_text(owner, reason)  # None: the store refuses
        killed = self.inner.kill_runs(sealed, run_id=run_id, tenant=tenant, actor=actor)
        return [self._open_run(r) for r in killed]

    def revive_run(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        return self._open_run(self.inner.revive_run(run_id, actor=actor))

    def set_budget(self, run_id: str, budget: dict[str, Any], *, actor: str | None = None) -> RunRecord:
        return self._open_run(self.inner.set_budget(run_id, budget, actor=actor))

    def migrate_run(self, run_id: str, bundle: BundleRecord, detail: dict[str, Any], *,
                    actor: str | None = None, checked_seq: int | None = None) -> RunRecord:
        """The move's detail with its texts (the replay check's finding, the
        reason of a forced move) sealed as operator text (``seal_text``): the
        store writes them into the ``run.migrated`` entry it numbers itself."""
        tenant = self._tenant(run_id)
        sealed = {k: self.sealer.seal_text(tenant, v) if isinstance(v, str) else v for k, v in detail.items()}
        return self._open_run(self.inner.migrate_run(run_id, bundle, sealed, actor=actor,
                                                     checked_seq=checked_seq))

    # -- memory: values and the text to embed --------------------------------------------------------

    def _item_place(self, tenant: str, namespace: str, key: str, kind: str) -> Place:
        return Place(tenant, "-", "memory_items", _ENCODE.encode([namespace, key]).decode(), kind)

    def _seal_text(self, place: Place, text: str | None, subject: str | None = None) -> str | None:
        return None if text is None else base64.b64encode(self.sealer.seal(place, text.encode(),
                                                                           subject)).decode()

    def _open_text(self, place: Place, text: str | None) -> str | None:
        if text is None:
            return None
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            data = b""
        if not is_envelope(data) and self.keys.adopting():
            return text  # written before encryption was turned on
        return self.sealer.open(place, data).decode()

    def _value(self, place: Place, payload: Payload, subject: str | None = None) -> Payload:
        return cast(Payload, self._payload(place, payload, subject))

    def _seal_writes(self, tenant: str, run_id: str | None, writes: Sequence[MemoryWrite],
                     provenance: Provenance) -> list[MemoryWrite]:
        """``writes`` with every value and text to embed sealed for its place
        (metadata stays plaintext: searches filter on it in SQL), with the
        key of the write's subject, else the provenance's, else the run's
        (as the store records it), else the tenant's."""
        sealed: list[MemoryWrite] = []
        default = provenance.subject
        if default is None and run_id is not None:
            default = self._subject_of(run_id)
        for write in writes:
            if isinstance(write, ItemPut):
                ns, key = write.namespace, write.key
                subject = write.subject or default
                place = self._item_place(tenant, ns, key, "value")
                write = dataclasses.replace(
                    write, value=self._value(place, write.value, subject),
                    index_text=self._seal_text(self._item_place(tenant, ns, key, "index_text"),
                                               write.index_text, subject))
            elif isinstance(write, RunPut):
                if run_id is None:
                    raise ValueError("run memory is written with its run's entry (append_memory)")
                write = dataclasses.replace(write, value=self._value(
                    Place(tenant, run_id, "memory_run", write.key, "value"), write.value))
            elif isinstance(write, ThreadAppend):
                place = self._thread_place(tenant, write.thread_id)
                messages = tuple(self._value(place, m, write.subject or default) for m in write.messages)
                write = dataclasses.replace(write, messages=messages)
            elif isinstance(write, ThreadCompact):
                write = dataclasses.replace(write, summary=self._value(
                    self._thread_place(tenant, write.thread_id), write.summary, default))
            sealed.append(write)
        return sealed

    def _thread_place(self, tenant: str, thread_id: str) -> Place:
        """A thread message's place: its index is the store's to assign, after sealing."""
        return Place(tenant, "-", "memory_threads", thread_id, "value")

    def _open_item(self, item: MemoryItem) -> MemoryItem:
        t, ns, key = item.tenant, item.namespace, item.key
        value = self.sealer.open_payload(self._item_place(t, ns, key, "value"), item.value)
        return dataclasses.replace(
            item, value=value or item.value,
            index_text=self._open_text(self._item_place(t, ns, key, "index_text"), item.index_text))

    def write_memory(self, tenant: str, writes: Sequence[MemoryWrite], provenance: Provenance) -> None:
        self.inner.write_memory(tenant, self._seal_writes(tenant, provenance.run_id, writes, provenance),
                                provenance)

    def memory_item(self, tenant: str, namespace: str, key: str, *,
                    refresh: bool = False) -> MemoryItem | None:
        item = self.inner.memory_item(tenant, namespace, key, refresh=refresh)
        return None if item is None else self._open_item(item)

    def memory_items(self, tenant: str | None, prefix: str = "", **kwargs: Any) -> list[MemoryItem]:
        return [self._open_item(i) for i in self.inner.memory_items(tenant, prefix, **kwargs)]

    def thread_messages(self, tenant: str, thread_id: str, **kwargs: Any) -> list[ThreadMessage]:
        place = self._thread_place(tenant, thread_id)
        return [dataclasses.replace(m, value=self.sealer.open_payload(place, m.value) or m.value)
                for m in self.inner.thread_messages(tenant, thread_id, **kwargs)]

    def run_memory(self, run_id: str, key: str | None = None, *,
                   tenant: str | None = None) -> list[RunMemory]:
        return [dataclasses.replace(m, value=self.sealer.open_payload(
                    Place(m.tenant, m.run_id, "memory_run", m.key, "value"), m.value) or m.value)
                for m in self.inner.run_memory(run_id, key, tenant=tenant)]

    def claim_embeddings(self, worker: str, limit: int, lease_seconds: float) -> EmbeddingClaim:
        """The claimed tasks with their text opened; a task whose text does not
        open is failed (retried in an hour, its error recorded) rather than
        failing the whole claim: one damaged row never stalls the others."""
        claim = self.inner.claim_embeddings(worker, limit, lease_seconds)
        tasks, refused = [], []
        for task in claim.tasks:
            try:
                text = self._open_text(self._item_place(task.tenant, task.namespace, task.key, "index_text"),
                                       task.text)
            except SealError as exc:
                refused.append((task, str(exc), 3600.0))
                continue
            tasks.append(dataclasses.replace(task, text=text or ""))
        if refused:
            self.inner.fail_embeddings(claim.token, refused)
        return dataclasses.replace(claim, tasks=tasks)

    # -- keys ----------------------------------------------------------------------------------------

    def subject_digest(self, tenant: str, subject: str) -> str:
        """A keyed digest of ``subject`` (``DataKeys.subject_digest``)."""
        return self.keys.subject_digest(tenant, subject)

    def shred(self, tenant: str, digest: str | None) -> list[int]:
        """Destroy the data keys of a subject (``None``: every subject of ``tenant``)."""
        versions = self.keys.shred(tenant, digest)
        self._subjects.clear()  # nothing more is sealed for an erased subject's runs from here
        return versions

    def rotate(self, tenant: str) -> int:
        """A new data key for ``tenant``: it seals every new write from now on
        (in this process at once, in others within ``KEY_REFRESH_SECONDS``)."""
        return self.keys.add(tenant)

    def reencrypt(self, tenant: str, *, page: int = 200, pause: float = 0.0) -> Progress:
        """One re-encryption pass over ``tenant``'s values (``cairn.store.rekey``)."""
        return Rekeyer(self, tenant, page=page, pause=pause).run()

    def key_status(self, tenant: str) -> Progress:
        """How many of ``tenant``'s values each key version seals (a read-only pass)."""
        return Rekeyer(self, tenant, move=False).run()

    def rewrap(self) -> int:
        """KEK rotation: every data key not wrapped by the keyring's current
        KEK is wrapped by it (no value is re-encrypted); how many were."""
        current = self.keys.keyring.current()
        count = 0
        inner: Any = self.inner
        for row in inner.data_keys(None):
            if row.kek_id == current:
                continue
            bound = context(row.tenant, row.version)
            key = self.keys.keyring.unwrap(row.kek_id, row.wrapped, bound)
            wrapped = self.keys.keyring.wrap(current, key, bound)
            again = DataKeyRow(row.tenant, row.version, current, wrapped, row.created_at)
            count += bool(inner.rewrap_data_key(again, row.kek_id))
        return count


def sealed_store(inner: Store, keyring: Keyring) -> Store:
    """``inner`` with its run data sealed (``SealedStore``)."""
    return cast(Store, SealedStore(inner, keyring))
