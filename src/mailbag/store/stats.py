"""Read-only numbers about the outbox, for the console, `mailbag stats`, metrics and alerts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, ScalarSelect, Table, func, literal_column, select, true

from mailbag.domain.content import HEAD_START
from mailbag.domain.states import CLAIMABLE, TERMINAL, Status
from mailbag.store.fair import MYSQL_CLAIMABLE_AT
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import message_events as me
from mailbag.store.schema import outbox_messages as om
from mailbag.store.schema import provider_events as pe

# The states a scrape counts: the queue and what waits on an operator. Final states only
# grow (until purge) and a count of them reads the whole table; their fleet-wide totals are
# the outcome counters (mailbag_sent_total, ...).
COUNTED_STATES: tuple[Status, ...] = tuple(s for s in Status if s not in TERMINAL)
# Each count stops here, so a scrape reads at most this many index entries per state
# however large a backlog grows; the oldest due message's age says how far behind it is.
COUNT_CAP = 100_000
# The due rows `oldest_due` reads at most (rows, not index entries: each is looked up).
OLDEST_DUE_READ = 10_000


@dataclass(frozen=True)
class OutboxGauges:
    """What /metrics reports about the whole outbox, read in three indexed statements."""

    counts: dict[str, int]  # COUNTED_STATES, each at most COUNT_CAP
    oldest_due: datetime | None
    unmatched_provider_events: int  # at most COUNT_CAP


def outbox_gauges(now: datetime, *, cap: int = COUNT_CAP) -> Plan[OutboxGauges]:
    """The scrape's numbers: capped counts in one statement (each a range of an index that
    leads with the filtered column), then `oldest_due`'s two short index ranges."""
    counts = [_capped_count(om, om.c.status == s.value, cap).label(s.value) for s in COUNTED_STATES]
    unmatched = _capped_count(pe, pe.c.message_id.is_(None), cap).label("unmatched")
    row = (yield Step(select(*counts, unmatched))).one()
    return OutboxGauges(
        counts={s.value: int(getattr(row, s.value)) for s in COUNTED_STATES},
        oldest_due=(yield from oldest_due(now)),
        unmatched_provider_events=int(row.unmatched),
    )


def _capped_count(table: Table, where: ColumnElement[bool], cap: int) -> ScalarSelect[int]:
    """count(*) of the first `cap` rows matching: the LIMIT inside bounds the index range read."""
    first = select(literal_column("1")).select_from(table).where(where).limit(cap).subquery()
    return select(func.count()).select_from(first).scalar_subquery()


def oldest_due(now: datetime) -> Plan[datetime | None]:
    """When the longest-waiting claimable message became due (None: nothing is waiting).

    Read through the claim index, which is in claim order (due time less a head start of at
    most HEAD_START either way): the longest-waiting message's claim order is within
    2 * HEAD_START of the earliest one, so two short index ranges find it, however long
    the queue (the second one at most OLDEST_DUE_READ rows long)."""
    dialect = yield from current_dialect()
    order_at: ColumnElement[datetime]
    claimable: ColumnElement[bool]
    if dialect == "mysql":
        # claimable_at is NULL unless the row is claimable: a range of its index is the
        # claimable rows, and a status test beside it would only send MariaDB to the rows.
        order_at, claimable = MYSQL_CLAIMABLE_AT, true()
    else:  # the partial index's own predicate, so the planner can use it
        order_at, claimable = om.c.claim_order_at, om.c.status.in_([s.value for s in CLAIMABLE])
    first = (
        select(func.min(order_at)).select_from(om).where(claimable, order_at <= now + HEAD_START)
    )
    earliest = _as_datetime((yield Step(first)).scalar_one(), now)
    if earliest is None:
        return None
    # The first OLDEST_DUE_READ of them in claim order: a burst larger than that within the
    # window (bulk mail) costs no more, and the answer is then off by at most 2 * HEAD_START.
    window = (
        select(om.c.next_attempt_at.label("due"))
        .where(claimable, order_at <= earliest + 2 * HEAD_START, om.c.next_attempt_at <= now)
        .order_by(order_at)
        .limit(OLDEST_DUE_READ)
        .subquery()
    )
    return _as_datetime((yield Step(select(func.min(window.c.due)))).scalar_one(), now)


def _as_datetime(value: Any, now: datetime) -> datetime | None:
    if isinstance(value, str):  # SQLite hands min() of a datetime back as text
        return datetime.fromisoformat(value).replace(tzinfo=now.tzinfo)
    return value  # type: ignore[no-any-return]


def sent_per_bucket(
    now: datetime, *, buckets: int = 12, width: timedelta = timedelta(minutes=5)
) -> Plan[list[int]]:
    """Messages sent per time bucket, oldest first; each a range count on (to_status, at)."""
    start = now - buckets * width
    counts = []
    for i in range(buckets):
        low = start + i * width
        query = (
            select(func.count())
            .select_from(me)
            .where(me.c.to_status == Status.SENT.value, me.c.at >= low, me.c.at < low + width)
        )
        counts.append(int((yield Step(query)).scalar_one()))
    return counts


def attempt_endings(since: datetime) -> Plan[dict[str, int]]:
    """How attempts ended since a time: sent, retrying, failed, dead, unknown, released."""
    query = (
        select(me.c.to_status, func.count().label("n"))
        .where(me.c.from_status == Status.PROCESSING.value, me.c.at >= since)
        .group_by(me.c.to_status)
    )
    return {row.to_status: int(row.n) for row in (yield Step(query)).all()}


def oldest_unknown(limit: int = 10) -> Plan[list[Row[Any]]]:
    query = (
        select(om.c.id, om.c.tenant_id, om.c.to_address, om.c.updated_at, om.c.claimed_by)
        .where(om.c.status == Status.UNKNOWN.value)
        .order_by(om.c.updated_at)
        .limit(limit)
    )
    return list((yield Step(query)).all())
