"""A key's first use: the common case of a keyed request, as one chain (store/chain.py).

POST /v1/messages and POST /v1/email-verifications with an Idempotency-Key the tenant has
not used take this first, on every database; anything it does not write is decided by the
general path (services.idempotency.execute with store.enqueue, or the verification
workflow), exactly as before. Its rows are the general path's, built by the same
functions (enqueue.first_use_row, idempotency.complete_record, transition.history_row from
the machines, verifications.created_row / moved / send_rows), so both write the same thing
(tests/test_fast_paths.py writes each case both ways and compares the rows):

- a message: if its one recipient is not suppressed, the key's record (its answer
  included), the message and its history row, then the workers' NOTIFY;
- a verification: under the tenant's send lock (verifications.lock_sends), if the address
  is not suppressed, has no unfinished verification and is under both send limits, the
  key's record, the verification with the history of its two moves (created, then its
  first email enqueued), the send and the tenant's minute count, its email and the email's
  history row, then the NOTIFY.

On PostgreSQL each is one statement (data-modifying CTEs), the verification's sent with its
lock in one round trip (AsyncDatabase.run_at_once). The key is taken with ON CONFLICT DO
NOTHING, so a key in use (live, expired, or being written by a racing request, which the
INSERT waits for) writes nothing; MariaDB's ON DUPLICATE KEY cannot say whether it wrote,
so there a plain INSERT finds it taken (Conflict). A message an application enqueued with
the key, without a record, fails the message's unique index: Conflict, nothing written.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Insert, Integer, bindparam, func, insert, literal_column, select

from mailbag.database_url import Dialect
from mailbag.domain.message import NewMessage
from mailbag.domain.verification import UNFINISHED, VAction
from mailbag.store import chain, verifications
from mailbag.store.enqueue import FIRST_USE_COLUMNS, NOTIFY_CHANNEL
from mailbag.store.message_transitions import LAST_ERROR, MESSAGE_ROWS
from mailbag.store.plan import Plan, current_dialect
from mailbag.store.schema import email_verifications as ev
from mailbag.store.schema import idempotency_records as records
from mailbag.store.schema import (
    message_events,
    outbox_messages,
    suppressions,
    verification_events,
    verification_sends,
)
from mailbag.store.schema import verification_send_counts as counts
from mailbag.store.suppressions import forms as suppression_forms
from mailbag.store.transition import EventSpec, history_row
from mailbag.store.types import insert_unless_taken
from mailbag.store.verifications import VERIFICATION_ROWS


def takes_first_use(m: NewMessage) -> bool:
    """Whether a message is the common case `message` writes: a key, one recipient, no
    explicit `from` (a sender identity to check), no attachments."""
    return (
        m.idempotency_key is not None
        and m.from_address is None
        and not m.attachments
        and m.recipients.is_single
    )


def _taking_the_key(dialect: Dialect) -> Insert:
    if dialect == "mysql":
        return insert(records)  # a taken key: IntegrityError (see the module docstring)
    return insert_unless_taken(dialect, records, (records.c.tenant_id, records.c.idempotency_key))  # type: ignore[no-any-return]


def _history(table: Any) -> tuple[str, ...]:
    return tuple(c.name for c in table.columns if c.name != "id")  # the id is the table's


RECORD = chain.Write(
    "record",
    records,
    tuple(c.name for c in records.columns if c.name != "id"),
    insert=_taking_the_key,
    may_skip=True,
)
MESSAGE = chain.Write("message", outbox_messages, FIRST_USE_COLUMNS)
MESSAGE_HISTORY = chain.Write("message_history", message_events, _history(message_events))
VERIFICATION = chain.Write("verification", ev, tuple(c.name for c in ev.columns))
MOVES = chain.Write("moves", verification_events, _history(verification_events), rows=2)
SEND = chain.Write("send", verification_sends, _history(verification_sends))
COUNTED = chain.Write(
    "counted", counts, tuple(c.name for c in counts.columns), insert=verifications.counting
)

# The checks' parameters (chain.run's `values`).
TENANT = bindparam("tenant_id", type_=suppressions.c.tenant_id.type)
ADDRESS = bindparam("address", type_=suppressions.c.email.type)  # lower case, as suppressed
HASHED = bindparam(
    "hashed", type_=suppressions.c.email.type
)  # its erased form (suppressions.forms)
EMAIL = bindparam("email", type_=ev.c.email.type)
SINCE = bindparam("since", type_=verification_sends.c.at.type)
SINCE_MINUTE = bindparam("since_minute", type_=counts.c.minute.type)
PER_EMAIL = bindparam("per_email", type_=Integer())
PER_TENANT = bindparam("per_tenant", type_=Integer())

NOT_SUPPRESSED = chain.Check(
    "not_suppressed",
    ~select(suppressions.c.id)
    .where(suppressions.c.tenant_id == TENANT, suppressions.c.email.in_([ADDRESS, HASHED]))
    .exists(),
)
NO_UNFINISHED = chain.Check(
    "no_unfinished",
    ~select(ev.c.id)
    .where(verifications.of_address(TENANT, EMAIL), VERIFICATION_ROWS.in_states(UNFINISHED))
    .exists(),
)
EMAIL_UNDER_LIMIT = chain.Check(
    "email_under_limit",
    select(func.count()).where(verifications.sent_to(TENANT, SINCE, EMAIL)).scalar_subquery()
    < PER_EMAIL,
)
TENANT_UNDER_LIMIT = chain.Check(
    "tenant_under_limit",
    select(func.coalesce(func.sum(counts.c.n), literal_column("0")))
    .where(verifications.minutes_of(TENANT, SINCE_MINUTE))
    .scalar_subquery()
    < PER_TENANT,
)

MESSAGE_FIRST_USE = chain.Chain(
    checks=(NOT_SUPPRESSED,),
    writes=(RECORD, MESSAGE, MESSAGE_HISTORY),
    notify=NOTIFY_CHANNEL,
)
VERIFICATION_REQUEST = chain.Chain(
    checks=(NOT_SUPPRESSED, NO_UNFINISHED, EMAIL_UNDER_LIMIT, TENANT_UNDER_LIMIT),
    writes=(RECORD, VERIFICATION, MOVES, SEND, COUNTED, MESSAGE, MESSAGE_HISTORY),
    notify=NOTIFY_CHANNEL,
)


def message(
    row: Mapping[str, Any], record: Mapping[str, Any], *, now: datetime, actor: str
) -> Plan[bool]:
    """A key's first use by POST /v1/messages: its record, the message and the message's
    history row, unless the recipient is suppressed or the key taken.

    On PostgreSQL one statement, atomic by itself. `row` is enqueue.first_use_row's,
    `record` idempotency.complete_record's. False: nothing was written; Conflict (the
    session's): a message holds the key without a record, and nothing was written either."""
    history = history_row(MESSAGE_ROWS, row, None, at=now, actor=actor, event=LAST_ERROR)
    address, hashed = yield from suppression_forms(row["to_address"])
    return (
        yield from chain.run(
            MESSAGE_FIRST_USE,
            values={"tenant_id": row["tenant_id"], "address": address, "hashed": hashed},
            rows={"record": [record], "message": [row], "message_history": [history]},
        )
    )


def verification(
    created: Mapping[str, Any],
    values: Mapping[str, Any],
    message_row: Mapping[str, Any],
    record: Mapping[str, Any],
    *,
    since: datetime,
    per_email: int,
    per_tenant: int,
    now: datetime,
    actor: str,
    detail: str,
) -> Plan[bool]:
    """A key's first use by POST /v1/email-verifications: under the tenant's send lock, its
    record, the verification and its two moves' history, the send and its count, and its
    email with the email's history row, if the address may be sent a verification now.

    That is: not suppressed, no unfinished verification, and under both send limits
    (`per_email`, `per_tenant` sends since `since`). The verification is `created` (as
    verifications.create writes it) moved by ENQUEUE with `values` (verifications.moved);
    `message_row` is its email (enqueue.first_use_row). On PostgreSQL the lock and one
    statement, in one round trip. False, or Conflict: nothing was written."""
    enqueued = verifications.moved(created, VAction.ENQUEUE, values, now=now)
    moves = [
        history_row(VERIFICATION_ROWS, created, None, at=now, actor=actor, event=EventSpec()),
        history_row(
            VERIFICATION_ROWS,
            enqueued,
            created["state"],
            at=now,
            actor=actor,
            event=EventSpec(text=detail),
        ),
    ]
    send, minute = verifications.send_rows(
        tenant_id=enqueued["tenant_id"],
        email=enqueued["email"],
        verification_id=enqueued["id"],
        now=now,
    )
    address, hashed = yield from suppression_forms(message_row["to_address"])
    history = history_row(MESSAGE_ROWS, message_row, None, at=now, actor=actor, event=LAST_ERROR)
    return (
        yield from chain.run(
            VERIFICATION_REQUEST,
            values={
                "tenant_id": enqueued["tenant_id"],
                "address": address,
                "hashed": hashed,
                "email": enqueued["email"],
                "since": since,
                "since_minute": verifications.minute_of(since),
                "per_email": per_email,
                "per_tenant": per_tenant,
            },
            rows={
                "record": [record],
                "verification": [enqueued],
                "moves": moves,
                "send": [send],
                "counted": [minute],
                "message": [message_row],
                "message_history": [history],
            },
            before=verifications.lock_steps(enqueued["tenant_id"], (yield from current_dialect())),
        )
    )
