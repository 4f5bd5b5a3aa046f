"""Each recipient domain's send schedule under DOMAIN_SHAPING (`recipient_domain_rates`):
store/rate.py's plans on the domains' table, and the one read every worker makes once a
poll interval (domain.domain_shaping has the rules).

- `defer` records a deferral: it lowers the domain's rate for the whole fleet, making the
  domain's row if it has none, and reads the row back (a worker shapes the domain from its
  next claim on, without waiting for its next read).
- `reserve` takes slots for a claim's messages to a shaped domain: one statement on
  PostgreSQL and SQLite, a locked read and an update on MariaDB (as for PROVIDER_RATE).
- `shaped` is the domains still lowered: an index range on `lowered_until`, empty (and
  cheap) for a deployment whose recipients never defer.
- `forget` deletes the rows of domains quiet for FORGET_AFTER_SECONDS (the scheduler's
  housekeeping): the table holds the domains deferring lately, not every one that ever did.
"""

from __future__ import annotations

from sqlalchemy import delete, select

from mailbag.domain import domain_shaping as rules
from mailbag.domain.domain_shaping import Shaping
from mailbag.domain.rate import Bucket, Grant
from mailbag.store import rate
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import recipient_domain_rates as rdr

DOMAINS = rate.Schedules(rdr, rdr.c.domain)


def reserve(*, domain: str, count: int, shaping: Shaping) -> Plan[Grant]:
    """Take `count` consecutive send slots in `domain`'s schedule at the rate in force (the
    lowered rate, climbing back to the ceiling), for the whole fleet."""
    return (
        yield from rate.take_slots(
            DOMAINS, domain, count=count, rate=shaping.ceiling, cooldown=shaping.recovery
        )
    )


def defer(*, domain: str, shaping: Shaping, settle: float) -> Plan[tuple[Bucket, float]]:
    """`domain` deferred a send: lower its rate for every replica (halved, or only its
    recovery restarted while the deferral is of sends made before the last lowering took
    effect, `settle` seconds after its slots taken); its row after, and the database's time."""
    dialect = yield from current_dialect()
    for _ in range(2):  # the second time, after making the row (its first deferral)
        lowered = yield from rate.lower(
            DOMAINS,
            domain,
            rate=shaping.ceiling,
            cooldown=shaping.recovery,
            factor=rules.LOWER_FACTOR,
            floor=shaping.floor,
            settle=settle,
        )
        if lowered:
            found = yield from rate.read_schedule(DOMAINS, domain)
            if found is not None:
                return found
        yield from rate.make_row(dialect, DOMAINS, domain)
    raise LookupError(f"no recipient_domain_rates row for {domain!r}")  # made above: a bug


def shaped() -> Plan[dict[str, tuple[Bucket, float]]]:
    """Every domain still lowered: its row, and the database's time it was read at."""
    dialect = yield from current_dialect()
    now = rate.database_now(dialect)
    read = select(rdr.c.domain, *DOMAINS.columns, now.label("now")).where(rdr.c.lowered_until > now)
    found: dict[str, tuple[Bucket, float]] = {}
    for row in (yield Step(read)).all():
        found[row.domain] = Bucket(*map(float, row[1:5])), float(row.now)
    return found


def schedule(*, domain: str) -> Plan[tuple[Bucket, float] | None]:
    """`domain`'s row and the database's time: what an operator (or a test) looks at."""
    return (yield from rate.read_schedule(DOMAINS, domain))


def forget(*, limit: int = 1000) -> Plan[int]:
    """Delete up to `limit` rows of domains no longer slowed for FORGET_AFTER_SECONDS (a
    domain that defers again gets a new row); how many were deleted."""
    dialect = yield from current_dialect()
    quiet = rdr.c.lowered_until < rate.database_now(dialect) - rules.FORGET_AFTER_SECONDS
    found = (yield Step(select(rdr.c.domain).where(quiet).limit(limit))).scalars().all()
    if not found:
        return 0
    # Still quiet: one that deferred since it was read keeps its row.
    result = yield Step(delete(rdr).where(rdr.c.domain.in_(found), quiet))
    return int(result.rowcount)  # type: ignore[attr-defined]
