"""The one door every state change of an outbox message goes through, and the row types
it hands back.

Each change is ONE conditional UPDATE guarded by the states the domain's transition table
allows. It returns the rows it changed, and the same transaction appends one
`message_events` row per change (on PostgreSQL inside the same statement). How each
database runs a guarded UPDATE is in one place, `transition.guarded_update`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    ColumnElement,
    Row,
    String,
    and_,
    func,
    insert,
    literal,
    literal_column,
    select,
)

from mailbag.domain import states
from mailbag.domain.message import ERROR_MAX, Message, truncate_error
from mailbag.domain.states import Action, Status
from mailbag.store.database import Dialect
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import message_events, outbox_messages
from mailbag.store.transition import guarded_update

om = outbox_messages

M = TypeVar("M", bound="Message | Settled")


@dataclass(frozen=True)
class Changed(Generic[M]):
    """A row an operation changed, as it is now (a Message, or a Settled summary), and the
    state it left."""

    message: M
    from_status: Status


@dataclass(frozen=True)
class Settled:
    """The part of a changed row a worker's finalize needs back (`finalize(light=True)`):
    no template data, headers or tags to decode, thousands of times a second."""

    id: uuid.UUID
    tenant_id: str
    status: str
    attempt_count: int
    template_name: str
    metadata: Mapping[str, Any]
    provider_message_id: str | None
    last_error: str | None
    claimed_by: str | None


SETTLED_COLUMNS = tuple(Settled.__dataclass_fields__)


@dataclass(frozen=True)
class EventSpec:
    """What a transition's `message_events` row says beyond from/to/at/actor, stated so that
    it can be computed in Python or in SQL from the changed row (see `apply`).

    attempt = the row's attempt_count + `attempt_offset`; detail = `text`, or the row's
    `column` between `prefix` and `suffix`.
    """

    attempt_offset: int = 0
    text: str | None = None
    column: str | None = None
    prefix: str = ""
    suffix: str = ""

    def detail(self, message: Message | Settled) -> str | None:
        if self.column is None:
            return self.text
        value = getattr(message, self.column)
        if value is None:
            return None if not self.prefix else f"{self.prefix}?{self.suffix}"
        return f"{self.prefix}{value}{self.suffix}"

    def detail_sql(self, row: Any) -> ColumnElement[Any]:
        if self.column is None:
            return literal(truncate_error(self.text), message_events.c.detail.type)
        value = row.c[self.column]
        if not self.prefix and not self.suffix:
            return func.substr(value, 1, ERROR_MAX)
        text = (
            literal(self.prefix, String())
            + func.coalesce(value, "?")
            + literal(self.suffix, String())
        )
        return func.substr(text, 1, ERROR_MAX)


LAST_ERROR = EventSpec(column="last_error")

CLAIM_CLEARED: dict[str, Any] = {
    "claim_token": None,
    "claimed_by": None,
    "claimed_at": None,
    "lease_expires_at": None,
}


def in_states(statuses: frozenset[Status]) -> ColumnElement[bool]:
    # Literals, not bound parameters: PostgreSQL can only match a partial index whose
    # predicate it can prove from the query text, including under generic prepared plans.
    return om.c.status.in_([literal_column(f"'{s.value}'") for s in sorted(statuses)])


def allowed_by(action: Action) -> ColumnElement[bool]:
    return in_states(states.sources(action))


MESSAGE_COLUMNS = len(om.columns)

# Rows are turned into Messages by position (the hot path of every claim and finalize):
# the dataclass must list the table's columns in the table's order.
assert list(Message.__dataclass_fields__) == [c.name for c in om.columns]


def settled_from_row(row: Row[Any]) -> Settled:
    return Settled(*row[: len(SETTLED_COLUMNS)])


def message_from_row(row: Row[Any]) -> Message:
    """A Message from a row that starts with all of outbox_messages' columns, in order."""
    return Message(*row[:MESSAGE_COLUMNS])


def transition(
    dialect: Dialect,
    action: Action,
    *,
    where: ColumnElement[bool],
    values: Mapping[str, Any],
    now: datetime,
    actor: str,
    order_by: Sequence[ColumnElement[Any]] = (),
    limit: int | None = None,
    skip_locked: bool = False,
    event: EventSpec = EventSpec(),
) -> Plan[list[Changed[Message]]]:
    return (
        yield from apply(
            dialect,
            action,
            where=where,
            values=values,
            now=now,
            actor=actor,
            order_by=order_by,
            limit=limit,
            skip_locked=skip_locked,
            event=event,
            as_row=message_from_row,
        )
    )


def apply(
    dialect: Dialect,
    action: Action,
    *,
    where: ColumnElement[bool],
    values: Mapping[str, Any],
    now: datetime,
    actor: str,
    as_row: Callable[[Row[Any]], M],
    order_by: Sequence[ColumnElement[Any]] = (),
    limit: int | None = None,
    skip_locked: bool = False,
    event: EventSpec = EventSpec(),
) -> Plan[list[Changed[M]]]:
    """Apply `values` to the rows matching `where` (and allowed by `action`), log the events.

    On PostgreSQL the events are written by the same statement (a data-modifying CTE);
    elsewhere by one executemany in the same transaction.
    """
    actor = actor[:200]

    def log(updated: Any) -> Any:
        return insert(message_events).from_select(
            [
                "message_id",
                "from_status",
                "to_status",
                "at",
                "actor",
                "attempt",
                "provider_message_id",
                "detail",
            ],
            select(
                updated.c.id,
                updated.c.previous_state,
                updated.c.status,
                literal(now, message_events.c.at.type),
                literal(actor, String()),
                updated.c.attempt_count + event.attempt_offset,
                updated.c.provider_message_id,
                event.detail_sql(updated),
            ),
        )

    updated = yield from guarded_update(
        dialect,
        om,
        state="status",
        guard=and_(allowed_by(action), where),
        values={**values, "updated_at": now},
        order_by=order_by,
        limit=limit,
        skip_locked=skip_locked,
        log=log if dialect == "postgresql" else None,
        columns=SETTLED_COLUMNS if as_row is settled_from_row else None,
    )
    changed = [Changed(as_row(row), Status(previous)) for row, previous in updated]
    if changed and dialect != "postgresql":
        yield from append_events(
            event_row(
                c.message.id,
                c.from_status,
                c.message.status,
                now,
                actor,
                c.message.attempt_count + event.attempt_offset,
                c.message.provider_message_id,
                event.detail(c.message),
            )
            for c in changed
        )
    return changed


INSERT_EVENTS = insert(message_events)


def append_events(rows: Iterable[dict[str, Any]]) -> Plan[None]:
    """One executemany of a cached INSERT: the driver sends the rows in a pipeline (psycopg)
    or batches them; never a statement compiled anew for each batch."""
    pending = list(rows)
    if pending:
        yield Step(INSERT_EVENTS, pending)


def event_row(
    message_id: uuid.UUID,
    from_status: Status | None,
    to_status: str,
    at: datetime,
    actor: str,
    attempt: int,
    provider_message_id: str | None,
    detail: str | None,
) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "from_status": from_status.value if from_status else None,
        "to_status": to_status,
        "at": at,
        "actor": actor[:200],
        "attempt": attempt,
        "provider_message_id": provider_message_id,
        "detail": truncate_error(detail),
    }
