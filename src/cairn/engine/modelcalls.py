"""Model calls in the journal: every message is stored once per run.

A chat loop sends the whole conversation on every call, so journaling each
request in full grows with the square of the turns (860 KB for 80 turns of
1 KB messages). Instead a model call's entry holds:

* ``blobs``: the encoded messages and tool specs that the run's journal does
  not hold yet, keyed by the digest of their bytes;
* ``prompt``: the request as references: the id of an earlier request's
  message list (``base``), how many of its leading messages are kept
  (``keep``), the digests of the messages after them (``add``), the digests
  of the tool specs, and the parameters (small, kept inline);
* the response, in full: its message counts as journaled, so the model's
  answer sent back on the next turn costs a digest, not a copy.

Why digests and not "a delta against the previous entry": the journal can be
cut (an operator retry, a logical rewind), and a cut voids entries. The
writer only references content carried by entries still live in the journal
(``Journal.outcomes``), and a reference names bytes, not a position, so it can
never resolve to the wrong entry: any entry carrying a digest carries the
same bytes. Readers rebuild a request from the history up to its entry
(``records``, ``record_of``), a superset of what the writer saw.

A read of a few calls (a page of the history) must not replay the journal
from its start, so each entry also names the entries its rebuild needs
(``needs``: the seqs of the entries that carry its content and of the chain
of bases its message list is built on). The writer keeps that chain short:
a base that adds nothing to the kept prefix is skipped for its own base
(``_rebased``), so every link contributes a message and the chain is never
longer than the request. ``needs`` is stored run-length coded
(``_packed``): a chat's entries need every earlier call, at a steady stride.

The input hash of a model call stays the digest of the *full* request, so the
non-determinism check on replay compares exactly what was sent, and entries
written before this format (a full ``ModelRecord``) are still read.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from cairn.codec import values
from cairn.codec.payloads import PayloadCodec
from cairn.engine.drive import Invoke, Protocol
from cairn.engine.execution import Call, Execution
from cairn.errors import PayloadError, SecretLeak
from cairn.models.base import Message, ModelClient, ModelRecord, ModelRequest, ModelResponse
from cairn.retry import NO_RETRY, RetryPolicy
from cairn.security import redaction
from cairn.store.records import EventType, HistoryEvent


class Prompt(msgspec.Struct, frozen=True, omit_defaults=True):
    """A request as references into the run's journaled content."""

    base: str | None = None
    keep: int = 0
    add: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    params: dict[str, Any] = msgspec.field(default_factory=dict)


class ModelEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """The journal payload of one model call. ``needs`` is ``_packed``; an
    entry written before it (``None``) is rebuilt from the journal's start."""

    prompt: Prompt
    response: ModelResponse
    latency_ms: float
    blobs: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)
    needs: tuple[int, ...] | None = None


#: How many recent requests a new one is compared with for a shared prefix.
_RECENT = 16


def content_ref(data: bytes) -> str:
    """The address of journaled bytes (128 bits: collisions are not a concern)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _list_id(refs: Sequence[str]) -> str:
    return content_ref(" ".join(refs).encode())


def _packed(seqs: Sequence[int]) -> tuple[int, ...]:
    """Sorted seqs as ``(gap, count, gap, count, ...)``: ``count`` steps of
    ``gap`` each, the first gap counted from 0. A chat's entries need every
    earlier call at a steady stride, which packs into a few numbers."""
    out: list[int] = []
    last = 0
    for seq in seqs:
        gap = seq - last
        if out and out[-2] == gap:
            out[-1] += 1
        else:
            out += (gap, 1)
        last = seq
    return tuple(out)


def unpacked(packed: Sequence[int], before: int) -> list[int]:
    """The seqs ``_packed`` coded, all below ``before`` (the needing entry's
    seq): a malformed or damaged code is a ``PayloadError``, never a loop
    past the journal."""
    if len(packed) % 2 or any(n < 1 for n in packed) or sum(
            gap * count for gap, count in zip(packed[::2], packed[1::2], strict=True)) >= before:
        raise PayloadError("a model call's needs are malformed")
    seqs: list[int] = []
    last = 0
    for gap, count in zip(packed[::2], packed[1::2], strict=True):
        for _ in range(count):
            last += gap
            seqs.append(last)
    return seqs


class ModelLog:
    """The content a run's model calls journaled so far: what a new entry may
    reference, and what an entry's references resolve to."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        #: message lists of earlier requests by list id, oldest first
        self._lists: dict[str, tuple[str, ...]] = {}
        #: blob ref -> the seq of an entry that carries it (known when taken with its seq)
        self._carriers: dict[str, int] = {}
        #: list id -> (seq, base, keep) of the first entry that defined it
        self._defs: dict[str, tuple[int, str | None, int]] = {}

    # -- writing --------------------------------------------------------------

    def entry(self, request: ModelRequest, response: ModelResponse, latency_ms: float) -> ModelEntry:
        """The journal payload for ``request`` and ``response``: only content
        this log does not hold yet is carried."""
        blobs: dict[str, msgspec.Raw] = {}
        refs = self._refs(request.messages, blobs)
        tools = self._refs(request.tools, blobs)
        base, keep = self._longest_prefix(refs)
        base = self._rebased(base, keep)
        prompt = Prompt(base=base, keep=keep, add=refs[keep:], tools=tools, params=request.params)
        needs = self._needs(base, keep, refs + tools, blobs)
        return ModelEntry(prompt=prompt, response=response, latency_ms=latency_ms, blobs=blobs, needs=needs)

    def _rebased(self, base: str | None, keep: int) -> str | None:
        """``base``, or the base it was built on if its first ``keep``
        messages are all that one's (it added none of them), and so on: the
        same prefix, from a list that contributes to it."""
        while base is not None:
            found = self._defs.get(base)
            if found is None or found[1] is None or keep > found[2]:
                return base
            base = found[1]
        return base

    def _needs(self, base: str | None, keep: int, refs: Sequence[str],
               blobs: dict[str, msgspec.Raw]) -> tuple[int, ...] | None:
        """The seqs of the entries a reader needs to rebuild this call,
        ``_packed``: the chain of bases down to a list with none, and the
        carrier of every message or tool spec the entry does not carry.
        ``None`` if one is not known (a log taken without seqs)."""
        seqs: set[int] = set()
        below: int | None = None
        while base is not None and keep > 0:
            found = self._defs.get(base)
            # a link at or after the one it serves cannot be read before it: never written so
            if found is None or (below is not None and found[0] >= below):
                return None
            seqs.add(found[0])
            below, base, keep = found[0], found[1], found[2]
        for ref in refs:
            if ref in blobs:
                continue
            carrier = self._carriers.get(ref)
            if carrier is None:
                return None
            seqs.add(carrier)
        return _packed(sorted(seqs))

    def _refs(self, items: Sequence[Any], blobs: dict[str, msgspec.Raw]) -> tuple[str, ...]:
        refs = []
        for item in items:
            data = values.encode(item)
            ref = content_ref(data)
            if ref not in self._blobs:
                blobs[ref] = msgspec.Raw(data)
            refs.append(ref)
        return tuple(refs)

    def _longest_prefix(self, refs: tuple[str, ...]) -> tuple[str | None, int]:
        """The recent request sharing the longest prefix with ``refs``. Only
        the latest few are compared, so a long loop costs no more per call;
        a missed older prefix costs digests, never correctness."""
        best: tuple[str | None, int] = (None, 0)
        for list_id, known in itertools.islice(reversed(self._lists.items()), _RECENT):
            n = 0
            for a, b in zip(known, refs, strict=False):
                if a != b:
                    break
                n += 1
            if n > best[1]:
                best = (list_id, n)
                if n == len(refs):
                    break
        return best

    # -- reading --------------------------------------------------------------

    def take(
        self, entry: ModelEntry | ModelRecord, *, rebuild: bool = True, what: str = "model call",
        seq: int | None = None, partial: bool = False,
    ) -> ModelRecord | None:
        """Take one journaled call into account (in journal order); return it
        rebuilt as sent and received (``None`` unless ``rebuild``). ``seq``:
        its entry's, which later entries may name as needed. ``partial``: the
        log holds only some earlier entries (``rebuild_some``), so an entry
        whose base is not among them gives its content but not its list."""
        if isinstance(entry, ModelRecord):  # written before this format: the full request
            self._refs_of(entry.request.tools, seq)
            self._remember(self._refs_of(entry.request.messages, seq), entry.response, seq, None, 0)
            return entry
        for ref, blob in entry.blobs.items():
            self._blobs[ref] = bytes(blob)
            if seq is not None:
                self._carriers.setdefault(ref, seq)
        prompt = entry.prompt
        if prompt.base is None:
            kept: tuple[str, ...] = ()
        else:
            known = self._lists.get(prompt.base)
            if known is None or len(known) < prompt.keep:
                if partial and not rebuild:
                    self._refs_of((entry.response.message,), seq)
                    return None
                raise PayloadError(f"cannot rebuild {what}: it refers to messages the journal does not hold")
            kept = known[: prompt.keep]
        refs = kept + prompt.add
        self._remember(refs, entry.response, seq, prompt.base, prompt.keep)
        if not rebuild:
            return None
        request = ModelRequest(
            messages=tuple(self._load(ref, Message, what) for ref in refs),
            tools=tuple(self._load(ref, dict[str, Any], what) for ref in prompt.tools),
            params=prompt.params,
        )
        return ModelRecord(request, entry.response, entry.latency_ms)

    def _refs_of(self, items: Sequence[Any], seq: int | None = None) -> tuple[str, ...]:
        refs = []
        for item in items:
            data = values.encode(item)
            ref = content_ref(data)
            self._blobs.setdefault(ref, data)
            if seq is not None:
                self._carriers.setdefault(ref, seq)
            refs.append(ref)
        return tuple(refs)

    def _remember(self, refs: tuple[str, ...], response: ModelResponse, seq: int | None,
                  base: str | None, keep: int) -> None:
        list_id = _list_id(refs)
        self._lists.pop(list_id, None)  # re-insert: newest last
        self._lists[list_id] = refs
        if seq is not None:  # the first definition: it comes before every entry built on it
            self._defs.setdefault(list_id, (seq, base, keep))
        self._refs_of((response.message,), seq)

    def _load(self, ref: str, type_: Any, what: str) -> Any:
        data = self._blobs.get(ref)
        if data is None:
            raise PayloadError(f"cannot rebuild {what}: content {ref} is not in the journal")
        return values.decode(data, type_, what=what)


def decode_entry(data: bytes, *, what: str) -> ModelEntry | ModelRecord:
    """A model call's journal payload, in this format or the one before it."""
    try:
        entry: ModelEntry = values.decode(data, ModelEntry, what=what)
        return entry
    except PayloadError:
        legacy: ModelRecord = values.decode(data, ModelRecord, what=what)
        return legacy


def is_model_call(event: HistoryEvent) -> bool:
    return (event.step_kind == "model" and event.event is EventType.STEP_COMPLETED
            and event.payload is not None)


def records(history: Iterable[HistoryEvent], payloads: PayloadCodec) -> dict[int, ModelRecord]:
    """Every model call in ``history``, rebuilt exactly as it was sent and
    received, by the ``seq`` of its entry (for ``cairn show`` and tests)."""
    log = ModelLog()
    rebuilt: dict[int, ModelRecord] = {}
    for event in history:
        if not is_model_call(event):
            continue
        assert event.payload is not None
        what = f"model call at position {event.position} of run {event.run_id!r}"
        record = log.take(decode_entry(payloads.raw(event.payload, what=what), what=what), what=what,
                          seq=event.seq)
        assert record is not None
        rebuilt[event.seq] = record
    return rebuilt


def _entry_of(event: HistoryEvent, payloads: PayloadCodec) -> tuple[ModelEntry | ModelRecord, str]:
    assert event.payload is not None
    what = f"model call at position {event.position} of run {event.run_id!r}"
    return decode_entry(payloads.raw(event.payload, what=what), what=what), what


def needs(events: Iterable[HistoryEvent], payloads: PayloadCodec) -> set[int] | None:
    """The seqs of the entries that rebuilding the model calls among
    ``events`` reads (some may be among ``events``); ``None`` if one of them
    was written before entries named what they need (read from the start)."""
    wanted: set[int] = set()
    for event in events:
        if not is_model_call(event):
            continue
        entry, _ = _entry_of(event, payloads)
        if isinstance(entry, ModelRecord):
            continue  # the full request: it needs nothing
        if entry.needs is None:
            return None
        wanted.update(unpacked(entry.needs, event.seq))
    return wanted


def rebuild_some(wanted: Iterable[HistoryEvent], needed: Iterable[HistoryEvent],
                 payloads: PayloadCodec) -> dict[int, ModelRecord]:
    """The model calls among ``wanted``, rebuilt from them and ``needed``
    (the entries ``needs`` named) alone: the same records ``records`` gives
    from the whole history, for a read of a few calls of a long run."""
    targets = {e.seq for e in wanted if is_model_call(e)}
    by_seq = {e.seq: e for e in itertools.chain(needed, wanted) if is_model_call(e)}
    log = ModelLog()
    rebuilt: dict[int, ModelRecord] = {}
    for seq in sorted(by_seq):
        entry, what = _entry_of(by_seq[seq], payloads)
        target = seq in targets
        record = log.take(entry, rebuild=target, what=what, seq=seq, partial=not target)
        if record is not None:
            rebuilt[seq] = record
    return rebuilt


def record_of(history: Sequence[HistoryEvent], entry: HistoryEvent, payloads: PayloadCodec) -> ModelRecord:
    """The model call journaled by ``entry`` (a model ``step.completed`` of
    ``history``), rebuilt: request, response and latency."""
    found = records((e for e in history if e.seq <= entry.seq), payloads).get(entry.seq)
    if found is None:
        raise ValueError(f"history entry {entry.seq} is not a recorded model call")
    return found


def request_of(history: Sequence[HistoryEvent], entry: HistoryEvent, payloads: PayloadCodec) -> ModelRequest:
    """The request the model call journaled by ``entry`` sent, exactly."""
    return record_of(history, entry, payloads).request


# -- the journaled call --------------------------------------------------------------


def ask(
    ex: Execution, client: ModelClient, request: ModelRequest, retry: RetryPolicy | None, *, is_async: bool
) -> Protocol[ModelResponse]:
    """One model call, for ``run_sync`` / ``run_async``: replayed from the
    journal, or asked once (after the budget check) and journaled."""
    encoded = values.encode(request)
    # a request the journal could not read back is refused before it is sent (and paid for)
    values.decode(encoded, ModelRequest, what=f"the request to model {client.model_id!r}")
    leaked = redaction.scan(encoded) if redaction.active() else None
    if leaked is not None:  # refused before it is sent: a model provider must not get it either
        raise SecretLeak(f"the request to model {client.model_id!r} holds the revealed value of secret "
                         f"{leaked!r}: it would be sent to the model and recorded in the journal")
    call = ex.begin("model", client.model_id, values.digest(encoded))
    if call.recorded is not None:
        return _recorded(ex, call).response
    ex.check_budget(tool_call=False)
    started = time.perf_counter()
    try:
        response: ModelResponse = yield Invoke(_complete(client, is_async), (request,), None, None,
                                               f"model {client.model_id!r}")
    except Exception as exc:
        ex.fail_by_policy(call, exc, retry or NO_RETRY)
    latency_ms = (time.perf_counter() - started) * 1000
    usage = response.usage
    counts = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
              "total_tokens": usage.total_tokens}
    if usage.cache_read_tokens or usage.cache_write_tokens:  # only where the provider reports a cache
        counts.update(cache_read_tokens=usage.cache_read_tokens, cache_write_tokens=usage.cache_write_tokens)
    detail = {"model": response.model, "latency_ms": round(latency_ms, 3), "usage": counts,
              "cost": response.cost}
    log = _log(ex, call)
    stored: ModelEntry = ex.complete_call(call, log.entry(request, response, latency_ms), ModelEntry,
                                          detail=detail)
    recorded = ex.journal.outcomes.get(call.position)
    log.take(stored, rebuild=False, seq=None if recorded is None else recorded.seq)
    return stored.response


def _complete(client: ModelClient, is_async: bool) -> Callable[[ModelRequest], Any]:
    if not is_async:
        return client.complete
    acomplete: Callable[[ModelRequest], Any] | None = getattr(client, "acomplete", None)
    if acomplete is not None:
        return acomplete
    return lambda request: asyncio.to_thread(client.complete, request)


def _recorded(ex: Execution, call: Call) -> ModelEntry | ModelRecord:
    raw: msgspec.Raw = ex.replay(call, msgspec.Raw)
    return decode_entry(bytes(raw), what=f"model call at position {call.position} of run {ex.run_id!r}")


#: each execution's model log, for as long as the execution lives: kept here,
#: not on the ``Execution``, so that the execution module needs nothing of this
#: one (this one is above it)
_LOGS: weakref.WeakKeyDictionary[Execution, ModelLog] = weakref.WeakKeyDictionary()


def _log(ex: Execution, call: Call) -> ModelLog:
    """The execution's model log, built on its first live model call from the
    live journal (never from entries a cut voided)."""
    log = _LOGS.get(ex)
    if log is None:
        log = ModelLog()
        live = sorted((e for e in ex.journal.outcomes.values() if is_model_call(e) and
                       e.position is not None and e.position < call.position), key=lambda e: e.seq)
        for event in live:
            assert event.payload is not None
            what = f"model call at position {event.position} of run {ex.run_id!r}"
            raw = ex.runtime.payloads.raw(event.payload, what=what)
            log.take(decode_entry(raw, what=what), rebuild=False, what=what, seq=event.seq)
        _LOGS[ex] = log
    return log


__all__ = ["ModelEntry", "ModelLog", "Prompt", "ask", "is_model_call", "needs", "rebuild_some", "record_of",
           "records", "request_of", "unpacked"]
