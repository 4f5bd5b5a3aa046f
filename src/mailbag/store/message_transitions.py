"""The one door every state change of an outbox message goes through, and the row types
it hands back.

Each change is ONE conditional UPDATE guarded by the states the domain's transition table
allows, landing in the state the table says (`transition.apply_transition`, shared with
verifications). It returns the rows it changed, and the same transaction appends one
`message_events` row per change and moves the verifications whose current email changed
(`verifications.follow_messages`): every caller gets both, none has to remember them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, Row

from mailbag.domain.content import Address, Recipients
from mailbag.domain.message import Message
from mailbag.domain.states import MESSAGES, Action, Status
from mailbag.store import verifications
from mailbag.store.plan import Plan
from mailbag.store.schema import message_events, outbox_messages
from mailbag.store.transition import EventSpec, Tracked, apply_transition

om = outbox_messages
MESSAGE_ROWS: Tracked[Status, Action] = Tracked(
    table=om,
    state="status",
    machine=MESSAGES,
    history=message_events,
    subject="message_id",
    copied={"provider_message_id": "provider_message_id"},
    counter=("attempt", "attempt_count"),
)

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
    template_name: str | None
    metadata: Mapping[str, Any]
    provider_message_id: str | None
    last_error: str | None
    claimed_by: str | None


SETTLED_COLUMNS = tuple(Settled.__dataclass_fields__)


LAST_ERROR = EventSpec(column="last_error")

CLAIM_CLEARED: dict[str, Any] = {
    "claim_token": None,
    "claimed_by": None,
    "claimed_at": None,
    "lease_expires_at": None,
}

MESSAGE_COLUMNS = len(om.columns)
# Rows are turned into Messages by position (the hot path of every claim and finalize):
# the dataclass must list the table's columns in the table's order (then `attachments`,
# which is not a column).
assert list(Message.__dataclass_fields__) == [c.name for c in om.columns] + ["attachments"]
_RECIPIENTS, _REPLY_TO, _SUPPRESSED = (
    [c.name for c in om.columns].index(name) for name in ("recipients", "reply_to", "suppressed")
)


def settled_from_row(row: Row[Any]) -> Settled:
    return Settled(*row[: len(SETTLED_COLUMNS)])


def message_from_row(row: Row[Any]) -> Message:
    """A Message from a row that starts with all of outbox_messages' columns, in order.
    The JSON of the columns added by 0006 becomes their types (most rows have NULLs)."""
    values = list(row[:MESSAGE_COLUMNS])
    if values[_RECIPIENTS] is not None:
        values[_RECIPIENTS] = Recipients.from_json(values[_RECIPIENTS])
    values[_REPLY_TO] = tuple(Address.from_json(a) for a in values[_REPLY_TO] or ())
    values[_SUPPRESSED] = tuple(values[_SUPPRESSED] or ())
    return Message(*values)


def transition(
    action: Action,
    *,
    where: ColumnElement[bool],
    now: datetime,
    actor: str,
    values: dict[str, Any] | None = None,
    order_by: Sequence[ColumnElement[Any]] = (),
    limit: int | None = None,
    skip_locked: bool = False,
    event: EventSpec = EventSpec(),
    as_row: Callable[[Row[Any]], M],
) -> Plan[list[Changed[M]]]:
    """Move the messages matching `where` that `action` allows; record each move and carry
    it over to the verifications that sent them. Rows come back as `as_row` makes them:
    whole Messages (`message_from_row`), or `settled_from_row` summaries (a worker's
    finalize)."""
    updated = yield from apply_transition(
        MESSAGE_ROWS,
        action,
        where=where,
        values=values or {},
        now=now,
        actor=actor,
        order_by=order_by,
        limit=limit,
        skip_locked=skip_locked,
        event=event,
        columns=SETTLED_COLUMNS if as_row is settled_from_row else None,
    )
    changed = [Changed(as_row(row), Status(previous)) for row, previous in updated]
    yield from verifications.follow_messages(changed, now=now, actor=actor)
    return changed
