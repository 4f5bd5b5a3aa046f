"""The fleet's send rate (PROVIDER_RATE): one schedule of send slots per provider, kept in
one database row that every replica shares. Pure arithmetic here; store/rate.py runs it.

The rules:
- At rate r the fleet's slots are 1/r seconds apart. `next_slot_at` is the first slot no
  one holds (the "theoretical arrival time" of GCRA, the token bucket's other form).
  Taking n slots: start = max(next_slot_at, now + LEAD_SECONDS); next_slot_at = start +
  n / r. Time left idle is not banked, so over any W seconds the whole fleet holds at most
  r * W + 1 slots: the rate is never exceeded, whatever the number of workers.
- `now` is the database's clock, never a worker's: replicas on several machines share one
  clock. Times are seconds since the epoch (a float keeps microseconds for centuries).
- A worker takes the slots for a whole claim at once (one short statement per batch) and
  sends each chunk no earlier than the slot of its last message. A chunk holds at most
  CHUNK_SECONDS' worth of the rate, so a batch call never bursts far past it.
- A provider's own throttling answer lowers the rate for the fleet: to LOWER_FACTOR of
  the rate in force, climbing back in a straight line to PROVIDER_RATE over the cooldown
  (additive increase after a multiplicative decrease, as TCP does: a stray 429 costs a
  little for a while, a provider truly slower than PROVIDER_RATE keeps it lowered); never
  below MIN_FRACTION of PROVIDER_RATE.
  The slots taken before a lowering still come at the old rate: throttles until they have
  passed (and SETTLE_SECONDS more, for the sends in flight) only extend the cooldown, so a
  burst of 429s lowers the rate once, not once per 429. The provider's retry-after hint
  holds back every slot until then (never beyond the cooldown).

The formulas are written once, over `Ops`: evaluated on floats (the tests, and MariaDB,
which has no UPDATE ... RETURNING and so reads the row under a lock) and as SQL
expressions inside one UPDATE (PostgreSQL, SQLite). The same code decides both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

# A worker claims at most this many seconds' worth of the rate at once, and claims again
# only once the fleet's schedule runs less than this far ahead: a claimed message waits
# about this long for its slot at most, not a whole backlog's worth.
HORIZON_SECONDS = 1.0
# A claim's first slot is at least this far ahead: time for the worker to compose the
# emails and start their sends, so that one starting from idle (or cold) is not already
# late for its first slots, which would bunch them up (seen: 100-150 ms on a busy host).
LEAD_SECONDS = 0.1
# A chunk (one provider call) holds at most this many seconds' worth of the rate: a batch
# of k emails leaves at its last slot, so a provider that counts per second may see up to
# k - 1 more than the rate in one second. 2% of the rate (and at least one email).
CHUNK_SECONDS = 0.02
LOWER_FACTOR = 0.9  # a throttle takes a tenth off the rate in force
SETTLE_SECONDS = 1.0  # after the last slot taken at the old rate, for sends in flight
MIN_FRACTION = 0.01  # the lowest a throttled rate goes, as a share of PROVIDER_RATE

# A float, or a SQL expression: the formulas below run on both (see the module doc).
Num = Any


@dataclass(frozen=True)
class RateLimit:
    """PROVIDER_RATE (messages a second, for the whole fleet) and how long a provider's
    throttle lowers it (PROVIDER_RATE_COOLDOWN_SECONDS)."""

    per_second: float
    cooldown: float

    def __post_init__(self) -> None:
        if self.per_second <= 0 or self.cooldown <= 0:
            raise ValueError("a rate limit needs a positive rate and cooldown")


class Ops(Protocol):
    """What the formulas need beyond + - * / and comparisons."""

    def greatest(self, a: Num, b: Num) -> Num: ...

    def least(self, a: Num, b: Num) -> Num: ...

    def when(self, condition: Any, then: Num, otherwise: Num) -> Num: ...


class FloatOps:
    """`Ops` on plain floats."""

    def greatest(self, a: float, b: float) -> float:
        return max(a, b)

    def least(self, a: float, b: float) -> float:
        return min(a, b)

    def when(self, condition: Any, then: float, otherwise: float) -> float:
        return then if condition else otherwise


FLOATS = FloatOps()


@dataclass(frozen=True)
class Bucket:
    """A provider's row: the first free slot, and the lowered rate while it lasts."""

    next_slot_at: Num
    lowered_rate: Num  # in force while lowered_until is ahead (0: never lowered)
    lowered_until: Num
    settles_at: Num  # throttles before this answer slots taken before the last lowering


@dataclass(frozen=True)
class Reservation:
    first_slot: Num  # the first slot taken; the i-th is first_slot + i / rate
    rate: Num  # the rate the slots were taken at
    next_slot_at: Num  # the row's next free slot after this reservation


def rate_in_force(ops: Ops, bucket: Bucket, *, now: Num, rate: float, cooldown: float) -> Num:
    """PROVIDER_RATE, or while a throttle's cooldown lasts the lowered rate, climbing back
    to PROVIDER_RATE as the cooldown runs out."""
    left = (bucket.lowered_until - now) / cooldown  # 1 when lowered, 0 once cooled down
    climbing = bucket.lowered_rate + (rate - bucket.lowered_rate) * (1 - left)
    return ops.when(bucket.lowered_until > now, ops.least(climbing, rate), rate)


def reserve(
    ops: Ops, bucket: Bucket, *, now: Num, rate: float, cooldown: float, count: Any
) -> Reservation:
    """Take `count` consecutive slots, the first at the next free one (at the soonest
    LEAD_SECONDS from now)."""
    in_force = rate_in_force(ops, bucket, now=now, rate=rate, cooldown=cooldown)
    start = ops.greatest(bucket.next_slot_at, now + LEAD_SECONDS)
    return Reservation(start, in_force, start + count / in_force)


def throttled(
    ops: Ops,
    bucket: Bucket,
    *,
    now: Num,
    rate: float,
    cooldown: float,
    retry_after: float | None,
    factor: float = LOWER_FACTOR,
    floor: float | None = None,
    settle: float = SETTLE_SECONDS,
) -> Bucket:
    """The row after the provider throttled a send (see the rules above): the rate in force
    times `factor`, never below `floor` (MIN_FRACTION of `rate` unless given); throttles
    until `settle` seconds after the slots already taken only extend the cooldown.
    (domain_shaping lowers a recipient domain with the same rule and its own numbers.)

    Each field depends only on itself and on fields assigned after it, in the order
    lowered_rate, settles_at, lowered_until, next_slot_at: an UPDATE that assigns them in
    that order means the same whether its SET sees old values (the SQL standard) or new
    ones (MySQL's left to right)."""
    settling = bucket.settles_at > now
    lowered = ops.greatest(
        rate_in_force(ops, bucket, now=now, rate=rate, cooldown=cooldown) * factor,
        rate * MIN_FRACTION if floor is None else floor,
    )
    hold = min(retry_after or 0.0, cooldown)
    return Bucket(
        lowered_rate=ops.when(settling, bucket.lowered_rate, lowered),
        settles_at=ops.when(
            settling,
            bucket.settles_at,
            ops.greatest(bucket.next_slot_at, now) + settle,
        ),
        lowered_until=now + cooldown,
        next_slot_at=ops.greatest(bucket.next_slot_at, now + hold),
    )


def new_bucket(now: float) -> Bucket:
    """A provider's first row: nothing reserved, never lowered."""
    return Bucket(next_slot_at=now, lowered_rate=0.0, lowered_until=0.0, settles_at=0.0)


@dataclass(frozen=True)
class Grant:
    """Slots a worker holds for one claim, in the database's time, and that time when
    they were taken: the worker turns them into delays on its own clock."""

    count: int
    first_slot: float
    rate: float
    now: float

    def delay(self, index: int) -> float:
        """Seconds from when the grant was taken until slot `index` (0-based)."""
        return max(0.0, self.first_slot + index / self.rate - self.now)

    @property
    def ahead(self) -> float:
        """How far ahead of `now` the fleet's schedule ran after this grant."""
        return self.first_slot + self.count / self.rate - self.now


def claim_limit(rate: float) -> int:
    """The most a worker claims at once under `rate` (HORIZON_SECONDS' worth)."""
    return max(1, math.ceil(rate * HORIZON_SECONDS))


def chunk_limit(rate: float) -> int:
    """The most emails one provider call carries under `rate` (CHUNK_SECONDS' worth)."""
    return max(1, int(rate * CHUNK_SECONDS))


class SendSlot(NamedTuple):
    """When a chunk may leave (a monotonic time) and the rate in force when it was given."""

    at: float
    rate: float


@dataclass
class Pace:
    """One worker's sends kept the rate apart even when they leave late.

    A chunk leaves at its slot, but a worker whose event loop was held up (a GC pause, a
    starved CPU) wakes with several past slots at once and would send them in one burst,
    over the provider's per-second count. So each chunk also takes its turn here, right
    before it sends (a virtual scheduling clock, as GCRA keeps it): it may leave as much as
    one chunk's time ahead of `due`, so a send a little late takes nothing from the next
    one, and the rest of a late burst follows at the rate. A turn is booked only when it is
    taken, never while a chunk waits: chunks whose waits all end in the same stall still
    leave one chunk's time apart, so any three sends span at least that long."""

    due: float = -math.inf  # when the next send would leave at the rate, on time

    def take(self, count: int, rate: float, now: float) -> float:
        """0 when `count` emails may leave at `now` (their turn is then booked); else the
        seconds to wait before asking again (nothing booked)."""
        start = max(now, self.due - count / rate)
        if start > now:
            return start - now
        self.due = max(self.due, now) + count / rate
        return 0.0
