"""Messages through the API: create (idempotent), read with history, list, cancel."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from mailbag import wakeup
from mailbag.domain.content import Priority
from mailbag.domain.message import Filter, Message, NewMessage
from mailbag.domain.states import Status
from mailbag.services import intake
from mailbag.services import outbox as outbox_service
from mailbag.services.idempotency import Response, execute, fingerprint
from mailbag.services.templates import pinned
from mailbag.settings import Settings
from mailbag.store import attachments as attachment_store
from mailbag.store import enqueue as enqueue_store
from mailbag.store import first_use, operator
from mailbag.store import idempotency as idempotency_store
from mailbag.store import messages as store
from mailbag.store.enqueue import Enqueued
from mailbag.store.first_use import takes_first_use
from mailbag.store.session import AsyncDatabase, AsyncSession, Conflict

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

ACTOR = "api"
MAX_PAGE = 100


class MessageNotFound(Exception):
    pass


class NotCancellable(Exception):
    def __init__(self, status: str) -> None:
        self.status = status
        super().__init__(f"only pending messages can be cancelled; this one is {status}")


class InvalidCursor(ValueError):
    pass


def public(m: Message, events: list[Any] | None = None) -> dict[str, Any]:
    """A message as the API shows it: no claim token, and no secret template fields."""
    secret = set(m.metadata.get("secret_fields", [])) if isinstance(m.metadata, dict) else set()
    body: dict[str, Any] = {
        "id": str(m.id),
        "status": m.status,
        "to": m.to_address,
        "to_name": m.to_name,
        "recipients": m.all_recipients.as_json(),
        "reply_to": [a.as_json() for a in m.reply_to],
        "from": m.from_address,
        "from_name": m.from_name,
        "template": m.template_name,
        # The tenant's template version it renders with (None: a file template) and its
        # locale; the locale it asked for.
        "template_version": m.template_version,
        "template_locale": m.template_locale,
        "locale": m.locale,
        "ready_made": m.ready_made,
        "has_html": m.html is not None,
        "has_text": m.text is not None,
        "subject": m.subject,
        "data": {k: ("[redacted]" if k in secret else v) for k, v in m.template_data.items()},
        "attachments": [
            {
                "filename": a.filename,
                "content_type": a.content_type,
                "size": a.size,
                "sha256": a.sha256,
                "content_id": a.content_id,
            }
            for a in m.attachments
        ],
        "tags": list(m.tags),
        "metadata": dict(m.metadata),
        "headers": dict(m.headers),
        "priority": Priority(m.priority).label,
        "bulk": m.bulk,
        "expires_at": m.expires_at.isoformat() if m.expires_at else None,
        "unsubscribe_url": m.unsubscribe_url,
        "unsubscribe_mailto": m.unsubscribe_mailto,
        "suppressed": list(m.suppressed),
        "attempt_count": m.attempt_count,
        "max_attempts": m.max_attempts,
        "next_attempt_at": m.next_attempt_at.isoformat(),
        "created_at": m.created_at.isoformat(),
        "updated_at": m.updated_at.isoformat(),
        "sent_at": m.sent_at.isoformat() if m.sent_at else None,
        "provider": m.provider,
        "provider_message_id": m.provider_message_id,
        "last_error": m.last_error,
    }
    if events is not None:
        body["events"] = [
            {
                "from": e.from_status,
                "to": e.to_status,
                "at": e.at.isoformat(),
                "actor": e.actor,
                "attempt": e.attempt,
                "provider_message_id": e.provider_message_id,
                "detail": e.detail,
            }
            for e in events
        ]
    return body


def message_fingerprint(message: NewMessage) -> str:
    """What makes two requests the same message: every field, attachments by their content's
    hash (with name, type and content id). A single recipient keeps the form fingerprints had
    before recipients could be several, so records made then still match."""
    r = message.recipients
    fields: dict[str, Any] = {
        "to": message.to_address.casefold(),
        "to_name": message.to_name,
        "template": message.template_name,
        "data": message.template_data,
        "subject": message.subject,
        "send_at": message.send_at,
        "tags": list(message.tags),
        "metadata": message.metadata,
        "headers": message.headers,
    }
    if not r.is_single:
        fields["recipients"] = {
            kind: [(a.address.casefold(), a.name) for a in group]
            for kind, group in (("to", r.to), ("cc", r.cc), ("bcc", r.bcc))
        }
    extra: dict[str, Any] = {
        "reply_to": [(a.address.casefold(), a.name) for a in message.reply_to],
        "from": message.from_address.casefold() if message.from_address else None,
        "from_name": message.from_name,
        "html": message.html,
        "text": message.text,
        "attachments": [
            (a.filename, a.content_type, a.sha256, a.content_id) for a in message.attachments
        ],
        "expires_at": message.expires_at,
        "priority": int(message.priority),
        "bulk": message.bulk,
        "unsubscribe_url": message.unsubscribe_url,
        "unsubscribe_mailto": message.unsubscribe_mailto,
        "locale": message.locale,
    }
    # Unset new fields are left out: an old record's fingerprint stays the same.
    fields.update({k: v for k, v in extra.items() if v not in (None, [], 0)})
    return fingerprint("POST /v1/messages", fields)


class Messages:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.db, self.settings = AsyncDatabase(engine), settings

    async def create(
        self, *, key: str | None, message: NewMessage, now: datetime, actor: str = ACTOR
    ) -> Response:
        """Enqueue `message` under Idempotency-Key `key` (the API's rules: the same key and
        message replay the first answer, another message is KeyReused); `actor` is who the
        history says enqueued it (the API, or the CLI's `enqueue --key`)."""
        request_fingerprint = message_fingerprint(message)
        ttl = timedelta(hours=self.settings.idempotency_ttl_hours)
        book = intake.book(self.settings)
        if message.template_name is not None and message.pin is None:
            # Its template version, before either path writes it (the first use is one
            # statement): the one current now, in its locale. Autocommit: the current ids
            # are one statement, and a version's row never changes once published.
            async with self.db.connect(read_only=True, autocommit=True) as tx:
                (message,) = await tx.run(pinned([message], book))
        ready_from = self.settings.ready_from  # its check is the general path's
        if key is not None and ready_from is None and takes_first_use(message):
            first = await self._first_use(key, message, request_fingerprint, now, ttl, actor)
            if first is not None:
                return first

        async def work(tx: AsyncSession) -> Response:
            (enqueued,) = await outbox_service.write_many_async(
                tx.connection,
                [message],
                book=book,
                max_attempts=self.settings.max_attempts,
                actor=actor,
                now=now,
                ready_from=ready_from,
            )
            return Response(201, public(enqueued.message), str(enqueued.message.id))

        return await execute(
            self.db,
            tenant_id=message.tenant_id,
            key=key,
            operation="POST /v1/messages",
            request_fingerprint=request_fingerprint,
            now=now,
            ttl=ttl,
            work=work,
        )

    async def _first_use(
        self,
        key: str,
        message: NewMessage,
        request_fingerprint: str,
        now: datetime,
        ttl: timedelta,
        actor: str,
    ) -> Response | None:
        """A key's first use: record, message and history (store.first_use.message; on
        PostgreSQL one statement). None: nothing was written (the key is in use, the
        recipient suppressed, ...); the general path decides that case."""
        row = enqueue_store.first_use_row(message, now, self.settings.max_attempts)
        made = enqueue_store.first_use_message(row, message)
        response = Response(201, public(made), str(made.id))
        record = idempotency_store.complete_record(
            tenant_id=message.tenant_id,
            key=key,
            operation="POST /v1/messages",
            fingerprint=request_fingerprint,
            now=now,
            expires_at=now + ttl,
            resource_id=response.resource_id,
            status=response.status,
            body=response.body,
        )
        try:
            kept = await self.db.run_at_once(first_use.message(row, record, now=now, actor=actor))
        except Conflict:
            kept = False  # a message without a record holds the key
        if not kept:
            return None
        outbox_service.count_created([Enqueued(made, True)])
        wakeup.notify()  # committed already
        return response

    async def get(self, *, tenant_id: str, message_id: uuid.UUID) -> dict[str, Any]:
        async with self.db.connect() as tx:
            message = await tx.run(store.get(message_id, tenant_id))
            if message is None:
                raise MessageNotFound(str(message_id))
            events = await tx.run(store.events(message_id))
        return public(message, events)

    async def list(
        self,
        *,
        tenant_id: str,
        status: Status | None,
        to: str | None,
        limit: int,
        cursor: str | None,
    ) -> dict[str, Any]:
        limit = max(1, min(limit, MAX_PAGE))
        before = decode_cursor(cursor) if cursor is not None else None
        which = Filter(tenant_id=tenant_id, status=status, to=to)
        async with self.db.connect() as tx:
            items, more = await tx.run(store.page(which, limit=limit, before=before))
        return {
            "items": [public(m) for m in items],
            "next_cursor": encode_cursor(items[-1].id) if more and items else None,
        }

    async def cancel(
        self, *, tenant_id: str, message_id: uuid.UUID, now: datetime
    ) -> dict[str, Any]:
        which = Filter(ids=[message_id], tenant_id=tenant_id)
        async with self.db.transaction() as tx:
            changed = await tx.run(operator.cancel(where=which, now=now, actor=ACTOR))
            if changed:
                (cancelled,) = await tx.run(attachment_store.attached([changed[0].message]))
                return public(cancelled)
            current = await tx.run(store.get(message_id, tenant_id))
        if current is None:
            raise MessageNotFound(str(message_id))
        raise NotCancellable(current.status)


def encode_cursor(message_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(message_id.bytes).decode().rstrip("=")


def decode_cursor(cursor: str) -> uuid.UUID:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return uuid.UUID(bytes=raw)
    except (binascii.Error, ValueError) as exc:
        raise InvalidCursor("cursor is not one this API gave out") from exc
