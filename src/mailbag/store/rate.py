"""The fleet's send schedules: the SQL that runs domain.rate, per provider (`provider_rates`,
PROVIDER_RATE) and, through the same plans on another `Schedules` table, per recipient
domain (store/domain_rates.py).

- `reserve` takes a claim's slots in one statement on PostgreSQL and SQLite: an UPDATE
  whose SET is domain.rate's formula written as SQL, RETURNING the row and the clock it
  read. MariaDB has no UPDATE ... RETURNING: it reads the row under a lock and writes the
  formula's value (two statements in one short transaction, like its claim).
- `throttle` lowers the rate for every replica: one UPDATE on every database.
- Time is the database's, read once per statement: PostgreSQL's clock_timestamp() (not
  now(), the transaction's start), MariaDB's SYSDATE(6) as its locking read returns the row
  (NOW(6), the statement's start, in the throttle), SQLite's julianday('now').
- The row is made by the first reservation that finds none (an insert that skips a taken
  key, then the reservation again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Double,
    case,
    cast,
    extract,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.schema import Table

from mailbag.database_url import Dialect
from mailbag.domain import rate as rules
from mailbag.domain.rate import FLOATS, Bucket, Grant
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import provider_rates as pr
from mailbag.store.types import insert_into

_UNIX_EPOCH_JULIAN_DAY = 2440587.5


@dataclass(frozen=True)
class Schedules:
    """A table of send schedules, one row per key, each row a domain.rate `Bucket` in the
    same four columns: the providers' (`provider_rates`), the recipient domains'
    (`recipient_domain_rates`, store/domain_rates.py)."""

    table: Table
    key: Column[str]

    @property
    def columns(self) -> tuple[Column[float], ...]:
        c = self.table.c
        return (c.next_slot_at, c.lowered_rate, c.lowered_until, c.settles_at)

    @property
    def bucket(self) -> Bucket:
        """The row's bucket as SQL expressions: what domain.rate's formulas run on."""
        return Bucket(*self.columns)


PROVIDERS = Schedules(pr, pr.c.provider)


class SQLOps:
    """domain.rate's `Ops` as SQL expressions on one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self.sqlite = dialect == "sqlite"

    def greatest(self, a: Any, b: Any) -> ColumnElement[float]:
        return func.max(a, b) if self.sqlite else func.greatest(a, b)

    def least(self, a: Any, b: Any) -> ColumnElement[float]:
        return func.min(a, b) if self.sqlite else func.least(a, b)

    def when(self, condition: Any, then: Any, otherwise: Any) -> ColumnElement[float]:
        return case((condition, then), else_=otherwise)


def database_now(dialect: Dialect) -> ColumnElement[float]:
    """The database's time in seconds since the epoch, read once however often a statement
    uses it."""
    if dialect == "postgresql":
        # clock_timestamp() changes at every call: read once, in a (materialized) CTE.
        clock = select(cast(extract("epoch", func.clock_timestamp()), Double).label("now"))
        return select(clock.cte("clock").c.now).scalar_subquery()
    if dialect == "mysql":
        return literal_column("UNIX_TIMESTAMP(NOW(6))", Double)  # the statement's start
    return (func.julianday("now") - _UNIX_EPOCH_JULIAN_DAY) * 86400.0


# MariaDB's time as a locking read returns its row, after any wait for the lock. Written
# out: SQLAlchemy renders func.sysdate as a bare SYSDATE (whole seconds).
MYSQL_LOCKED_NOW = literal_column("UNIX_TIMESTAMP(SYSDATE(6))", Double)


def reserve(*, provider: str, count: int, rate: float, cooldown: float) -> Plan[Grant]:
    """Take `count` consecutive send slots from `provider`'s schedule at PROVIDER_RATE
    `rate` (or the lowered rate in force, climbing back over `cooldown`), for the whole
    fleet; the answer says when each slot comes, on the database's clock."""
    return (yield from take_slots(PROVIDERS, provider, count=count, rate=rate, cooldown=cooldown))


def take_slots(
    schedules: Schedules, key: str, *, count: int, rate: float, cooldown: float
) -> Plan[Grant]:
    """`reserve` on any table of schedules: the row is made by the first reservation that
    finds none."""
    dialect = yield from current_dialect()
    for _ in range(2):  # the second time, after making the row
        if dialect == "mysql":
            grant = yield from _reserve_locked(schedules, key, count, rate, cooldown)
        else:
            grant = yield from _reserve_returning(dialect, schedules, key, count, rate, cooldown)
        if grant is not None:
            return grant
        yield from make_row(dialect, schedules, key)
    raise LookupError(f"no {schedules.table.name} row for {key!r}")  # the insert made it: a bug


def make_row(dialect: Dialect, schedules: Schedules, key: str) -> Plan[None]:
    """A key's first row (nothing reserved, never lowered), unless another made it first."""
    now = (yield Step(select(database_now(dialect).label("now")))).scalar_one()
    row = {schedules.key.name: key, **vars(rules.new_bucket(float(now)))}
    insert = insert_into(dialect, schedules.table).values(**row)
    if dialect == "mysql":
        yield Step(insert.on_duplicate_key_update({schedules.key.name: schedules.key}))
    else:
        yield Step(insert.on_conflict_do_nothing(index_elements=[schedules.key]))


def _reserve_returning(
    dialect: Dialect, schedules: Schedules, key: str, count: int, rate: float, cooldown: float
) -> Plan[Grant | None]:
    now = database_now(dialect)
    taken = rules.reserve(
        SQLOps(dialect), schedules.bucket, now=now, rate=rate, cooldown=cooldown, count=count
    )
    c = schedules.table.c
    statement = (
        update(schedules.table)
        .where(schedules.key == key)
        .values(next_slot_at=taken.next_slot_at)
        .returning(c.next_slot_at, c.lowered_rate, c.lowered_until, now.label("now"))
    )
    row = (yield Step(statement)).first()
    if row is None:
        return None
    # The row after the update, and the clock it read: the slots taken end at next_slot_at.
    after = Bucket(float(row.next_slot_at), float(row.lowered_rate), float(row.lowered_until), 0.0)
    in_force = rules.rate_in_force(FLOATS, after, now=float(row.now), rate=rate, cooldown=cooldown)
    first = after.next_slot_at - count / in_force
    return Grant(count, first, in_force, float(row.now))


def _reserve_locked(
    schedules: Schedules, key: str, count: int, rate: float, cooldown: float
) -> Plan[Grant | None]:
    read = select(*schedules.columns, MYSQL_LOCKED_NOW.label("now")).where(schedules.key == key)
    row = (yield Step(read.with_for_update())).first()
    if row is None:
        return None
    bucket = Bucket(*(float(value) for value in row[:4]))
    now = float(row.now)
    taken = rules.reserve(FLOATS, bucket, now=now, rate=rate, cooldown=cooldown, count=count)
    yield Step(
        update(schedules.table).where(schedules.key == key).values(next_slot_at=taken.next_slot_at)
    )
    return Grant(count, taken.first_slot, taken.rate, now)


def throttle(
    *, provider: str, rate: float, cooldown: float, retry_after: float | None = None
) -> Plan[bool]:
    """The provider throttled a send: lower `provider`'s rate for every replica for
    `cooldown` seconds, and hold back every slot for its `retry_after` hint, if any. False
    when the provider has no row (nothing was reserved, so nothing was sent)."""
    return (
        yield from lower(PROVIDERS, provider, rate=rate, cooldown=cooldown, retry_after=retry_after)
    )


def lower(
    schedules: Schedules,
    key: str,
    *,
    rate: float,
    cooldown: float,
    retry_after: float | None = None,
    factor: float = rules.LOWER_FACTOR,
    floor: float | None = None,
    settle: float = rules.SETTLE_SECONDS,
) -> Plan[bool]:
    """`throttle` on any table of schedules, with domain.rate.throttled's numbers; False
    when `key` has no row."""
    dialect = yield from current_dialect()
    now = database_now(dialect)
    after = rules.throttled(
        SQLOps(dialect),
        schedules.bucket,
        now=now,
        rate=rate,
        cooldown=cooldown,
        retry_after=retry_after,
        factor=factor,
        floor=floor,
        settle=settle,
    )
    # Assigned in the order domain.rate.throttled names: the same on MariaDB, whose SET
    # sees the values assigned before it.
    c = schedules.table.c
    values: Mapping[Any, Any] = {
        c.lowered_rate: after.lowered_rate,
        c.settles_at: after.settles_at,
        c.lowered_until: after.lowered_until,
        c.next_slot_at: after.next_slot_at,
    }
    statement = update(schedules.table).where(schedules.key == key).ordered_values(*values.items())
    result = yield Step(statement)
    return bool(result.rowcount)  # type: ignore[attr-defined]


def schedule(*, provider: str) -> Plan[tuple[Bucket, float] | None]:
    """`provider`'s row and the database's time: what an operator (or a test) looks at."""
    return (yield from read_schedule(PROVIDERS, provider))


def read_schedule(schedules: Schedules, key: str) -> Plan[tuple[Bucket, float] | None]:
    """`schedule` on any table of schedules."""
    dialect = yield from current_dialect()
    read = select(*schedules.columns, database_now(dialect).label("now"))
    row = (yield Step(read.where(schedules.key == key))).first()
    if row is None:
        return None
    return Bucket(*(float(value) for value in row[:4])), float(row.now)
