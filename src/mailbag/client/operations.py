"""Each API operation as a plan (client/core.py): the request it makes and the model it
returns. The sync and async clients expose these same functions, signatures and
docstrings included (client/clients.py), so each operation is written here only."""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

import httpx

from mailbag.client.core import Core, Plan, new_idempotency_key
from mailbag.client.errors import NotCancellable
from mailbag.client.models import (
    Address,
    Attachment,
    BatchResult,
    Message,
    MessagePage,
    MessageStatus,
    Priority,
    Verification,
)

R = TypeVar("R")
P = ParamSpec("P")

MAX_PAGE_SIZE = 100  # the most messages GET /v1/messages answers per page (its `limit`)

# One address as a string or an Address, or a list of them.
Mailbox = str | Address
Mailboxes = Mailbox | Sequence[Mailbox]


def _mailboxes(value: Mailboxes) -> str | list[Any]:
    def one(mailbox: Mailbox) -> Any:
        if isinstance(mailbox, Address):
            return mailbox.model_dump(exclude_none=True)
        return mailbox

    if isinstance(value, str):  # a single string: `to_name` may name it
        return value
    return [one(m) for m in ([value] if isinstance(value, Address) else value)]


def _id(value: str | uuid.UUID) -> str:
    return quote(str(value), safe="")


def _replayed(response: httpx.Response) -> bool:
    return bool(response.headers.get("Idempotent-Replayed") == "true")


@dataclass(frozen=True)
class Draft:
    """An email as POST /v1/messages takes it (`body`), and its idempotency key: what
    `draft()` makes and `send_batch` takes."""

    body: dict[str, Any]
    idempotency_key: str | None = None


def draft(
    to: Mailboxes,
    *,
    to_name: str | None = None,
    cc: Mailboxes | None = None,
    bcc: Mailboxes | None = None,
    reply_to: Mailboxes | None = None,
    from_address: str | None = None,
    from_name: str | None = None,
    template: str | None = None,
    data: Mapping[str, Any] | None = None,
    locale: str | None = None,
    subject: str | None = None,
    html: str | None = None,
    text: str | None = None,
    inline_css: bool = False,
    attachments: Sequence[Attachment] = (),
    send_at: datetime | None = None,
    expires_at: datetime | None = None,
    priority: Priority = "normal",
    unsubscribe_url: str | None = None,
    unsubscribe_mailto: str | None = None,
    tags: Sequence[str] = (),
    metadata: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    bulk: bool | None = None,
    idempotency_key: str | None = None,
) -> Draft:
    """An email: a `template` with its `data`, or ready-made content (`subject` with
    `html` and/or `text`). `to`, `cc`, `bcc` and `reply_to` take an address, an Address
    (with a name), or a list of them; datetimes need a zone. `locale` (BCP 47) picks the
    template's locale, falling back as `fr-CA`, `fr`, its default. `bulk`: bulk mail (a
    newsletter: after transactional mail, with List-Unsubscribe); unset, the server's
    default (no for one message, yes for a batch's)."""
    given: dict[str, Any] = {
        "to": _mailboxes(to),
        "to_name": to_name,
        "cc": None if cc is None else _mailboxes(cc),
        "bcc": None if bcc is None else _mailboxes(bcc),
        "reply_to": None if reply_to is None else _mailboxes(reply_to),
        "from": from_address,
        "from_name": from_name,
        "template": template,
        "data": None if data is None else dict(data),
        "locale": locale,
        "subject": subject,
        "html": html,
        "text": text,
        "inline_css": inline_css or None,
        "attachments": [a.to_json() for a in attachments] or None,
        "send_at": send_at.isoformat() if send_at else None,
        "expires_at": expires_at.isoformat() if expires_at else None,
        "priority": None if priority == "normal" else priority,
        "unsubscribe_url": unsubscribe_url,
        "unsubscribe_mailto": unsubscribe_mailto,
        "tags": list(tags) or None,
        "metadata": None if metadata is None else dict(metadata),
        "headers": None if headers is None else dict(headers),
        "bulk": bulk,
    }
    # Defaults are left out: the body is what the caller said, no more.
    body = {name: value for name, value in given.items() if value is not None}
    return Draft(body, idempotency_key)


def _taking(
    make: Callable[P, Draft], plan: Callable[[Any, Draft], Plan[R]]
) -> Callable[Concatenate[Any, P], Plan[R]]:
    """`plan(self, draft)` as a method that takes `make`'s arguments: send's parameters
    are draft()'s, written once. The docstring is the plan's; the signature, for help()
    and editors, is make's after `self`."""

    def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> Plan[R]:
        return plan(self, make(*args, **kwargs))

    functools.update_wrapper(method, plan)
    method.__name__ = method.__qualname__ = plan.__name__.lstrip("_")
    signature = inspect.signature(make)
    itself = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[itself, *signature.parameters.values()],
        return_annotation=inspect.signature(plan).return_annotation,
    )
    return method


def _send(plans: MessagePlans, message: Draft) -> Plan[Message]:
    """Put an email into the outbox; the arguments are draft()'s. Safe to call again with
    the same `idempotency_key` (one is made for this call when none is given, and used on
    each of its retries): the server answers with the first message (`replayed` True)
    and sends nothing twice."""
    response = yield from plans.core.call(
        "POST",
        "/v1/messages",
        json=message.body,
        idempotency_key=message.idempotency_key or new_idempotency_key(),
    )
    return Message.model_validate({**response.json(), "replayed": _replayed(response)})


class MessagePlans:
    def __init__(self, core: Core) -> None:
        self.core = core

    send = _taking(draft, _send)

    def send_batch(
        self, messages: Sequence[Draft], *, idempotency_key: str | None = None
    ) -> Plan[BatchResult]:
        """Up to 1,000 emails (made with draft()) in one request and one transaction.
        Each item is judged alone: the result has one entry per item, in order,
        `created`, `existing` (a message already holds the item's own idempotency key)
        or `invalid` with the problem a single send would have raised; the valid ones
        are written even when others are not. Idempotent as a whole, as `send`."""
        items = [
            {**m.body, "idempotency_key": m.idempotency_key} if m.idempotency_key else m.body
            for m in messages
        ]
        response = yield from self.core.call(
            "POST",
            "/v1/messages/batch",
            json={"messages": items},
            idempotency_key=idempotency_key or new_idempotency_key(),
        )
        return BatchResult.model_validate({**response.json(), "replayed": _replayed(response)})

    def get(self, message_id: str | uuid.UUID) -> Plan[Message]:
        """The message with its full event history (`events`)."""
        response = yield from self.core.call("GET", f"/v1/messages/{_id(message_id)}")
        return Message.model_validate(response.json())

    def list(
        self,
        *,
        status: MessageStatus | None = None,
        to: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Plan[MessagePage]:
        """One page of messages, newest first (`limit` 1 to MAX_PAGE_SIZE, 100); pass the
        page's `next_cursor` as `cursor` for the next one. `iter` walks every page."""
        params: dict[str, str | int] = {"limit": limit}
        for name, value in (("status", status), ("to", to), ("cursor", cursor)):
            if value is not None:
                params[name] = value
        response = yield from self.core.call("GET", "/v1/messages", params=params)
        return MessagePage.model_validate(response.json())

    def cancel(self, message_id: str | uuid.UUID) -> Plan[Message]:
        """Withdraw a message no worker has taken yet (else NotCancellable, whose
        `status_now` says where it is)."""
        try:
            response = yield from self.core.call("POST", f"/v1/messages/{_id(message_id)}/cancel")
        except NotCancellable as exc:
            # An earlier attempt whose answer was lost (or a 503 whose work committed after
            # all) may have cancelled it: then this call did what it was asked.
            if exc.attempts > 1 and exc.status_now == "cancelled":
                return (yield from self.get(message_id))
            raise
        return Message.model_validate(response.json())


class VerificationPlans:
    def __init__(self, core: Core) -> None:
        self.core = core

    def start(
        self,
        email: str,
        *,
        template: str | None = None,
        redirect_url: str | None = None,
        data: Mapping[str, Any] | None = None,
        locale: str | None = None,
        idempotency_key: str | None = None,
    ) -> Plan[Verification]:
        """Send a verification email to `email` (template default: verify-email, in
        `locale` as messages' fall back); its
        link points at `redirect_url` with the token and id appended. Idempotent as
        `send`. ActiveVerificationExists names a verification already under way for
        the address: `resend` that one."""
        given = {
            "email": email,
            "template": template,
            "redirect_url": redirect_url,
            "locale": locale,
        }
        body: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if data is not None:
            body["data"] = dict(data)
        response = yield from self.core.call(
            "POST",
            "/v1/email-verifications",
            json=body,
            idempotency_key=idempotency_key or new_idempotency_key(),
        )
        return Verification.model_validate({**response.json(), "replayed": _replayed(response)})

    def get(self, verification_id: str | uuid.UUID) -> Plan[Verification]:
        response = yield from self.core.call(
            "GET", f"/v1/email-verifications/{_id(verification_id)}"
        )
        return Verification.model_validate(response.json())

    def confirm(self, verification_id: str | uuid.UUID, token: str) -> Plan[Verification]:
        """Confirm with the token from the email: state `verified` (also when it already
        was). A wrong token is BadRequest (`problem["attempts_left"]`), after five the
        verification is Locked; an expired one is Gone."""
        response = yield from self.core.call(
            "POST",
            f"/v1/email-verifications/{_id(verification_id)}/confirm",
            json={"token": token},
        )
        return Verification.model_validate(response.json())

    def resend(
        self, verification_id: str | uuid.UUID, *, idempotency_key: str | None = None
    ) -> Plan[Verification]:
        """A new token (the old one stops working) in a new email; rate limited
        (RateLimited with `retry_after`)."""
        response = yield from self.core.call(
            "POST",
            f"/v1/email-verifications/{_id(verification_id)}/resend",
            idempotency_key=idempotency_key or new_idempotency_key(),
        )
        return Verification.model_validate({**response.json(), "replayed": _replayed(response)})
