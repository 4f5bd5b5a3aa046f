"""Enqueueing: the outbox's front door, usable inside the caller's own transaction.

    with engine.begin() as conn:                 # the application's transaction
        conn.execute(insert(users).values(...))
        mailbag.enqueue(conn, to="ada@example.com", template="welcome",
                        data={"name": "Ada"}, idempotency_key=f"welcome-{user_id}")
        mailbag.enqueue(conn, to=["ada@example.com"], cc=["acct@example.com"],
                        subject="Invoice", html="<p>Attached.</p>",
                        attachments=[mailbag.Attachment("invoice.pdf", "application/pdf", pdf)])

Nothing here commits: the email exists exactly when the caller's transaction commits. A
duplicate idempotency key returns the message already there and leaves the transaction
usable. The same works with an `AsyncConnection` through `enqueue_async`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from mailbag import metrics, wakeup
from mailbag.clock import utcnow
from mailbag.domain.message import AddressInput, NewMessage, new_message
from mailbag.domain.policy import RetryPolicy
from mailbag.store import enqueue as store
from mailbag.store.enqueue import Enqueued
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncSession, Session

if TYPE_CHECKING:  # the asyncio extension brings in the ORM: sync callers never need it
    from sqlalchemy.ext.asyncio import AsyncConnection

DEFAULT_MAX_ATTEMPTS = RetryPolicy().max_attempts


def _plan(
    messages: Sequence[NewMessage],
    max_attempts: int,
    actor: str,
    now: datetime | None,
) -> Plan[list[Enqueued]]:
    return store.enqueue(
        messages,
        now=now or utcnow(),
        default_max_attempts=max_attempts,
        actor=actor,
    )


def count_created(results: list[Enqueued]) -> None:
    for result in results:
        if result.created:
            metrics.ENQUEUED.labels(metrics.template_label(result.message.template_name)).inc()


def _enqueued(results: list[Enqueued], conn: Connection) -> list[Enqueued]:
    """Count what was created and wake the workers once the caller commits it."""
    count_created(results)
    if any(r.created for r in results):
        wakeup.notify_after_commit(conn)
    return results


def enqueue_many(
    conn: Connection,
    messages: Sequence[NewMessage],
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    actor: str = "app",
    now: datetime | None = None,
) -> list[Enqueued]:
    results = Session(conn).run(_plan(messages, max_attempts, actor, now))
    return _enqueued(results, conn)


async def enqueue_many_async(
    conn: AsyncConnection,
    messages: Sequence[NewMessage],
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    actor: str = "app",
    now: datetime | None = None,
) -> list[Enqueued]:
    results = await AsyncSession(conn).run(_plan(messages, max_attempts, actor, now))
    return _enqueued(results, conn.sync_connection)  # type: ignore[arg-type]


def enqueue(
    conn: Connection,
    *,
    to: AddressInput | Sequence[AddressInput],
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    **fields: Any,
) -> Enqueued:
    """Validate one message and add it to the outbox in the caller's transaction. `fields`
    are `new_message`'s: a template with data, or ready-made subject/html/text; cc, bcc,
    reply_to, from_address, attachments (a list of `Attachment`), expires_at, priority,
    unsubscribe_url, idempotency_key, limits, ... Raises InvalidMessage (MessageTooLarge
    over a size limit) and writes nothing when a field is wrong."""
    message = new_message(to=to, **fields)
    return enqueue_many(conn, [message], max_attempts=max_attempts)[0]


async def enqueue_async(
    conn: AsyncConnection,
    *,
    to: AddressInput | Sequence[AddressInput],
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    **fields: Any,
) -> Enqueued:
    """`enqueue` on an AsyncConnection."""
    message = new_message(to=to, **fields)
    return (await enqueue_many_async(conn, [message], max_attempts=max_attempts))[0]
