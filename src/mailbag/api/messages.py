"""`/v1/messages`: send, read, list, cancel."""

from __future__ import annotations

import base64
import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from mailbag.api.deps import CallDep, KeyDep, NowDep, ServicesDep, TenantDep
from mailbag.api.problems import COMMON, documented
from mailbag.api.replay import replayed
from mailbag.api.schemas import (
    AttachmentIn,
    Mailbox,
    Mailboxes,
    MessageCreate,
    MessageOut,
    MessagePage,
)
from mailbag.domain.content import Address, Attachment, Limits, guess_content_type
from mailbag.domain.message import (
    ANY_ADDRESS,
    InvalidMessage,
    MessageTooLarge,
    NewMessage,
    normalize_address,
)
from mailbag.domain.states import Status
from mailbag.services import intake
from mailbag.services.container import Services

router = APIRouter(prefix="/v1/messages", tags=["messages"])
WHITESPACE = re.compile(r"\s+")
# A body's fields that new_message takes under the same name and as they are; the others
# (addresses, the sender, attachments) are converted in message_from.
CONVERTED = frozenset({"to", "cc", "bcc", "reply_to", "from_", "attachments"})
AS_GIVEN = tuple(sorted(set(MessageCreate.model_fields) - CONVERTED))


@router.post(
    "",
    status_code=201,
    response_model=MessageOut,
    response_model_by_alias=True,
    responses=documented(*COMMON, 409),
)
async def create_message(body: MessageCreate, call: CallDep, response: Response) -> Any:
    """Put an email into the outbox. With an Idempotency-Key, retries are safe: the same key
    and body replay the first answer (header `Idempotent-Replayed: true`); the same key with
    a different body is a 409. A message over the size limits is a 413 (message-too-large);
    any other invalid field a 422 naming it."""
    message = message_from(body, call.svc, tenant_id=call.tenant.id, key=call.key)
    result = await call.svc.messages.create(key=call.key, message=message, now=call.now)
    return replayed(result, response, "POST /v1/messages")


def message_from(
    body: MessageCreate, svc: Services, *, tenant_id: str, key: str | None
) -> NewMessage:
    """The message a request body asks for, through services.intake with the API's settings
    and templates (InvalidMessage, MessageTooLarge): POST /v1/messages and each item of a
    batch."""
    rules = intake.Rules.of(svc.settings, catalog=svc.catalog)
    return rules.message(
        **{name: getattr(body, name) for name in AS_GIVEN},
        to=_mailboxes(body.to) or [],
        cc=_mailboxes(body.cc),
        bcc=_mailboxes(body.bcc),
        reply_to=_mailboxes(body.reply_to),
        from_address=body.from_,
        attachments=_attachments(body.attachments, rules.limits),
        tenant_id=tenant_id,
        idempotency_key=key,
    )


def _listed(value: Mailboxes | None) -> list[Mailbox]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _mailboxes(value: Mailboxes | None) -> str | list[str | Address] | None:
    if value is None or isinstance(value, str):  # a single string: `to_name` may name it
        return value
    return [m if isinstance(m, str) else Address(m.address, m.name) for m in _listed(value)]


def _attachments(given: list[AttachmentIn], limits: Limits) -> list[Attachment]:
    """The attachments with their bytes. Base64 is checked strictly (only line breaks are
    ignored): a lenient decoder would send other bytes than the caller meant."""
    found = []
    for index, item in enumerate(given):
        where = f"attachments[{index}]"
        # An upper bound of the decoded size, before decoding what may be far too large.
        if len(item.content) * 3 // 4 > limits.max_attachment_bytes + 3:
            raise MessageTooLarge(
                {
                    "attachments": f"{where} ({item.filename!r}) is larger than the limit for "
                    f"one attachment, {limits.max_attachment_bytes} bytes"
                }
            )
        try:
            content = base64.b64decode(WHITESPACE.sub("", item.content), validate=True)
        except ValueError:  # binascii.Error, or a character that is not ASCII
            raise InvalidMessage(
                {"attachments": f"{where}.content is not valid base64 (RFC 4648)"}
            ) from None
        content_type = item.content_type or guess_content_type(item.filename)
        found.append(Attachment(item.filename, content_type, content, item.content_id))
    return found


@router.get(
    "/{message_id}",
    response_model=MessageOut,
    response_model_by_alias=True,
    responses=documented(*COMMON, 404),
)
async def get_message(message_id: uuid.UUID, svc: ServicesDep, tenant: TenantDep) -> Any:
    """The message and its full event history."""
    return await svc.messages.get(tenant_id=tenant.id, message_id=message_id)


@router.get("", response_model=MessagePage, responses=documented(*COMMON))
async def list_messages(
    svc: ServicesDep,
    tenant: TenantDep,
    status: Status | None = None,
    to: Annotated[str | None, Query(max_length=255)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(max_length=100)] = None,
) -> Any:
    """Newest first; pass `next_cursor` back as `cursor` for the next page."""
    try:
        recipient = normalize_address(to, ANY_ADDRESS) if to else None
    except ValueError as exc:
        raise InvalidMessage({"to": f"is not a valid email address: {exc}"}) from None
    return await svc.messages.list(
        tenant_id=tenant.id, status=status, to=recipient, limit=limit, cursor=cursor
    )


@router.post(
    "/{message_id}/cancel", response_model=MessageOut, responses=documented(*COMMON, 404, 409)
)
async def cancel_message(
    message_id: uuid.UUID, svc: ServicesDep, tenant: TenantDep, key: KeyDep, now: NowDep
) -> Any:
    """Withdraw a pending message (409 once a worker has taken it)."""
    return await svc.messages.cancel(tenant_id=tenant.id, message_id=message_id, now=now)
