"""The email-verification workflow: request, send, confirm, resend, expire.

A request creates a verification row (the token's digest only) and its outbox message
(only a reference to the send: the worker derives the token from the deployment key when
it renders the email) in one transaction, under the caller's Idempotency-Key. The row then
follows its message (see store.verifications).

Every request and resend of a tenant first takes the tenant's send lock (see
store.verifications.lock_sends): the send limits are counted and spent by one transaction
at a time, and each resend rotates from the send number it read, so the stored digest is
always the newest email's.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from mailbag import wakeup
from mailbag.domain.ids import uuid7
from mailbag.domain.message import Filter, NewMessage
from mailbag.domain.states import Status
from mailbag.domain.verification import (
    ACTIVE,
    FINAL,
    MAX_CONFIRM_ATTEMPTS,
    UNFINISHED,
    EmailReference,
    VAction,
    VState,
    digest,
    matches,
)
from mailbag.services import intake, templates
from mailbag.services import outbox as outbox_service
from mailbag.services.idempotency import Response, execute, fingerprint
from mailbag.settings import Settings
from mailbag.store import enqueue as enqueue_store
from mailbag.store import first_use, operator
from mailbag.store import idempotency as idempotency_store
from mailbag.store import verifications as store
from mailbag.store.enqueue import Enqueued
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase, AsyncSession, Conflict
from mailbag.store.verifications import Verification, VerificationFilter

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

ACTOR = "api"
# How often a resend that lost a race for its send number starts again (the tenant's send
# lock makes that rare: only where the database has no row to lock).
RESEND_TRIES = 3


class VerificationError(Exception):
    pass


def _enqueued_detail(send_number: int) -> str:
    return f"email {send_number} enqueued"


class ActiveVerificationExists(VerificationError):
    def __init__(self, verification_id: uuid.UUID) -> None:
        self.verification_id = verification_id
        super().__init__(f"an active verification for this email exists: {verification_id}")


class RateLimited(VerificationError):
    def __init__(self, retry_after: int, scope: str) -> None:
        self.retry_after, self.scope = retry_after, scope
        super().__init__(f"too many verification emails for this {scope}; retry in {retry_after} s")


class RotatedMeanwhile(RateLimited):
    """Another resend rotated the token first; answered 429 with a short Retry-After."""

    def __init__(self) -> None:
        super().__init__(1, "verification")


class NotFound(VerificationError):
    pass


class Expired(VerificationError):
    pass


class Locked(VerificationError):
    pass


class AlreadyFinished(VerificationError):
    def __init__(self, state: VState) -> None:
        self.state = state
        super().__init__(f"the verification is {state.value}")


class WrongToken(VerificationError):
    def __init__(self, attempts_left: int) -> None:
        self.attempts_left = attempts_left
        super().__init__(f"the token does not match; {attempts_left} attempt(s) left")


@dataclass(frozen=True)
class VerificationRequest:
    email: str  # normalized
    template: str
    redirect_url: str | None
    data: dict[str, Any]
    locale: str | None = None  # BCP 47, canonical case

    def fingerprint(self, operation: str) -> str:
        fields = {
            "email": self.email.casefold(),
            "template": self.template,
            "redirect_url": self.redirect_url,
            "data": self.data,
        }
        if self.locale is not None:  # unset: an old record's fingerprint stays the same
            fields["locale"] = self.locale
        return fingerprint(operation, fields)


def public(v: Verification) -> dict[str, Any]:
    """What the API shows: never the token or its digest."""
    return {
        "id": str(v.id),
        "email": v.email,
        "state": v.state.value,
        "expires_at": v.expires_at.isoformat(),
        "created_at": v.created_at.isoformat(),
        "updated_at": v.updated_at.isoformat(),
        "sent_at": v.sent_at.isoformat() if v.sent_at else None,
        "verified_at": v.verified_at.isoformat() if v.verified_at else None,
        "send_count": v.send_count,
        "message_id": str(v.message_id) if v.message_id else None,
        "locale": v.locale,
    }


class Verifications:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.db, self.settings = AsyncDatabase(engine), settings
        # Raises MissingSecretKey now, so an API without the key refuses to start.
        self.tokens = settings.verification_tokens
        self.book = intake.book(settings)

    @property
    def ttl(self) -> timedelta:
        return timedelta(minutes=self.settings.verification_ttl_minutes)

    async def request(
        self, *, tenant_id: str, key: str, request: VerificationRequest, now: datetime
    ) -> Response:
        operation = "POST /v1/email-verifications"
        if self.settings.ready_from is None:  # the gate's check is the general path's
            done = await self._first_use(tenant_id, key, request, now, operation)
            if done is not None:
                return done

        async def work(tx: AsyncSession) -> Response:
            email = request.email
            await tx.run(store.lock_sends(tenant_id))
            await tx.run(
                store.transition(
                    VAction.EXPIRE,
                    now=now,
                    actor=ACTOR,
                    where=VerificationFilter(tenant_id=tenant_id, email=email, expired_by=now),
                    detail="expired before a new request",
                ),
            )
            active = await tx.run(store.active_for(tenant_id, email))
            if active is not None:
                raise ActiveVerificationExists(active.id)
            await self._check_limits(tx, tenant_id, email, now)
            verification = await tx.run(
                store.create(self._new(tenant_id, request, uuid7(), now), now=now, actor=ACTOR)
            )
            sent = await self._send(tx, verification, request.data, now, VAction.ENQUEUE)
            return Response(201, public(sent), str(sent.id))

        try:
            return await execute(
                self.db,
                tenant_id=tenant_id,
                key=key,
                operation=operation,
                request_fingerprint=request.fingerprint(operation),
                now=now,
                ttl=timedelta(hours=self.settings.idempotency_ttl_hours),
                work=work,
            )
        except Conflict:
            # A concurrent request for the same email (another key) made its verification
            # first: the active-email unique index said so. Name it.
            async with self.db.connect() as tx:
                active = await tx.run(store.active_for(tenant_id, request.email))
            if active is None:
                raise
            raise ActiveVerificationExists(active.id) from None

    async def resend(
        self, *, tenant_id: str, key: str, verification_id: uuid.UUID, now: datetime
    ) -> Response:
        operation = f"POST /v1/email-verifications/{verification_id}/resend"

        async def work(tx: AsyncSession) -> Response:
            await tx.run(store.lock_sends(tenant_id))
            v = await self._fresh(tx, tenant_id, verification_id, now)
            if v.state in FINAL:
                raise AlreadyFinished(v.state)
            if v.state not in ACTIVE:  # a failed one: resending makes it active again
                active = await tx.run(store.active_for(tenant_id, v.email))
                if active is not None:  # but a newer request has the address now
                    raise ActiveVerificationExists(active.id)
            await self._check_limits(tx, tenant_id, v.email, now)
            if v.message_id is not None:  # the old email, if still unsent, is withdrawn
                which = Filter(ids=[v.message_id])
                await tx.run(operator.cancel(where=which, now=now, actor=ACTOR))
            sent = await self._send(tx, v, {}, now, VAction.RESEND)
            return Response(200, public(sent), str(sent.id))

        for _ in range(RESEND_TRIES - 1):
            try:
                return await self._execute(tenant_id, key, operation, now, work)
            except RotatedMeanwhile:
                continue  # everything it wrote was rolled back: read again, rotate again
        return await self._execute(tenant_id, key, operation, now, work)

    async def _execute(
        self,
        tenant_id: str,
        key: str,
        operation: str,
        now: datetime,
        work: Callable[[AsyncSession], Awaitable[Response]],
    ) -> Response:
        return await execute(
            self.db,
            tenant_id=tenant_id,
            key=key,
            operation=operation,
            request_fingerprint=fingerprint(operation, {}),
            now=now,
            ttl=timedelta(hours=self.settings.idempotency_ttl_hours),
            work=work,
        )

    async def _send(
        self,
        tx: AsyncSession,
        v: Verification,
        data: dict[str, Any],
        now: datetime,
        action: VAction,
    ) -> Verification:
        """Rotate the token, enqueue its email and move the verification to send_pending.

        The email stores only which send it is; its token is derived again when it is
        rendered. Raises RotatedMeanwhile if another transaction rotated since `v` was read.
        """
        send_number = v.send_count + 1
        email = self._email(
            v.id,
            v.tenant_id,
            v.email,
            v.template_name,
            v.redirect_url,
            v.expires_at,
            send_number,
            data,
            v.locale,
        )
        message = await tx.run(self._pinned(email, v.id, send_number))
        (enqueued,) = await outbox_service.write_many_async(
            tx.connection,
            [message],
            book=self.book,
            max_attempts=self.settings.max_attempts,
            actor=ACTOR,
            now=now,
            ready_from=self.settings.ready_from,
        )
        rotated = await tx.run(
            store.transition(
                action,
                # Only from the send number read: two rotations can never both apply.
                where=VerificationFilter(id=v.id, send_count=v.send_count),
                now=now,
                actor=ACTOR,
                values=self._rotation(v.id, send_number, enqueued.message.id),
                detail=_enqueued_detail(send_number),
            ),
        )
        if not rotated:
            raise RotatedMeanwhile()
        (moved,) = rotated
        if enqueued.message.status == Status.FAILED:
            # A suppressed address: the outbox failed the email at once; so does this.
            (moved,) = await tx.run(
                store.transition(
                    VAction.MESSAGE_FAILED,
                    where=VerificationFilter(id=v.id),
                    now=now,
                    actor=ACTOR,
                    detail=enqueued.message.last_error,
                ),
            )
            return moved
        await tx.run(
            store.record_send(tenant_id=v.tenant_id, email=v.email, verification_id=v.id, now=now),
        )
        return moved

    def _email(
        self,
        verification_id: uuid.UUID,
        tenant_id: str,
        email: str,
        template: str,
        redirect_url: str | None,
        expires_at: datetime,
        send_number: int,
        data: dict[str, Any],
        locale: str | None,
    ) -> NewMessage:
        """The email of a verification's send, through services.intake (it carries the
        send's reference, not the token: the worker derives that when it renders)."""
        reference = EmailReference(verification_id, send_number, redirect_url)
        return intake.Rules.of(self.settings).message(
            to=email,
            template=template,
            tenant_id=tenant_id,
            idempotency_key=f"verification:{verification_id}:{send_number}",
            data={**data, "email": email, "expires_at": expires_at.strftime("%Y-%m-%d %H:%M UTC")},
            metadata=reference.metadata(),
            locale=locale,
        )

    def _pinned(self, email: NewMessage, verification_id: uuid.UUID, send: int) -> Plan[NewMessage]:
        """The email with its template version, rendered once with the token and link the
        worker will derive (never stored)."""
        reference = EmailReference.from_metadata(email.metadata)
        assert reference is not None
        secrets = reference.secrets(self.tokens.token(verification_id, send))
        (pinned,) = yield from templates.pinned([email], self.book, [secrets])
        return pinned

    def _new(
        self,
        tenant_id: str,
        request: VerificationRequest,
        verification_id: uuid.UUID,
        now: datetime,
    ) -> dict[str, Any]:
        """What a request creates its verification with (store.verifications.create)."""
        return {
            "id": verification_id,
            "tenant_id": tenant_id,
            "email": request.email,
            "token_digest": "",
            "expires_at": now + self.ttl,
            "message_id": None,
            "template_name": request.template,
            "redirect_url": request.redirect_url,
            "locale": request.locale,
        }

    def _rotation(
        self, verification_id: uuid.UUID, send_number: int, message_id: uuid.UUID
    ) -> dict[str, Any]:
        """What a send (the first, or a resend) moves its verification with: the new
        token's digest, the email, the send number, no wrong tokens yet."""
        return {
            "token_digest": digest(self.tokens.token(verification_id, send_number)),
            "message_id": message_id,
            "send_count": send_number,
            "confirm_attempts": 0,
        }

    async def _first_use(
        self, tenant_id: str, key: str, request: VerificationRequest, now: datetime, operation: str
    ) -> Response | None:
        """A key's first use (store.first_use.verification): under the tenant's send lock,
        the verification, its email and the key's record; on PostgreSQL the lock and one
        statement in one round trip. None: it wrote nothing (an unfinished verification
        for the address, a send limit, a suppressed address, a used key); the general
        path decides that case."""
        created = store.created_row(self._new(tenant_id, request, uuid7(), now), now=now)
        message = self._email(
            created["id"],
            tenant_id,
            request.email,
            request.template,
            request.redirect_url,
            created["expires_at"],
            1,
            request.data,
            request.locale,
        )
        # Autocommit, as Messages.create pins: no BEGIN and ROLLBACK around the reads.
        async with self.db.connect(read_only=True, autocommit=True) as tx:
            message = await tx.run(self._pinned(message, created["id"], 1))
        message_row = enqueue_store.first_use_row(message, now, self.settings.max_attempts)
        values = self._rotation(created["id"], 1, message_row["id"])
        made = store.verification_of(store.moved(created, VAction.ENQUEUE, values, now=now))
        response = Response(201, public(made), str(made.id))
        record = idempotency_store.complete_record(
            tenant_id=tenant_id,
            key=key,
            operation=operation,
            fingerprint=request.fingerprint(operation),
            now=now,
            expires_at=now + timedelta(hours=self.settings.idempotency_ttl_hours),
            resource_id=response.resource_id,
            status=response.status,
            body=response.body,
        )
        plan = first_use.verification(
            created,
            values,
            message_row,
            record,
            since=now - timedelta(hours=1),
            per_email=self.settings.verification_sends_per_email_per_hour,
            per_tenant=self.settings.verification_sends_per_tenant_per_hour,
            now=now,
            actor=ACTOR,
            detail=_enqueued_detail(1),
        )
        try:
            written = await self.db.run_at_once(plan)
        except Conflict:
            written = False  # a unique index: another row was first; nothing was written
        if not written:
            return None
        email = enqueue_store.first_use_message(message_row, message)
        outbox_service.count_created([Enqueued(email, True)])
        wakeup.notify()  # committed already
        return response

    async def _check_limits(
        self, tx: AsyncSession, tenant_id: str, email: str, now: datetime
    ) -> None:
        hour = timedelta(hours=1)
        for scope, limit, counting in (
            (
                "email",
                self.settings.verification_sends_per_email_per_hour,
                store.sends_since(tenant_id, now - hour, email),
            ),
            (
                "tenant",
                self.settings.verification_sends_per_tenant_per_hour,
                store.tenant_sends_since(tenant_id, now - hour),  # per-minute counts
            ),
        ):
            count, oldest = await tx.run(counting)
            if count >= limit:
                wait = (oldest + hour - now) if oldest else hour
                raise RateLimited(max(1, int(wait.total_seconds()) + 1), scope)

    async def _fresh(
        self, tx: AsyncSession, tenant_id: str, verification_id: uuid.UUID, now: datetime
    ) -> Verification:
        """The verification, moved to `expired` first if its time is up."""
        v = await tx.run(store.get(verification_id, tenant_id))
        if v is None:
            raise NotFound(str(verification_id))
        if v.state in UNFINISHED and v.expires_at <= now:
            expired = await tx.run(
                store.transition(
                    VAction.EXPIRE,
                    where=VerificationFilter(id=v.id),
                    now=now,
                    actor=ACTOR,
                    detail="token expired",
                ),
            )
            # Nothing moved: another request finished it meanwhile; read what it did.
            v = expired[0] if expired else await tx.run(store.get(v.id, tenant_id))
            assert v is not None  # rows are never deleted while their tenant's requests run
        return v

    async def get(
        self, *, tenant_id: str, verification_id: uuid.UUID, now: datetime
    ) -> Verification:
        async with self.db.transaction() as tx:
            return await self._fresh(tx, tenant_id, verification_id, now)

    async def confirm(
        self, *, tenant_id: str, verification_id: uuid.UUID, token: str, now: datetime
    ) -> Verification:
        async with self.db.transaction() as tx:
            v = await self._fresh(tx, tenant_id, verification_id, now)
            if v.state is VState.VERIFIED:
                if matches(token, v.token_digest):
                    return v  # confirming twice is fine
                raise WrongToken(0)
            if v.state is VState.EXPIRED:
                raise Expired(str(v.id))
            if v.confirm_attempts >= MAX_CONFIRM_ATTEMPTS:
                raise Locked(str(v.id))
            if matches(token, v.token_digest):
                moved = await tx.run(
                    store.transition(
                        VAction.CONFIRM,
                        now=now,
                        actor=ACTOR,
                        where=VerificationFilter(
                            id=v.id,
                            token_digest=v.token_digest,
                            confirm_attempts_below=MAX_CONFIRM_ATTEMPTS,
                        ),
                        values={"verified_at": now},
                        detail="token confirmed",
                    ),
                )
                if moved:
                    return moved[0]
                # Another request changed it meanwhile: a resend rotated the token (this
                # one is now wrong), a confirmation won, or wrong tokens used up the tries.
                latest = await tx.run(store.get(v.id, tenant_id))
                assert latest is not None
                if latest.state is VState.VERIFIED and matches(token, latest.token_digest):
                    return latest
                if latest.token_digest != v.token_digest:
                    raise WrongToken(max(0, MAX_CONFIRM_ATTEMPTS - latest.confirm_attempts))
                raise Locked(str(v.id))
            # A wrong token: count it, committed, before answering.
            await tx.run(store.count_wrong_token(v.id, now))
        raise WrongToken(max(0, MAX_CONFIRM_ATTEMPTS - v.confirm_attempts - 1))
