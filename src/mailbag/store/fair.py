"""Fair claiming: which due messages a claim takes, shared among lanes.

A lane is one tenant's transactional mail, or its bulk mail (NewMessage.bulk). A claim of
`limit` messages first finds the lanes with due mail, and gives each a share of `limit`
by its weight (content.TRANSACTIONAL_WEIGHT, BULK_WEIGHT): its whole part of
`limit * weight / total weight`, and one more for each of the lanes whose head waited
longest until the shares add up to `limit`. Then each lane gives its share from its
head, in claim order (content.HEAD_START: priority orders a lane). A lane with less due
mail than its share leaves the rest of it unused: the next claim comes soon.

So a tenant's 20,000-message backlog gets the batch while it is alone, and half of it
(or its weight's part) as soon as another tenant has one message due, which the next claim
takes. Statelessly: every claim starts the rounds anew, which is what makes one message
of a new lane go at once.

Bounded work, however long the queue: the lanes are found one probe of the lanes index
(schema._lane_index) per tenant with claimable mail (a recursive CTE stepping from one
tenant to the next, a loose index scan), and their heads in that index's order. (MariaDB
steps by reading that index onwards, index only: see `_tenants`.)

- PostgreSQL, one statement: the lanes and shares as CTEs, each lane's head
  `LATERAL (... ORDER BY claim_order_at, id LIMIT share FOR UPDATE SKIP LOCKED)`, so
  claimers running together each lock rows the others have not, as before.
- MariaDB (no LATERAL) and SQLite: the lanes and shares are one read, the heads of every
  lane a second (`UNION ALL` of one `LIMIT` each), merged here in turn order; MariaDB then
  locks among them by primary key as transition._mysql_lockable does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Row,
    Select,
    String,
    case,
    func,
    literal,
    literal_column,
    select,
    true,
    union_all,
)

from mailbag.domain.content import BULK_WEIGHT, TRANSACTIONAL_WEIGHT
from mailbag.domain.states import CLAIMABLE
from mailbag.store.message_transitions import MESSAGE_ROWS
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import outbox_messages as om
from mailbag.store.types import UTCDateTime

# MariaDB's generated stand-ins for the partial claim and lanes indexes (see schema.py).
MYSQL_CLAIMABLE_TENANT = literal_column("claimable_tenant", String())
MYSQL_CLAIMABLE_AT = literal_column("claimable_at", UTCDateTime())


@dataclass(frozen=True)
class Lanes:
    """The fair candidates of outbox_messages' claim (transition.guarded_update's
    `candidates`): `guard` is the claim's whole condition (claimable, due, not paused)."""

    def locked(self, guard: ColumnElement[bool], limit: int) -> Select[Any]:
        """PostgreSQL: (id, previous_state) of each lane's share, locked, SKIP LOCKED."""
        shares = _shares(guard, limit, "postgresql").cte("lane_shares")
        heads = (
            select(om.c.id, om.c.status.label("previous_state"))
            .where(om.c.tenant_id == shares.c.tenant_id, om.c.bulk == shares.c.bulk, guard)
            .order_by(om.c.claim_order_at, om.c.id)
            .limit(shares.c.share)
            .with_for_update(skip_locked=True)
            .lateral("lane_heads")
        )
        # The shares add up to `limit` at most: saying so lets the planner update the rows
        # by primary key, not hash them against the whole table.
        return (
            select(heads.c.id, heads.c.previous_state)
            .select_from(shares.join(heads, true()))
            .limit(limit)
        )

    def window(self, guard: ColumnElement[bool], limit: int, per_row: int) -> Plan[list[Row[Any]]]:
        """MariaDB and SQLite: (id, previous_state) of `per_row` times each lane's share,
        unlocked, in turn order: lane by lane in proportion to the shares, each lane in
        claim order."""
        dialect = yield from current_dialect()
        shares = [
            (row.tenant_id, bool(row.bulk), int(row.share))
            for row in (yield Step(_shares(guard, limit, dialect))).all()
            if row.share > 0
        ]
        if not shares:
            return []
        tenant, order_at = _lane_columns(dialect)
        heads = [
            select(
                om.c.id,
                om.c.status.label("previous_state"),
                order_at.label("order_at"),
                literal(lane).label("lane"),
            )
            .where(tenant == tenant_id, om.c.bulk == bulk, guard)
            .order_by(order_at, om.c.id)
            .limit(share * per_row)
            .subquery()
            for lane, (tenant_id, bulk, share) in enumerate(shares)
        ]
        rows = (yield Step(union_all(*(select(head) for head in heads)))).all()
        return _in_turn(rows, [share for _, _, share in shares])


def _in_turn(rows: Sequence[Row[Any]], shares: Sequence[int]) -> list[Row[Any]]:
    """The lanes' heads merged: a lane's n-th row goes at turn n / share, so that any
    first part of the result holds each lane about in proportion to its share."""
    position = [0] * len(shares)
    keyed = []
    for row in sorted(rows, key=lambda r: (r.lane, r.order_at, r.id)):
        keyed.append((position[row.lane] / shares[row.lane], row.order_at, row.id, row))
        position[row.lane] += 1
    return [row for *_, row in sorted(keyed, key=lambda k: k[:3])]


LANES = Lanes()


def _lane_columns(dialect: str) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """The tenant and the claim order as the lanes index has them."""
    if dialect == "mysql":
        return MYSQL_CLAIMABLE_TENANT, MYSQL_CLAIMABLE_AT
    return om.c.tenant_id, om.c.claim_order_at


def _tenants(
    tenant: ColumnElement[Any], order_at: ColumnElement[Any], claimable: ColumnElement[bool]
) -> Any:
    """The tenants with claimable mail (a CTE of `tenant_id`, NULLs among them), one probe
    of the lanes index each on PostgreSQL and SQLite."""

    # A recursive CTE: each step the next tenant, `ORDER BY ... LIMIT 1` in the lanes
    # index's whole order, which no other index has (for `ORDER BY tenant_id` PostgreSQL
    # took the (tenant_id, idempotency_key) index, which holds every finished message too).
    # MariaDB's range cannot use the outer value, so there a step reads the index from the
    # previous tenant on, index only: 20,000 entries for a backlog of 20,000. (A GROUP BY,
    # its loose index scan, it did not use here, and read the range twice.)
    def next_tenant(after: ColumnElement[bool]) -> Any:
        first = select(tenant).select_from(om).where(claimable, after)
        return first.order_by(tenant, om.c.bulk, order_at).limit(1).scalar_subquery()

    tenants = select(next_tenant(true()).label("tenant_id")).cte("lane_tenants", recursive=True)
    return tenants.union_all(
        select(next_tenant(tenant > tenants.c.tenant_id)).where(tenants.c.tenant_id.is_not(None))
    )


def _shares(guard: ColumnElement[bool], limit: int, dialect: str) -> Select[Any]:
    """(tenant_id, bulk, share) of every lane with due mail."""
    tenant, order_at = _lane_columns(dialect)
    # Every claimable row (the partial index's predicate; on MariaDB claimable_tenant is
    # NULL unless the row is claimable, so a comparison with it says as much).
    claimable = tenant.is_not(None) if dialect == "mysql" else MESSAGE_ROWS.in_states(CLAIMABLE)

    tenants = _tenants(tenant, order_at, claimable)

    def lanes_of(bulk: bool) -> Select[Any]:
        head = (
            select(order_at)
            .where(om.c.bulk == bulk, tenant == tenants.c.tenant_id, guard)
            .order_by(order_at)
            .limit(1)
        )
        return select(
            tenants.c.tenant_id,
            literal(bulk, Boolean()).label("bulk"),
            head.scalar_subquery().label("head_at"),
        ).where(tenants.c.tenant_id.is_not(None))

    lanes = union_all(lanes_of(False), lanes_of(True)).subquery("lanes")
    weight = case((lanes.c.bulk, BULK_WEIGHT), else_=TRANSACTIONAL_WEIGHT)
    due = lanes.c.head_at.is_not(None)
    parts = (
        select(
            lanes.c.tenant_id,
            lanes.c.bulk,
            ((limit * weight) // func.sum(weight).over()).label("part"),
            func.row_number()
            .over(order_by=(lanes.c.head_at, lanes.c.tenant_id, lanes.c.bulk))
            .label("rank"),
        )
        .where(due)
        .subquery("lane_parts")
    )
    spare = limit - func.sum(parts.c.part).over()
    return select(
        parts.c.tenant_id,
        parts.c.bulk,
        (parts.c.part + case((parts.c.rank <= spare, 1), else_=0)).label("share"),
    )
