"""Reads of outbox messages and their history, and the SQL of a message `Filter`."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import (
    BindParameter,
    Boolean,
    ColumnElement,
    Row,
    and_,
    bindparam,
    func,
    select,
    true,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.visitors import InternalTraversal

from mailbag.domain.message import Filter, Message
from mailbag.store import attachments
from mailbag.store.message_transitions import message_from_row, om
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import message_events


def get(message_id: uuid.UUID, tenant_id: str | None = None) -> Plan[Message | None]:
    """One message, with its attachments (references, not bytes)."""
    query = select(om).where(om.c.id == message_id)
    if tenant_id is not None:
        query = query.where(om.c.tenant_id == tenant_id)
    row = (yield Step(query)).first()
    if row is None:
        return None
    (message,) = yield from attachments.attached([message_from_row(row)])
    return message


def matching(where: Filter) -> ColumnElement[bool]:
    """The SQL of a message filter."""
    conditions: list[ColumnElement[bool]] = []
    if where.ids is not None:
        conditions.append(om.c.id.in_(where.ids))
    if where.status is not None:
        conditions.append(om.c.status == where.status.value)
    if where.tenant_id is not None:  # a tenant scope, once given, is never dropped
        conditions.append(om.c.tenant_id == where.tenant_id)
    if where.to:
        # Local parts are case-sensitive by the RFC but not by any mailbox anyone uses.
        conditions.append(SameAddress(om.c.to_address, where.to))
    if where.template:
        conditions.append(om.c.template_name == where.template)
    if where.created_from is not None:
        conditions.append(om.c.created_at >= where.created_from)
    if where.created_to is not None:
        conditions.append(om.c.created_at < where.created_to)
    return and_(true(), *conditions)


class SameAddress(ColumnElement[bool]):
    """`column` holds `address`, whatever the case of either, said so each database can
    answer from an index: `lower(column) = :address` on PostgreSQL and SQLite (an expression
    index, schema.py). MariaDB has no expression indexes; there the recipient column keeps
    a caseless collation (schema.CASELESS), so `column = :address` narrows through its
    plain index to a superset, and `lower(column)` compared byte for byte decides, because
    that collation also ignores accents (`adá` = `ada`, another mailbox)."""

    inherit_cache = True
    type = Boolean()
    _is_implicitly_boolean = True  # a comparison: no `= 1` after it where booleans are ints
    _traverse_internals = [
        ("column", InternalTraversal.dp_clauseelement),
        ("address", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, column: ColumnElement[str], address: str) -> None:
        self.column = column
        self.address: BindParameter[str] = bindparam("address", address.lower(), unique=True)


@compiles(SameAddress)
def _same_address(element: SameAddress, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(func.lower(element.column) == element.address, **kw)


@compiles(SameAddress, "mysql")
def _same_address_mysql(element: SameAddress, compiler: SQLCompiler, **kw: Any) -> str:
    exact = func.lower(element.column).collate("utf8mb4_bin") == element.address
    return compiler.process(and_(element.column == element.address, exact), **kw)


def page(
    where: Filter, *, limit: int, before: uuid.UUID | None = None
) -> Plan[tuple[list[Message], bool]]:
    """Newest first (ids are time-ordered), up to `limit`, and whether more follow; with
    their attachments (references, not bytes)."""
    query = select(om).where(matching(where))
    if before is not None:
        query = query.where(om.c.id < before)
    rows = (yield Step(query.order_by(om.c.id.desc()).limit(limit + 1))).all()
    found = yield from attachments.attached([message_from_row(row) for row in rows[:limit]])
    return found, len(rows) > limit


def events(message_id: uuid.UUID) -> Plan[list[Row[Any]]]:
    query = (
        select(message_events)
        .where(message_events.c.message_id == message_id)
        .order_by(message_events.c.id)
    )
    return list((yield Step(query)).all())


def count_by_status() -> Plan[dict[str, int]]:
    query = select(om.c.status, func.count().label("n")).group_by(om.c.status)
    return {row.status: int(row.n) for row in (yield Step(query)).all()}
