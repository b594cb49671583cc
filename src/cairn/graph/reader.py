"""Reading a graph run's checkpoints from the store: its history of
super-steps and the state at any of them (``app.checkpoints``,
``app.graph_state``; shaped as plain records so the CLI and the HTTP API
can serve them as they are)."""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cairn.codec.payloads import PayloadCodec
from cairn.engine.journal import Journal
from cairn.errors import InvalidArgument, PayloadError
from cairn.graph import checkpoints
from cairn.graph.checkpoints import KIND, Chain
from cairn.graph.graph import Compiled
from cairn.store.contract import Store
from cairn.store.records import EventType, IndexEntry, RunRecord


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One super-step of a graph run, as its history lists it."""

    run_id: str
    #: the super-step (0: the input)
    step: int
    #: the tasks that ran in it (a node once per task; a ``Send`` fan-out lists it per item)
    nodes: tuple[str, ...]
    #: the nodes the next super-step runs (empty: the graph reached END)
    next: tuple[str, ...]
    #: when it was committed
    at: float
    #: the run's history entry holding it
    seq: int
    #: the super-step before it (``None`` for the input)
    parent: int | None
    #: why the checkpoint cannot be read (``None``: it can): a damaged one is
    #: listed with the others, its nodes, next and parent empty
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "step": self.step, "nodes": list(self.nodes), "next": list(self.next),
                "at": self.at, "seq": self.seq, "parent": self.parent, "error": self.error}


def graph_of(fn: Any) -> Compiled | None:
    """The graph a workflow function runs, if it is a graph's (``runner.workflow``)."""
    found = getattr(fn, "__cairn_graph__", None)
    return found if isinstance(found, Compiled) else None


#: the entries that void outcomes after a position (a retry's, a rewind's cut)
_CUTS = frozenset({EventType.RUN_RETRIED.value, EventType.RUN_REWOUND.value})

#: checkpoints whose payloads one fetch reads around the one asked for (a
#: page walks down from it, a state read up from a field's base)
WINDOW = 128

#: index entries a reader that has read nothing of a run reads first, from
#: the run's end: enough for its first page of history (up to ``TAIL - 1``
#: checkpoints, and the parent of the oldest), without reading the index
#: entries of every super-step before it (12.7 ms at 3,000 super-steps)
TAIL = 64


class GraphHistory:
    """The live checkpoints of one run (those no operator retry or rewind
    voided), read incrementally: ``refresh`` reads only the entries appended
    since the last read, without their payloads, and a checkpoint's payload
    is fetched (with those of the ``WINDOW`` checkpoints either side of it
    not read yet) and decoded once, when a read needs it: checkpoints never
    change once written (``Readers`` keeps one of these per recently read
    run, so a second read of a long run costs a query for what is new, and
    a first read of a page, ten checkpoints, not a scan of every payload).

    A first read takes in only the run's newest ``TAIL`` index entries
    (``_partial``): the first page of history is read from them when they
    hold it; any other read (``entries``, ``chain``: a state, a diff, an
    older page) takes in the whole index first (``_whole``). Live
    checkpoints are written in super-step order (an operator's retry or
    rewind voids later ones: its entry in the tail means a whole read), so
    the newest super-steps are the tail's. A page with a damaged
    checkpoint, or one without a parent, is read again from the whole
    index, which says why as it always did; only a super-step also written
    at another position before the tail (damage) goes unnoticed by a
    first page read from the tail, until the whole index is read."""

    def __init__(self, store: Store, payloads: PayloadCodec, run_id: str) -> None:
        self.run_id = run_id
        self._store = store
        self._payloads = payloads
        self._last_seq = 0
        self._lock = threading.Lock()
        #: the live checkpoint entries by super-step (from ``Store.history_index``)
        self._entries: dict[int, IndexEntry] = {}
        #: only the newest ``TAIL`` index entries are taken in yet (``refresh(tail=True)``)
        self._partial = False
        #: steps with two live entries at different journal positions: a
        #: damaged history (a run never writes a super-step twice; a retry's
        #: or a rewind's cut voids the first), refused by any read of them
        self._twice: dict[int, str] = {}
        #: fetched payloads not decoded yet, decoded checkpoints and the
        #: errors of damaged ones, by history seq (an entry's seq is never reused)
        self._raws: dict[int, bytes | PayloadError] = {}
        self._records: dict[int, checkpoints.Record] = {}
        self._errors: dict[int, PayloadError] = {}
        #: decoded appends shared between reads (``checkpoints.Appended``)
        self._shared = checkpoints.Shared()
        self._chain = self._new_chain()

    @property
    def entries(self) -> dict[int, IndexEntry]:
        """The live checkpoint entries by super-step (the whole index taken in)."""
        self._whole()
        return self._entries

    @property
    def chain(self) -> Chain:
        """The run's checkpoints (the whole index taken in)."""
        self._whole()
        return self._chain

    def any(self) -> bool:
        """Whether the run has a live checkpoint (the tail's answer, when it holds one)."""
        return bool(self._entries) or bool(self.entries)

    def _new_chain(self) -> Chain:
        return Chain(list(self._entries), self._load, self._shared,
                     lambda step: checkpoints.what_of(self.run_id, step))

    def _whole(self) -> None:
        """Take in the whole index, if only its tail was read."""
        if self._partial:
            with self._lock:
                if self._partial:  # read again from the start: what the tail held is in it
                    self._entries, self._twice, self._last_seq, self._partial = {}, {}, 0, False
                    self._refresh()

    def refresh(self, *, tail: bool = False) -> GraphHistory:
        """Take in the entries appended since the last read (``tail``: of a
        run not read yet, only its newest ``TAIL``, see the class)."""
        with self._lock:
            self._refresh(tail)
        return self

    def _refresh(self, tail: bool = False) -> None:
        if tail and self._last_seq == 0:
            new = self._store.history_index(self.run_id, last=TAIL)
            self._partial = len(new) == TAIL and new[0].seq > 1  # entries before them not read
        else:
            new = self._store.history_index(self.run_id, after_seq=self._last_seq)
        if new:
            cut = rewritten = False
            entries = self._entries
            completed = EventType.STEP_COMPLETED.value
            for entry in new:  # once per entry of a long run: what it calls is written out
                if entry.step_kind == KIND:
                    name = entry.name
                    if entry.event == completed and name is not None and name.startswith("step "):
                        try:
                            step = int(name[5:])
                        except ValueError:  # not a checkpoint's name (checkpoints.step_of)
                            continue
                        if step in entries:
                            rewritten = self._take(step, entry) or rewritten
                        else:
                            entries[step] = entry
                elif entry.event in _CUTS:
                    cut = True
            self._last_seq = new[-1].seq
            if cut:  # outcomes were voided: the live checkpoints are the journal's, rebuilt (rare:
                # an operator's retry or rewind) rather than kept up to date on every read
                self._entries, self._twice, self._partial = {}, {}, False
                whole = self._store.history_headers(self.run_id)
                self._last_seq = max(self._last_seq, whole[-1].seq if whole else 0)
                for outcome in Journal(whole).outcomes.values():
                    found = checkpoints.step_of(outcome.name) if outcome.step_kind == KIND else None
                    if found is not None and outcome.event is EventType.STEP_COMPLETED:
                        self._take(found, IndexEntry(outcome.seq, outcome.event.value, outcome.position,
                                                    outcome.step_kind, outcome.name, outcome.at))
            if cut or rewritten:  # what was decoded of voided checkpoints is void too
                self._shared = checkpoints.Shared()
            self._chain = self._new_chain()

    def _take(self, step: int, entry: IndexEntry) -> bool:
        """Take in ``entry``, the checkpoint of ``step``; whether it replaces
        one (the same journal position: the later outcome is the live one,
        as in the journal). At another position, the step is written twice."""
        found = self._entries.get(step)
        self._entries[step] = entry
        if found is None:
            return False
        if found.position != entry.position:
            self._twice[step] = (f"{checkpoints.what_of(self.run_id, step)} is damaged: it is in the run's "
                                 f"history twice (entries {found.seq} and {entry.seq})")
        return True

    def _load(self, step: int) -> checkpoints.Record:
        """Checkpoint ``step``, decoded and checked alone (its error again for a damaged one)."""
        twice = self._twice.get(step)
        if twice is not None:
            raise PayloadError(twice)
        seq = self._entries[step].seq
        found = self._records.get(seq)
        if found is not None:
            return found
        if seq in self._errors:
            raise self._errors[seq]
        raw = self._raws.pop(seq, None)
        if raw is None:
            self._fetch(step)
            raw = self._raws.pop(seq)
        try:
            if isinstance(raw, PayloadError):
                raise raw
            found = self._records[seq] = checkpoints.decode(
                raw, checkpoints.what_of(self.run_id, step), step=step, run=self.run_id)
        except PayloadError as exc:
            self._errors[seq] = exc
            raise
        return found

    def _fetch(self, step: int) -> None:
        """Fetch the payload of checkpoint ``step`` and those of the
        ``WINDOW`` steps either side of it not fetched yet (decoded when
        read: a damaged one fails the reads of it, not of its window)."""
        steps = self._chain.steps if step in self._chain.steps else sorted(self._entries)
        at = bisect.bisect_left(steps, step)
        self._prefetch(steps[max(0, at - WINDOW):at + WINDOW + 1])
        if self._entries[step].seq not in self._raws:
            raise PayloadError(f"{checkpoints.what_of(self.run_id, step)} is no longer in its history")

    def _prefetch(self, steps: Sequence[int]) -> None:
        """Fetch the payloads of the checkpoints of ``steps`` not fetched yet, in one query."""
        by_seq = {}
        for s in steps:
            seq = self._entries[s].seq
            if seq not in self._records and seq not in self._raws and seq not in self._errors:
                by_seq[seq] = s
        if not by_seq:
            return
        for entry in self._store.history_at(self.run_id, list(by_seq)):
            what = checkpoints.what_of(self.run_id, by_seq[entry.seq])
            try:
                if entry.payload is None:
                    raise PayloadError(f"{what} has no payload")
                self._raws[entry.seq] = self._payloads.raw(entry.payload, what=what)
            except PayloadError as exc:
                self._raws[entry.seq] = exc

    def checkpoints(self, *, before: int | None = None, limit: int = 50) -> list[Checkpoint]:
        """Newest first: the checkpoints of super-steps below ``before``
        (all: ``None``), at most ``limit``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit must be a positive integer, not {limit!r}")
        if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
            raise InvalidArgument(f"before must be a super-step number, not {before!r}")
        if self._partial and before is None and len(self._chain.steps) > limit:  # a first page, from the tail
            found = self._page(self._chain, None, limit)
            if all(c.error is None and c.parent is not None for c in found):
                return found
        return self._page(self.chain, before, limit)  # a damaged or a first checkpoint: as the whole says

    def _page(self, chain: Chain, before: int | None, limit: int) -> list[Checkpoint]:
        high = len(chain.steps) if before is None else bisect.bisect_left(chain.steps, before)
        low = max(0, high - limit)
        self._prefetch(chain.steps[max(0, low - 1):high])  # the page and the parent of its oldest: one query
        found = []
        entries = self._entries
        for step in reversed(chain.steps[low:high]):
            entry = entries[step]
            try:
                record = chain.record(step)
            except PayloadError as exc:  # listed, saying why: the others of the page still read
                found.append(Checkpoint(self.run_id, step, (), (), entry.at, entry.seq, None, str(exc)))
                continue
            found.append(Checkpoint(self.run_id, step, tuple(record.nodes), tuple(record.node_names()),
                                    entry.at, entry.seq, record.parent))
        return found

    def state(self, graph: Compiled | None, step: int | None = None) -> Any:
        """The state after super-step ``step`` (the latest: ``None``), as the
        graph's state type; without ``graph``, as plain JSON."""
        chain = self.chain
        if step is None:
            step = chain.latest()
            if step is None:
                raise InvalidArgument(f"run {self.run_id!r} has no checkpoint yet")
        elif isinstance(step, bool) or not isinstance(step, int) or step not in self.entries:
            raise InvalidArgument(f"run {self.run_id!r} has no checkpoint at super-step {step!r}")
        state = chain.state(None if graph is None else graph.schema, step,
                            f"checkpoint {step} of run {self.run_id!r}")
        return state if graph is None else graph.schema.view(state)


class Readers:
    """The ``GraphHistory`` of the runs read lately (at most ``size``),
    shared by an ``App``'s readers: long runs are read again and again
    (a history page, then the state at one of its checkpoints)."""

    def __init__(self, store: Store, payloads: PayloadCodec, size: int = 8) -> None:
        self._store = store
        self._payloads = payloads
        self._size = size
        self._runs: OrderedDict[tuple[str, float], GraphHistory] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, run: RunRecord) -> GraphHistory:
        """Run ``run``'s checkpoints, up to date (keyed by its id and
        creation time: a run pruned and started again under the same id is
        another history)."""
        key = (run.run_id, run.created_at)
        with self._lock:
            found = self._runs.pop(key, None)
            if found is None:
                found = GraphHistory(self._store, self._payloads, run.run_id)
            self._runs[key] = found
            while len(self._runs) > self._size:
                self._runs.popitem(last=False)
        return found.refresh(tail=True)
