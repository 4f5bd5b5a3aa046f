"""Per-recipient-domain shaping (DOMAIN_SHAPING): a recipient domain that answers with
deferrals is sent to more slowly, by the whole fleet, while every other domain goes on at
full speed. Pure rules here; store/domain_rates.py keeps each domain's schedule in the
database, worker/shaping.py applies it to claimed messages.

The rules:
- A message's domain is its first To address's (`to_address`), in lower case: one message,
  one domain, so the check at a claim is a dict lookup, and a deferral is charged to the
  domain its message is filed under (Cc and Bcc at other domains go along with it).
- A deferral of the domain (`deferral_of`) is a Deferred its provider marked
  `domain_deferral` (SMTP: `is_deferral_reply`, a 421 or 451 to RCPT TO, or an enhanced
  4.7.x status in answer to RCPT TO, DATA or the content), or a Throttled whose text names
  the domain on its own (not inside a host name or an address): that one is the domain's,
  so it slows the domain and neither PROVIDER_RATE nor the worker's claims. The deferred
  message itself is decided as always (domain.delivery.decide: the retry policy).
- The schedule is domain.rate's, on the domain's row (GCRA slots on the database's clock):
  a domain is unshaped (no row, or its row no longer lowered) until it defers; its first
  deferral lowers it to half of DOMAIN_SHAPING_CEILING_PER_MINUTE, each later one halves
  the rate in force again, never below DOMAIN_SHAPING_FLOOR_PER_MINUTE. It climbs back in a
  straight line to the ceiling over DOMAIN_SHAPING_RECOVERY_SECONDS after the last
  deferral, and is then no longer shaped. Deferrals of sends made before the last lowering
  took effect everywhere (the slots already taken, and a poll interval: each worker reads
  the shaped domains once a poll interval) only restart the recovery: a burst lowers once.
- A claimed message of a shaped domain (`place`) goes now if a slot comes within
  GO_SECONDS; else it is released unsent (no attempt spent) and due again at its slot:
  slots taken in the domain's schedule for at most HORIZON_SECONDS ahead, which that
  message then holds (`holds_slot`: it goes when claimed again, without asking), and past
  that at the place it would have in line, holding nothing (it asks again when due). So a
  domain's backlog costs one statement per claim, not one per message, and a lowering
  leaves at most HORIZON_SECONDS of slots at the old rate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from mailbag.domain import rate
from mailbag.domain.delivery import Deferred, SendOutcome, Throttled
from mailbag.domain.message import Message
from mailbag.domain.rate import FLOATS, Bucket, Grant

LOWER_FACTOR = 0.5  # a deferral halves the domain's rate in force
# Beyond the slots taken before a lowering: every worker reads the shaped domains once a
# poll interval (added to this), and its sends in flight then still come back.
SETTLE_SECONDS = 2.0
GO_SECONDS = 0.5  # a slot this close is sent at once: half a second's worth in a burst
HORIZON_SECONDS = 10.0  # slots are held this far ahead at most; later ones wait in line
DOMAIN_MAX = 253  # a DNS name's length, recipient_domain_rates.domain's width
FORGET_AFTER_SECONDS = 86400.0  # a domain's row is deleted once quiet this long

# What a release says: HELD marks a message that holds its slot (holds_slot reads it back).
HELD = "holds a send slot of its recipient domain"
IN_LINE = "waits in line for its recipient domain"

_ENHANCED_DEFERRAL = re.compile(r"(?<![\d.])4\.7\.\d{1,3}(?![\d.])")
DEFERRAL_CODES = frozenset({421, 451})


@dataclass(frozen=True)
class Shaping:
    """DOMAIN_SHAPING's numbers: the ceiling a shaped domain climbs back to and the floor
    it never goes below (messages a second, for the whole fleet), and how long the climb
    takes after the last deferral."""

    ceiling: float
    floor: float
    recovery: float  # seconds

    def __post_init__(self) -> None:
        if not 0 < self.floor <= self.ceiling or self.recovery <= 0:
            raise ValueError("domain shaping needs 0 < floor <= ceiling and a positive recovery")

    @classmethod
    def per_minute(cls, ceiling: float, floor: float, recovery: float) -> Shaping:
        return cls(ceiling / 60.0, floor / 60.0, recovery)


def domain_of(address: str) -> str:
    """The domain an address is shaped under: after its last @, in lower case."""
    return address.rpartition("@")[2].lower()[:DOMAIN_MAX]


def is_deferral_reply(code: int, text: str, *, to_rcpt: bool) -> bool:
    """An SMTP reply that defers for the recipients' domain: a 4.7.x status (policy, rate)
    in answer to RCPT TO, DATA or the content, or a 421 or 451 to RCPT TO (to DATA those
    are as likely the relay's own trouble)."""
    if not 400 <= code < 500:
        return False
    return (to_rcpt and code in DEFERRAL_CODES) or bool(_ENHANCED_DEFERRAL.search(text))


def names_domain(text: str, domain: str) -> bool:
    """Whether `text` names `domain` on its own: not as the tail of a host name or an
    address, nor as a host:port."""
    if not domain:
        return False
    pattern = rf"(?<![\w.@-]){re.escape(domain)}(?![\w-]|\.\w|:\d)"
    return re.search(pattern, text, re.IGNORECASE) is not None


def deferral_of(message: Message, outcome: SendOutcome | None) -> str | None:
    """The domain `outcome` says deferred `message` (see the rules above), or None."""
    if isinstance(outcome, Deferred) and outcome.domain_deferral:
        return domain_of(message.to_address)
    if isinstance(outcome, Throttled):
        domain = domain_of(message.to_address)
        return domain if names_domain(outcome.error, domain) else None
    return None


def holds_slot(message: Message) -> bool:
    """A message released to wait for a slot it was given: it goes when claimed again."""
    return message.last_error is not None and message.last_error.startswith(HELD)


def lowered(bucket: Bucket, shaping: Shaping, *, now: float, settle: float) -> Bucket:
    """The domain's row after a deferral (domain.rate.throttled with this module's numbers;
    a domain's first row is domain.rate.new_bucket)."""
    return rate.throttled(
        FLOATS,
        bucket,
        now=now,
        rate=shaping.ceiling,
        cooldown=shaping.recovery,
        retry_after=None,
        factor=LOWER_FACTOR,
        floor=shaping.floor,
        settle=settle,
    )


def settle_seconds(poll_interval: float) -> float:
    """How long after the slots already taken a deferral only restarts the recovery."""
    return poll_interval + SETTLE_SECONDS


@dataclass(frozen=True)
class View:
    """A shaped domain as one worker knows it, on the worker's clock: the rate in force,
    the first slot nobody holds, until when it is shaped, and how far this worker has put
    messages in line (released to their place, holding no slot)."""

    rate: float  # messages a second
    free_at: datetime
    until: datetime
    in_line_until: datetime

    @property
    def per_minute(self) -> float:
        return self.rate * 60.0


def view_of(bucket: Bucket, shaping: Shaping, *, db_now: float, now: datetime) -> View | None:
    """A domain's row, read at the database's `db_now`, as seen at the worker's `now`;
    None once it is no longer lowered."""
    if bucket.lowered_until <= db_now:
        return None
    in_force = float(
        rate.rate_in_force(
            FLOATS, bucket, now=db_now, rate=shaping.ceiling, cooldown=shaping.recovery
        )
    )
    free_at = now + timedelta(seconds=max(0.0, bucket.next_slot_at - db_now))
    until = now + timedelta(seconds=bucket.lowered_until - db_now)
    return View(in_force, free_at, until, now)


def slots_to_take(view: View, count: int, now: datetime) -> int:
    """How many of `count` messages take slots now: as many as fit before HORIZON_SECONDS
    from now as far as `view` knows (at least one when any does), none when the line
    already runs that far."""
    ahead = max(0.0, (view.free_at - now).total_seconds())
    room = HORIZON_SECONDS - ahead
    if room <= 0:
        return 0
    return min(count, max(1, math.floor(room * view.rate)))


@dataclass(frozen=True)
class Placement:
    going: list[Message]  # sent now
    waiting: list[tuple[Message, str, datetime]]  # released: why, and when due again
    view: View  # the domain as this worker knows it after


def place(
    domain: str,
    messages: Sequence[Message],
    view: View,
    grant: Grant | None,
    now: datetime,
) -> Placement:
    """Where each of a shaped domain's claimed messages goes: the first `grant.count` to the
    slots `grant` holds (sent now when the slot is within GO_SECONDS, else released holding
    it), the rest in line after them, one slot's time apart, holding nothing."""
    why = f"({domain}, slowed to {view.per_minute:.3g} a minute after its deferrals)"
    going: list[Message] = []
    waiting: list[tuple[Message, str, datetime]] = []
    taken = grant.count if grant is not None else 0
    if grant is not None:
        view = replace(
            view, rate=grant.rate, free_at=now + timedelta(seconds=max(0.0, grant.ahead))
        )
        for index, message in enumerate(messages[:taken]):
            delay = grant.delay(index)
            if delay <= GO_SECONDS:
                going.append(message)
            else:
                waiting.append((message, f"{HELD} {why}", now + timedelta(seconds=delay)))
    line = max(view.free_at, view.in_line_until, now)
    for message in messages[taken:]:
        line += timedelta(seconds=1 / view.rate)
        waiting.append((message, f"{IN_LINE} {why}", line))
    return Placement(going, waiting, replace(view, in_line_until=line))
