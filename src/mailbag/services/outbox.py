"""Writing checked messages into the outbox, in the caller's transaction.

The messages come checked from services.intake, the one door from input to a NewMessage
(`mailbag.enqueue` and its siblings are there). Nothing here commits: an email exists
exactly when the caller's transaction commits. A duplicate idempotency key returns the
message already there and leaves the transaction usable. Once the caller commits a
message that was created, the workers are woken (wakeup.notify_after_commit).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from mailbag import metrics, wakeup
from mailbag.clock import utcnow
from mailbag.domain.erasure import ErasureKey
from mailbag.domain.message import NewMessage
from mailbag.domain.policy import RetryPolicy
from mailbag.services.templates import pinned
from mailbag.store import enqueue as store
from mailbag.store import sender_domains
from mailbag.store.enqueue import Enqueued as Enqueued  # what write_many answers, for its callers
from mailbag.store.plan import Plan, options_of
from mailbag.store.session import AsyncSession, Session
from mailbag.store.suppressions import ERASURE_KEY_OPTION
from mailbag.templates import builtin
from mailbag.templates.book import Book, book_of

if TYPE_CHECKING:  # the asyncio extension brings in the ORM: sync callers never need it
    from sqlalchemy.ext.asyncio import AsyncConnection

DEFAULT_MAX_ATTEMPTS = RetryPolicy().max_attempts


def _plan(
    messages: Sequence[NewMessage],
    book: Book,
    max_attempts: int,
    actor: str,
    now: datetime | None,
    ready_from: str | None,
) -> Plan[list[Enqueued]]:
    # Each message's template version, and one render of it: refused before anything is
    # written (a message pinned already, by the API before its first-use path, as it is).
    messages = yield from pinned(messages, book)
    if ready_from is not None:  # REQUIRE_READY_DOMAINS: refused before anything is written
        yield from sender_domains.require_ready(messages, ready_from)
    return (
        yield from store.enqueue(
            messages, now=now or utcnow(), default_max_attempts=max_attempts, actor=actor
        )
    )


def _builtin() -> Book:
    return book_of(builtin())


def count_created(results: list[Enqueued]) -> None:
    created = Counter(r.message.template_name for r in results if r.created)
    for template, count in created.items():  # one inc per template, not per message
        metrics.ENQUEUED.labels(metrics.template_label(template)).inc(count)


def _written(results: list[Enqueued], conn: Connection) -> list[Enqueued]:
    """Count what was created and wake the workers once the caller commits it."""
    count_created(results)
    if any(r.created for r in results):
        wakeup.notify_after_commit(conn)
    return results


def _erasure_option(options: Mapping[str, Any], key: ErasureKey | None) -> dict[str, Any]:
    """The erasure key an application's own connection lacks (store/suppressions.py): given
    it, enqueue refuses erased addresses there too. Nothing when it has one already."""
    if key is None or ERASURE_KEY_OPTION in options:
        return {}
    return {ERASURE_KEY_OPTION: key}


def write_many(
    conn: Connection,
    messages: Sequence[NewMessage],
    *,
    book: Book | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    actor: str = "app",
    now: datetime | None = None,
    ready_from: str | None = None,
    erasure_key: ErasureKey | None = None,
) -> list[Enqueued]:
    """Write messages services.intake checked (the store checks only what needs the
    database: suppressions, sender identities, idempotency keys, and with `ready_from`,
    Settings.ready_from, sender domains' readiness). `erasure_key`: the deployment's
    (Rules.erasure_key), for a connection mailbag did not make. `book`: the templates
    they render with (Rules.book; None: tenants' and the built-in ones); each message is
    pinned to its version there (services.templates.pinned) and rendered once."""
    if extra := _erasure_option(conn.get_execution_options(), erasure_key):
        conn.execution_options(**extra)  # in place: the caller's connection, one more option
    results = Session(conn).run(
        _plan(messages, book or _builtin(), max_attempts, actor, now, ready_from)
    )
    return _written(results, conn)


async def write_many_async(
    conn: AsyncConnection,
    messages: Sequence[NewMessage],
    *,
    book: Book | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    actor: str = "app",
    now: datetime | None = None,
    ready_from: str | None = None,
    erasure_key: ErasureKey | None = None,
) -> list[Enqueued]:
    """`write_many` on an AsyncConnection."""
    if extra := _erasure_option(options_of(conn), erasure_key):
        await conn.execution_options(**extra)
    plan = _plan(messages, book or _builtin(), max_attempts, actor, now, ready_from)
    results = await AsyncSession(conn).run(plan)
    return _written(results, conn.sync_connection)  # type: ignore[arg-type]
