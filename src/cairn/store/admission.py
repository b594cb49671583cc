"""Queue admission: which runnable runs a claim may take, within limits and fairly.

A *queue* is the name a run is created in (``NewRun.queue``, ``"default"``
unless chosen). A queue without configured limits admits every runnable run.
Configured limits (``QueueLimits``) live in the database, so every worker on
every machine enforces the same ones, and an operator can change them while
workers run (``cairn queues set``):

* ``concurrency``: at most this many runs of the queue ``running`` at once,
  across all workers and tenants;
* ``tenant_concurrency``: at most this many per tenant;
* ``rate`` / ``tenant_rate``: token buckets (``Rate``) for the queue as a
  whole and for each tenant in it. Every claim of the queue spends a token,
  except a takeover (the run was admitted already; its worker died).

Those limits are the installation's (an ``installation`` token sets them).
A tenant may also cap *its own share* of a queue (``QueueShare``, set by
that tenant's admin): at most ``concurrency`` of its runs of the queue
running at once, and at most ``rate`` claims of them (a token bucket of its
own, stored with the share). A share only ever restricts its own tenant: it
is checked in addition to the queue-wide limits, never instead of them, so a
share above ``tenant_concurrency`` changes nothing, and no other tenant's
lane reads it. A share applies to a queue with or without limits. A share's
rate above the installation's ``tenant_rate`` is refused when it is set
(``check_share``): it could not loosen anything, and a tenant asking for
more should hear so rather than believe it got it.

A run counts against concurrency while its status is ``running``, also when
it was started inline (``App.run``) rather than claimed by a worker, and also
while its lease has expired and nobody took it over yet: the limit is on work
in flight, and a run whose holder may only be frozen is still in flight. An
inline start is not held back by a limit, except where the store is bound
by admission it cannot step around: a tenant's own role on PostgreSQL, whose
every move of a run to ``running`` the database admits by this module's rule
as it commits (``store.postgres``, migration 0027).
Waiting runs (``suspended``, ``needs_attention``) count for nothing: waiting
costs no slot.

**Fairness.** Within a queue, each tenant's runnable runs form a *lane*,
ordered by priority (higher first), then by how long they have been runnable.
A claim fills its slots by water-filling: the next run always comes from the
lane whose tenant has the fewest runs of the queue running (counting the ones
this claim already took), ties going to the higher priority, then the longer
wait. A tenant with ten thousand queued runs therefore gets no more slots than
one with a single run; priorities order a tenant's own runs and break ties
between tenants, but cannot buy one tenant a larger share than another.
Takeovers come first: they continue work already admitted.

The decision is this module's pure function, ``plan``: backends only read its
inputs (lanes, running counts, bucket states) and apply its outcome, so every
backend decides identically.

How many lanes a claim looks at is bounded (``MAX_LANES`` per queue), so that
a claim costs the same with ten tenants or a hundred thousand. When a queue
has more tenants with runnable work than that, successive claims continue
after the last lane they saw (``LaneCursor``), so every tenant's lane is looked
at within a bounded number of claims.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cairn.errors import InvalidArgument

#: Lanes (tenants of one queue) a single claim looks at, at most.
MAX_LANES = 64

#: The scope of a queue-wide bucket in ``BucketKey``; tenant buckets use the tenant.
QUEUE_WIDE = ""

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*(ms|s|sec|second|m|min|minute|h|hour|d|day)?\s*$")
_UNIT_SECONDS = {
    None: 1.0, "ms": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0,
    "minute": 60.0, "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0,
}


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket: ``limit`` claims per ``period`` seconds sustained, in
    bursts of up to ``burst`` (default ``limit``) claims at once.

    A bucket starts full. It refills continuously at ``limit / period`` tokens
    a second up to ``burst``. So over any window of ``period`` seconds at most
    ``burst + limit`` claims happen, and over a long time ``limit`` per
    ``period``. ``burst=1`` spaces claims evenly, ``period / limit`` apart.
    """

    limit: int
    period: float
    burst: int | None = None

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise InvalidArgument(f"a rate limit must allow at least 1 claim, not {self.limit}")
        if not (self.period > 0 and math.isfinite(self.period)):
            raise InvalidArgument(f"a rate period must be a positive number of seconds, not {self.period}")
        if self.burst is not None and self.burst < 1:
            raise InvalidArgument(f"a rate burst must be at least 1, not {self.burst}")

    @property
    def capacity(self) -> int:
        return self.burst if self.burst is not None else self.limit

    @property
    def per_second(self) -> float:
        return self.limit / self.period

    @classmethod
    def parse(cls, text: str, burst: int | None = None) -> Rate:
        """``"100/min"``, ``"10/s"``, ``"5/30s"``, ``"1000/h"``, ``"3/2.5s"``."""
        match = _RATE.match(text)
        if match is None or not (match.group(2) or match.group(3)):
            raise InvalidArgument(f"rate {text!r} is not COUNT/PERIOD, e.g. 100/min, 10/s or 5/30s")
        count, amount, unit = match.groups()
        number = float(amount) if amount else 1.0
        return cls(int(count), number * _UNIT_SECONDS[unit], burst)

    def within(self, other: Rate) -> bool:
        """Whether this rate never admits more than ``other``: its sustained
        rate and its burst both at most ``other``'s (a rounding error of the
        period's units aside: ``10/min`` is within ``1/6s``)."""
        return self.per_second <= other.per_second * (1 + 1e-9) and self.capacity <= other.capacity

    def __str__(self) -> str:
        named = {1.0: "s", 60.0: "min", 3600.0: "h", 86400.0: "day"}
        period = named.get(self.period) or f"{self.period:g}s"
        burst = f" (burst {self.burst})" if self.burst is not None else ""
        return f"{self.limit}/{period}{burst}"


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """The limits of one queue (see the module doc). ``None`` means unlimited."""

    name: str
    concurrency: int | None = None
    tenant_concurrency: int | None = None
    rate: Rate | None = None
    tenant_rate: Rate | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidArgument("a queue needs a non-empty name")
        counts = (("concurrency", self.concurrency), ("tenant_concurrency", self.tenant_concurrency))
        for what, value in counts:
            if value is not None and value < 1:
                raise InvalidArgument(f"queue {self.name!r}: {what} must be at least 1, not {value}")

    @property
    def unlimited(self) -> bool:
        return (self.concurrency is None and self.tenant_concurrency is None
                and self.rate is None and self.tenant_rate is None)


@dataclass(frozen=True, slots=True)
class QueueShare:
    """One tenant's own caps within a queue (see the module doc): running
    runs (``concurrency``) and claims (``rate``). ``None``: no cap of its
    own of that kind (the queue's limits alone apply); neither: no share."""

    queue: str
    tenant: str
    concurrency: int | None = None
    rate: Rate | None = None

    @property
    def unset(self) -> bool:
        return self.concurrency is None and self.rate is None

    def __post_init__(self) -> None:
        if not self.queue:
            raise InvalidArgument("a queue needs a non-empty name")
        if not self.tenant:
            raise InvalidArgument("a queue share needs a tenant")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidArgument(f"queue {self.queue!r}: a share's concurrency must be at least 1, "
                                  f"not {self.concurrency}")


def check_share(share: QueueShare, limits: QueueLimits | None) -> None:
    """Refuse a share whose rate would admit more than the installation's
    per-tenant rate of the queue (``limits``: ``None`` if it has none). The
    claim would hold it to the installation's anyway; refusing says so."""
    allowed = limits.tenant_rate if limits is not None else None
    if share.rate is not None and allowed is not None and not share.rate.within(allowed):
        raise InvalidArgument(
            f"queue {share.queue!r}: a share's rate {share.rate} exceeds the installation's per-tenant "
            f"rate {allowed} (a share can only tighten it: its rate and its burst must both be at most "
            f"the installation's)")


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue as an operator sees it: its limits and what is in it now."""

    limits: QueueLimits
    running: int  # status running (an expired lease included)
    runnable: int  # could be claimed now: pending, or due after a wait, or an expired lease


def stats(limits: Mapping[str, QueueLimits], counts: Mapping[str, tuple[int, int]]) -> list[QueueStats]:
    """``QueueStats`` of every queue with limits or with ``(running,
    runnable)`` ``counts``, by name."""
    return [
        QueueStats(limits.get(name) or QueueLimits(name), *counts.get(name, (0, 0)))
        for name in sorted(limits.keys() | counts.keys())
    ]


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket's stored state: ``tokens`` as of time ``at``."""

    tokens: float
    at: float

    def refilled(self, rate: Rate, now: float) -> Bucket:
        if now <= self.at:  # a clock that went back refills nothing
            return self
        return Bucket(min(float(rate.capacity), self.tokens + (now - self.at) * rate.per_second), now)


#: ``(queue, QUEUE_WIDE)`` or ``(queue, tenant)``.
BucketKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A runnable run as a claim sees it. ``takeover``: it is ``running``
    under an expired lease."""

    run_id: str
    queue: str
    tenant: str
    priority: int
    runnable_at: float
    takeover: bool


@dataclass(slots=True)
class Lane:
    """One tenant's runnable runs in one queue, best first, how many runs
    that tenant has ``running`` in the queue, its own ``QueueShare``
    (``None``: none) and the stored state of that share's rate bucket
    (``None``: full)."""

    queue: str
    tenant: str
    running: int
    candidates: list[Candidate] = field(default_factory=list)
    share: QueueShare | None = None
    share_bucket: Bucket | None = None

    def share_bucket_at(self, now: float) -> Bucket | None:
        """Its share's rate bucket as of ``now`` (``None``: no rate share)."""
        rate = self.share.rate if self.share is not None else None
        if rate is None:
            return None
        stored = self.share_bucket
        return Bucket(float(rate.capacity), now) if stored is None else stored.refilled(rate, now)


def bucket_keys(limits: Mapping[str, QueueLimits], lanes: Iterable[Lane]) -> set[BucketKey]:
    """The buckets a claim over ``lanes`` needs to read."""
    keys: set[BucketKey] = set()
    for lane in lanes:
        queue = limits.get(lane.queue)
        if queue is None:
            continue
        if queue.rate is not None:
            keys.add((lane.queue, QUEUE_WIDE))
        if queue.tenant_rate is not None:
            keys.add((lane.queue, lane.tenant))
    return keys


def _rate_of(limits: Mapping[str, QueueLimits], key: BucketKey) -> Rate | None:
    queue = limits.get(key[0])
    if queue is None:
        return None
    return queue.rate if key[1] == QUEUE_WIDE else queue.tenant_rate


def _current(
    limits: Mapping[str, QueueLimits], buckets: Mapping[BucketKey, Bucket], key: BucketKey, now: float
) -> Bucket:
    rate = _rate_of(limits, key)
    assert rate is not None
    stored = buckets.get(key)
    return Bucket(float(rate.capacity), now) if stored is None else stored.refilled(rate, now)


def plan(
    lanes: Sequence[Lane],
    limits: Mapping[str, QueueLimits],
    queue_running: Mapping[str, int],
    buckets: Mapping[BucketKey, Bucket],
    now: float,
    limit: int,
) -> list[Candidate]:
    """The runs a claim of up to ``limit`` runs takes, in order.

    ``limits`` holds the configured queues (others are unlimited),
    ``queue_running`` the number of ``running`` runs of each limited queue,
    ``buckets`` the stored state of the buckets ``bucket_keys`` names (a
    missing one is full).
    """
    chosen: list[Candidate] = []
    for lane in lanes:
        for candidate in lane.candidates:
            if candidate.takeover and len(chosen) < limit:
                chosen.append(candidate)
    tokens = {key: _current(limits, buckets, key, now).tokens for key in bucket_keys(limits, lanes)}
    share_tokens = [None if (b := lane.share_bucket_at(now)) is None else b.tokens for lane in lanes]
    taken_in_queue: dict[str, int] = {}
    taken_in_lane = [0] * len(lanes)
    next_in_lane = [0] * len(lanes)
    fresh = [[c for c in lane.candidates if not c.takeover] for lane in lanes]
    heap: list[tuple[int, int, float, str, int]] = []

    def push(i: int) -> None:
        if next_in_lane[i] < len(fresh[i]):
            head = fresh[i][next_in_lane[i]]
            load = lanes[i].running + taken_in_lane[i]
            heapq.heappush(heap, (load, -head.priority, head.runnable_at, head.run_id, i))

    for i in range(len(lanes)):
        push(i)
    full_queues: set[str] = set()
    while heap and len(chosen) < limit:
        *_, i = heapq.heappop(heap)
        lane = lanes[i]
        if lane.queue in full_queues:
            continue
        share, own_tokens = lane.share, share_tokens[i]
        if (share is not None and share.concurrency is not None
                and lane.running + taken_in_lane[i] >= share.concurrency) or (
            own_tokens is not None and own_tokens < 1
        ):
            continue  # the tenant's own cap: this lane alone is done
        queue = limits.get(lane.queue)
        if queue is not None:
            wide, own = (lane.queue, QUEUE_WIDE), (lane.queue, lane.tenant)
            in_queue = queue_running.get(lane.queue, 0) + taken_in_queue.get(lane.queue, 0)
            if (queue.concurrency is not None and in_queue >= queue.concurrency) or (
                queue.rate is not None and tokens[wide] < 1
            ):
                full_queues.add(lane.queue)
                continue
            if (queue.tenant_concurrency is not None
                    and lane.running + taken_in_lane[i] >= queue.tenant_concurrency) or (
                queue.tenant_rate is not None and tokens[own] < 1
            ):
                continue  # this lane is done for this claim; the others go on
            if queue.rate is not None:
                tokens[wide] -= 1
            if queue.tenant_rate is not None:
                tokens[own] -= 1
        if own_tokens is not None:
            share_tokens[i] = own_tokens - 1
        chosen.append(fresh[i][next_in_lane[i]])
        next_in_lane[i] += 1
        taken_in_lane[i] += 1
        taken_in_queue[lane.queue] = taken_in_queue.get(lane.queue, 0) + 1
        push(i)
    return chosen


def charge(
    limits: Mapping[str, QueueLimits],
    buckets: Mapping[BucketKey, Bucket],
    claimed: Iterable[Candidate],
    now: float,
) -> dict[BucketKey, Bucket]:
    """The bucket states to store after ``claimed`` were claimed: every claim
    that is not a takeover spends one token of each bucket it is subject to."""
    spent: dict[BucketKey, int] = {}
    for candidate in claimed:
        if candidate.takeover:
            continue
        queue = limits.get(candidate.queue)
        if queue is None:
            continue
        if queue.rate is not None:
            spent[(candidate.queue, QUEUE_WIDE)] = spent.get((candidate.queue, QUEUE_WIDE), 0) + 1
        if queue.tenant_rate is not None:
            spent[(candidate.queue, candidate.tenant)] = spent.get((candidate.queue, candidate.tenant), 0) + 1
    states: dict[BucketKey, Bucket] = {}
    for key, count in spent.items():
        current = _current(limits, buckets, key, now)
        states[key] = Bucket(current.tokens - count, current.at)
    return states


def charge_shares(lanes: Iterable[Lane], claimed: Iterable[Candidate], now: float) -> dict[BucketKey, Bucket]:
    """The share buckets to store after ``claimed`` were claimed, by
    ``(queue, tenant)``: every claim that is not a takeover spends one token
    of its tenant's share rate in its queue, if that share has one."""
    spent: dict[BucketKey, int] = {}
    for candidate in claimed:
        if not candidate.takeover:
            key = (candidate.queue, candidate.tenant)
            spent[key] = spent.get(key, 0) + 1
    states: dict[BucketKey, Bucket] = {}
    for lane in lanes:
        count = spent.get((lane.queue, lane.tenant), 0)
        current = lane.share_bucket_at(now)
        if count and current is not None:
            states[(lane.queue, lane.tenant)] = Bucket(current.tokens - count, current.at)
    return states


class LaneCursor:
    """Where each queue's next claim starts enumerating lanes (tenants).

    A claim looks at up to ``MAX_LANES`` tenants of a queue in tenant order,
    starting after ``after(queue)`` and wrapping around to the first tenant
    once, so it sees every lane when there are few. When it saw the full
    ``MAX_LANES``, the next claim continues after the last one it saw;
    otherwise it saw them all and the next claim starts from the beginning.
    Kept per store object: it spreads attention, it never decides
    correctness.
    """

    def __init__(self) -> None:
        self._after: dict[str, str] = {}

    def after(self, queue: str) -> str | None:
        return self._after.get(queue)

    def positions(self) -> dict[str, str]:
        """Every queue whose next claim does not start from the beginning."""
        return dict(self._after)

    def saw(self, queue: str, tenants: Sequence[str]) -> None:
        if len(tenants) >= MAX_LANES:
            self._after[queue] = tenants[-1]
        else:
            self._after.pop(queue, None)


def lane_window(next_tenant: Callable[[str], str | None], start: str | None) -> list[str]:
    """Up to ``MAX_LANES`` tenants of one queue, in order after ``start``,
    wrapping around once to those up to ``start``. ``next_tenant(t)`` is the
    first tenant after ``t`` with a lane (``""``: from the beginning), in the
    same order as Python compares strings (code points, as SQLite's BINARY
    collation and byte-wise UTF-8 do)."""
    seen: list[str] = []
    after = start or ""
    while len(seen) < MAX_LANES and (tenant := next_tenant(after)) is not None:
        seen.append(after := tenant)
    if start:
        after = ""
        while len(seen) < MAX_LANES and (tenant := next_tenant(after)) is not None and tenant <= start:
            seen.append(after := tenant)
    return seen
