"""Writing to the outbox on Django's connection: one door for the email backend, and
`enqueue` for what an EmailMessage cannot say (a mailbag template with its data, a
priority, an expiry: everything `mailbag.enqueue` takes).

    from mailbag.django import enqueue

    with transaction.atomic():
        user = User.objects.create(...)
        enqueue(to=user.email, template="welcome", data={"name": user.first_name},
                idempotency_key=f"welcome-{user.pk}")

Both write in `transaction.atomic(using=alias)` (a savepoint inside the caller's
transaction, a transaction of its own outside one) and wake this process's idle workers
when Django commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction

from mailbag import wakeup
from mailbag.django import conf
from mailbag.django.connection import on_django_connection
from mailbag.domain.message import AddressInput, NewMessage
from mailbag.services.intake import Rules
from mailbag.services.outbox import write_many
from mailbag.store.enqueue import Enqueued

ACTOR = "django"  # the actor of the outbox events these enqueues write


def write(
    alias: str, messages: Sequence[NewMessage], *, max_attempts: int, rules: Rules
) -> list[Enqueued]:
    """Messages services.intake checked (under `rules`) into the outbox of Django's
    database `alias`, in its transaction."""
    with transaction.atomic(using=alias), on_django_connection(alias) as conn:
        results = write_many(
            conn,
            messages,
            max_attempts=max_attempts,
            actor=ACTOR,
            erasure_key=rules.erasure_key,
            ready_from=rules.ready_from,
            book=rules.book,
        )
        if any(result.created for result in results):
            # Not wakeup.notify_after_commit: SQLAlchemy never sees Django's commit.
            transaction.on_commit(wakeup.notify, using=alias)
    return results


def enqueue(
    *,
    to: AddressInput | Sequence[AddressInput],
    using: str | None = None,
    tenant: str | None = None,
    max_attempts: int | None = None,
    **fields: Any,
) -> Enqueued:
    """`mailbag.enqueue` on Django's connection for `using` (default MAILBAG['DATABASE']),
    in the caller's transaction. `fields` are `new_message`'s (template and data, or
    subject/html/text; cc, bcc, attachments, priority, expires_at, idempotency_key, ...),
    checked as `mailbag.enqueue` and the API check them, under the settings the worker has
    (the provider's limits and address rules, its templates, a render with `data`). Raises
    InvalidMessage and writes nothing when a field is wrong."""
    alias = conf.database_alias(using)
    config = conf.mailbag_settings(alias)
    rules = Rules.of(config)
    message = rules.message(to=to, tenant_id=conf.tenant(tenant), **fields)
    attempts = max_attempts or config.max_attempts
    return write(alias, [message], max_attempts=attempts, rules=rules)[0]
