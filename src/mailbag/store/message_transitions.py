"""The one door every state change of an outbox message goes through, and the row types
it hands back.

Each change is ONE conditional UPDATE guarded by the states the domain's transition table
allows, landing in the state the table says (`transition.apply_transition`, shared with
verifications). It returns the rows it changed, and the same transaction appends one
`message_events` row per change and moves the verifications whose current email changed
(`verifications.follow_messages`) and writes the event hooks' deliveries of the messages
that became sent, failed, dead or unknown (`hooks.fan_out`): every caller gets all three,
none has to remember them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, Row

from mailbag.domain.content import Address, Recipients
from mailbag.domain.hooks import FOR_STATUS, MessageFacts
from mailbag.domain.message import Message, NewMessage
from mailbag.domain.states import MESSAGES, Action, Status
from mailbag.store import hooks, verifications
from mailbag.store.plan import Plan
from mailbag.store.schema import message_events, outbox_messages
from mailbag.store.transition import Candidates, EventSpec, Tracked, apply_transition

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
_STATUS = {status.value: status for status in Status}  # Status(value), without the enum's call
# The event hook each action fires, by the one state it leads to (sent, failed, dead,
# unknown); a claim, a release or a requeue fires none.
_HOOK_EVENTS = {
    action: FOR_STATUS[target]
    for action in Action
    if len(MESSAGES.targets(action)) == 1 and (target := MESSAGES.target(action)) in FOR_STATUS
}


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
    # For event hooks' payloads:
    to_address: str | None = None
    provider: str | None = None


SETTLED_COLUMNS = tuple(Settled.__dataclass_fields__)


LAST_ERROR = EventSpec(column="last_error")

CLAIM_CLEARED: dict[str, Any] = {
    "claim_token": None,
    "claimed_by": None,
    "claimed_at": None,
    "lease_expires_at": None,
}

MESSAGE_COLUMNS = len(om.columns)
_CARRIED = [c.name for c in om.columns].index("carried")
# Rows are turned into Messages by position (the hot path of every claim and finalize):
# the dataclass lists the table's columns in the table's order but `carried`, whose keys
# are the fields that follow them.
_COLUMN_FIELDS = [c.name for c in om.columns if c.name != "carried"]
assert list(Message.__dataclass_fields__)[: len(_COLUMN_FIELDS)] == _COLUMN_FIELDS
CARRIED_FIELDS = (
    "from_name",
    "recipients",
    "reply_to",
    "html",
    "text",
    "unsubscribe_url",
    "unsubscribe_mailto",
    "suppressed",
    "locale",
)


def carried_json(
    m: NewMessage, recipients: Recipients, suppressed: Sequence[str], from_name: str | None
) -> dict[str, Any] | None:
    """The `carried` column of a new message: only what it has, None when it is plain."""
    carried: dict[str, Any] = {
        "from_name": from_name,
        "recipients": None if recipients.is_single else recipients.as_json(),
        "reply_to": [a.as_json() for a in m.reply_to],
        "html": m.html,
        "text": m.text,
        "unsubscribe_url": m.unsubscribe_url,
        "unsubscribe_mailto": m.unsubscribe_mailto,
        "suppressed": list(suppressed),
        "locale": m.locale,
    }
    kept = {key: value for key, value in carried.items() if value}
    return kept or None


def unpacked(carried: Mapping[str, Any]) -> dict[str, Any]:
    fields = {key: carried[key] for key in CARRIED_FIELDS if key in carried}
    if "recipients" in fields:
        fields["recipients"] = Recipients.from_json(fields["recipients"])
    if "reply_to" in fields:
        fields["reply_to"] = tuple(Address.from_json(a) for a in fields["reply_to"])
    if "suppressed" in fields:
        fields["suppressed"] = tuple(fields["suppressed"])
    return fields


def settled_from_row(row: Row[Any]) -> Settled:
    # As Settled(*row[:11]) would, in one dict update (see message_from_row).
    settled = object.__new__(Settled)
    settled.__dict__.update(zip(SETTLED_COLUMNS, row))  # noqa: B905 - the row is longer
    return settled


_ROW_FIELDS = [c.name for c in om.columns]  # `carried` among them, popped below
# Every field a row may leave out, at its default (all immutable: shared safely).
_DEFAULTS = {
    f.name: f.default
    for f in dataclass_fields(Message)
    if f.name not in _ROW_FIELDS and f.default is not MISSING
}
assert len(_DEFAULTS) + len(_COLUMN_FIELDS) == len(dataclass_fields(Message))


def message_from_row(row: Row[Any]) -> Message:
    """A Message from a row that starts with all of outbox_messages' columns, in order;
    what `carried` holds (most rows: nothing) becomes the fields after the columns.

    Filled in as the frozen dataclass's own __init__ would (it has no __post_init__), but
    in one dict update: its __init__ sets 40 fields one object.__setattr__ at a time, and
    every claim makes a Message per row."""
    message = object.__new__(Message)
    state = message.__dict__
    state.update(_DEFAULTS)
    state.update(zip(_ROW_FIELDS, row[:MESSAGE_COLUMNS]))  # noqa: B905 - the row is longer
    carried = state.pop("carried")
    if carried is not None:
        state.update(unpacked(carried))
    return message


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
    cache: Hashable | None = None,
    params: Mapping[str, Any] | None = None,
    candidates: Candidates | None = None,
) -> Plan[list[Changed[M]]]:
    """Move the messages matching `where` that `action` allows; record each move and carry
    it over to the verifications that sent them. Rows come back as `as_row` makes them:
    whole Messages (`message_from_row`), or `settled_from_row` summaries (a worker's
    finalize). `cache`, `params` and `candidates`: see transition.guarded_update."""
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
        cache=cache,
        params=params,
        candidates=candidates,
    )
    changed = [Changed(as_row(row), _STATUS[previous]) for row, previous in updated]
    yield from verifications.follow_messages(changed, now=now, actor=actor)
    if hook_event := _HOOK_EVENTS.get(action):
        yield from hooks.fan_out(
            [(hook_event, c.message) for c in changed if c.from_status != c.message.status],
            message_facts,
            now=now,
        )
    return changed


def message_facts(message: Message | Settled) -> MessageFacts:
    """What an event hook's payload says about a message (hooks.fan_out asks only about
    messages of a tenant with an endpoint)."""
    return MessageFacts(
        message_id=message.id,
        tenant_id=message.tenant_id,
        status=message.status,
        to=message.to_address,
        template=message.template_name,
        subject=getattr(message, "subject", None),
        provider=message.provider,
        provider_message_id=message.provider_message_id,
        error=message.last_error,
        metadata=message.metadata,
    )
