"""Request and response bodies. Requests forbid unknown fields: a typo is an error, and
every value in them must be storable as given (domain.storable): what passes here is never
refused by the database."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.functional_validators import AfterValidator
from pydantic_core import PydanticCustomError

from mailbag.domain import storable
from mailbag.domain.content import (
    CONTENT_ID_MAX,
    CONTENT_TYPE_MAX,
    FILENAME_MAX,
    UNSUBSCRIBE_URL_MAX,
)
from mailbag.domain.message import (
    ADDRESS_MAX,
    NAME_MAX,
    SUBJECT_MAX,
    TAGS_MAX,
    TEMPLATE_NAME_MAX,
)
from mailbag.domain.states import Status
from mailbag.domain.templates import LOCALE_MAX
from mailbag.domain.verification import VState

# The length of email_verifications.redirect_url (a test holds the two together).
REDIRECT_URL_MAX = 2000


class Strict(BaseModel):
    """A request body: no unknown fields, and nothing in any field the database would refuse."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        # One rule for every field of every request body, nested values and keys included.
        try:
            storable.check(value)
        except storable.Unstorable as exc:
            raise PydanticCustomError(exc.kind, str(exc)) from None
        return value


def _fits_column(url: AnyHttpUrl) -> AnyHttpUrl:
    # Checked after normalization: punycode and percent-encoding can lengthen a URL.
    if len(str(url)) > REDIRECT_URL_MAX:
        raise PydanticCustomError(
            "url_too_long",
            "is longer than {limit} characters once normalized",
            {"limit": REDIRECT_URL_MAX},
        )
    return url


RedirectUrl = Annotated[AnyHttpUrl, AfterValidator(_fits_column)]


class AddressIn(Strict):
    address: str = Field(
        max_length=ADDRESS_MAX, description="An email address.", examples=["ada@example.com"]
    )
    name: str | None = Field(
        None, max_length=NAME_MAX, description="Display name.", examples=["Ada Lovelace"]
    )


Mailbox = Annotated[str, Field(max_length=ADDRESS_MAX)] | AddressIn
# One address as a string, or a list of strings and {address, name} objects.
Mailboxes = Mailbox | list[Mailbox]


class AttachmentIn(Strict):
    filename: str = Field(
        min_length=1,
        max_length=FILENAME_MAX,
        description="The file's name as the recipient sees it (no path).",
        examples=["invoice-2041.pdf"],
    )
    content_type: str | None = Field(
        None,
        max_length=CONTENT_TYPE_MAX,
        description="MIME type; guessed from the filename when left out.",
        examples=["application/pdf"],
    )
    content: str = Field(
        description="The bytes, base64-encoded (RFC 4648; line breaks are ignored). Limits: "
        "MAX_ATTACHMENT_BYTES per attachment, MAX_MESSAGE_BYTES per message (decoded).",
        examples=["JVBERi0xLjQKJcOkw7zDtsOfCg=="],
        json_schema_extra={"contentEncoding": "base64"},
    )
    content_id: str | None = Field(
        None,
        max_length=CONTENT_ID_MAX,
        description="Makes it an inline part: the HTML shows it with `cid:<content_id>`.",
        examples=["logo"],
    )


FULL_EXAMPLE: dict[str, Any] = {
    "to": [{"address": "ada@example.com", "name": "Ada Lovelace"}, "charles@example.com"],
    "cc": ["accounts@example.com"],
    "bcc": ["archive@example.com"],
    "reply_to": [{"address": "billing@acme.example", "name": "Acme Billing"}],
    "from": "billing@acme.example",
    "from_name": "Acme Billing",
    "subject": "Your invoice #2041",
    "html": '<p><img src="cid:logo" alt="Acme"></p><p>Your invoice is attached.</p>',
    "attachments": [
        {
            "filename": "invoice-2041.pdf",
            "content_type": "application/pdf",
            "content": "JVBERi0xLjQKJcOkw7zDtsOfCg==",
        },
        {
            "filename": "logo.png",
            "content_type": "image/png",
            "content": "iVBORw0KGgo=",
            "content_id": "logo",
        },
    ],
    "expires_at": "2026-12-31T23:00:00Z",
    "priority": "high",
    "unsubscribe_url": "https://acme.example/unsubscribe?u=42",
    "tags": ["invoice"],
}
TEMPLATE_EXAMPLE: dict[str, Any] = {
    "to": "ada@example.com",
    "to_name": "Ada Lovelace",
    "template": "welcome",
    "data": {"name": "Ada"},
}


class MessageCreate(Strict):
    """An email: a template with its data, or ready-made content (`subject` with `html`
    and/or `text`); recipients, sender, attachments and delivery options."""

    model_config = ConfigDict(json_schema_extra={"examples": [TEMPLATE_EXAMPLE, FULL_EXAMPLE]})

    to: Mailboxes = Field(
        description="Recipients: an address, or a list of addresses and {address, name} "
        "objects. To, cc and bcc together hold at most MAX_RECIPIENTS (default 50).",
        examples=["ada@example.com", [{"address": "ada@example.com", "name": "Ada"}]],
    )
    to_name: str | None = Field(
        None,
        max_length=NAME_MAX,
        description="Display name of a single `to` given as a string.",
        examples=["Ada Lovelace"],
    )
    cc: Mailboxes | None = Field(
        None, description="Copy recipients (shown in the Cc header).", examples=[["c@example.com"]]
    )
    bcc: Mailboxes | None = Field(
        None,
        description="Blind copy recipients: delivered to, never shown in any header.",
        examples=[["archive@example.com"]],
    )
    reply_to: Mailboxes | None = Field(
        None, description="Where replies go (Reply-To).", examples=["support@acme.example"]
    )
    from_: str | None = Field(
        None,
        alias="from",
        max_length=ADDRESS_MAX,
        description="Sender address: one of the tenant's sender identities (`mailbag tenants "
        "senders add`). Default: the deployment's FROM_EMAIL.",
        examples=["billing@acme.example"],
    )
    from_name: str | None = Field(
        None,
        max_length=NAME_MAX,
        description="Sender display name; default: the sender identity's name.",
        examples=["Acme Billing"],
    )
    template: str | None = Field(
        None,
        max_length=TEMPLATE_NAME_MAX,
        description="Template name (or give ready-made `html`/`text` instead).",
        examples=["welcome"],
    )
    locale: str | None = Field(
        None,
        max_length=LOCALE_MAX,
        description="BCP 47 locale of the template: `fr-CA`, else `fr`, else the template's "
        "default locale (the one used is `template_locale`).",
        examples=["fr-CA"],
    )
    data: dict[str, Any] | None = Field(
        None, description="Template variables.", examples=[{"name": "Ada"}]
    )
    subject: str | None = Field(
        None,
        max_length=SUBJECT_MAX,
        description="The subject: required with ready-made content; with a template, "
        "overrides the template's subject.",
        examples=["Your invoice #2041"],
    )
    html: str | None = Field(
        None,
        description="Ready-made HTML body (instead of a template). `cid:<content_id>` shows "
        "an inline attachment.",
        examples=["<p>Hello <b>Ada</b></p>"],
    )
    text: str | None = Field(
        None,
        description="Ready-made plain-text body; generated from `html` when left out.",
        examples=["Hello Ada"],
    )
    inline_css: bool = Field(
        False,
        description="Move the ready-made HTML's <style> rules into style attributes.",
        examples=[True],
    )
    attachments: list[AttachmentIn] = Field(
        default_factory=list,
        description="Files sent with the message, stored once per content (SHA-256).",
        examples=[FULL_EXAMPLE["attachments"]],
    )
    send_at: datetime | None = Field(
        None,
        description="Send no earlier than this (with zone).",
        examples=["2026-12-01T09:00:00+01:00"],
    )
    expires_at: datetime | None = Field(
        None,
        description="Don't send after this (with zone): a message still unsent then ends "
        "`expired`, never sent.",
        examples=["2026-12-01T12:00:00Z"],
    )
    priority: Literal["high", "normal", "low"] = Field(
        "normal",
        description="Among a tenant's due messages, higher priority is claimed first (a head "
        "start of 5 minutes per level, so nothing starves).",
        examples=["high"],
    )
    bulk: bool = Field(
        False,
        description="Bulk mail (a newsletter, an announcement), not transactional: claimed "
        "after transactional mail (a quarter of its share), never starved by it.",
        examples=[False],
    )
    unsubscribe_url: str | None = Field(
        None,
        max_length=UNSUBSCRIBE_URL_MAX,
        description="https:// URL for List-Unsubscribe with one-click (RFC 8058).",
        examples=["https://acme.example/unsubscribe?u=42"],
    )
    unsubscribe_mailto: str | None = Field(
        None,
        max_length=ADDRESS_MAX,
        description="Address for a mailto: List-Unsubscribe.",
        examples=["unsubscribe@acme.example"],
    )
    tags: list[str] = Field(
        default_factory=list, max_length=TAGS_MAX, description="Labels.", examples=[["invoice"]]
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Your own data, kept with the message, never sent.",
        examples=[{"order": 2041}],
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Extra email headers.",
        examples=[{"X-Campaign": "autumn"}],
    )


class Event(BaseModel):
    from_: str | None = Field(None, alias="from")
    to: str
    at: datetime
    actor: str
    attempt: int
    provider_message_id: str | None = None
    detail: str | None = None


class AddressOut(BaseModel):
    address: str
    name: str | None = None


class RecipientsOut(BaseModel):
    to: list[AddressOut]
    cc: list[AddressOut]
    bcc: list[AddressOut]


class AttachmentOut(BaseModel):
    filename: str
    content_type: str
    size: int = Field(description="Bytes.")
    sha256: str = Field(description="Hex SHA-256 of the bytes.")
    content_id: str | None = Field(None, description="Set for an inline part.")


class MessageOut(BaseModel):
    # Fields added after the first release have defaults: an idempotent replay answers with
    # the body stored then, which lacks them.
    model_config = ConfigDict(populate_by_name=True)

    id: str
    status: Status
    to: str = Field(description="The first To recipient.")
    to_name: str | None
    recipients: RecipientsOut = Field(description="Every recipient (suppressed ones dropped).")
    reply_to: list[AddressOut] = Field(default_factory=list)
    from_: str | None = Field(None, alias="from")
    from_name: str | None = None
    template: str | None = Field(description="None for ready-made content.")
    template_version: int | None = Field(
        None,
        description="The version of the tenant's template it renders with, fixed when it was "
        "enqueued; None for a file template of the deployment or ready-made content.",
    )
    template_locale: str | None = Field(
        None, description="The locale of that version (after fallback)."
    )
    locale: str | None = Field(None, description="The locale it asked for.")
    ready_made: bool = False
    has_html: bool = Field(False, description="Ready-made content with an HTML body.")
    has_text: bool = Field(False, description="Ready-made content with a text body.")
    subject: str | None
    data: dict[str, Any]
    attachments: list[AttachmentOut] = Field(default_factory=list)
    tags: list[str]
    metadata: dict[str, Any]
    headers: dict[str, str]
    priority: Literal["high", "normal", "low"] = "normal"
    bulk: bool = False
    expires_at: datetime | None = None
    unsubscribe_url: str | None = None
    unsubscribe_mailto: str | None = None
    suppressed: list[str] = Field(
        default_factory=list, description="Recipients dropped: on the suppression list."
    )
    attempt_count: int
    max_attempts: int
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None
    provider: str | None
    provider_message_id: str | None
    last_error: str | None
    events: list[Event] | None = None

    @model_validator(mode="before")
    @classmethod
    def _single_recipient(cls, value: Any) -> Any:
        # A body stored before messages had several recipients names only `to`.
        if isinstance(value, dict) and "recipients" not in value and "to" in value:
            to = {"address": value["to"], "name": value.get("to_name")}
            return {**value, "recipients": {"to": [to], "cc": [], "bcc": []}}
        return value


class MessagePage(BaseModel):
    items: list[MessageOut]
    next_cursor: str | None


class VerificationCreate(Strict):
    email: str = Field(max_length=ADDRESS_MAX)
    template: str = Field("verify-email", max_length=TEMPLATE_NAME_MAX)
    redirect_url: RedirectUrl | None = Field(
        None, description="Where the email's link points; the token and id are appended."
    )
    data: dict[str, Any] = Field(default_factory=dict, description="Extra template variables.")
    locale: str | None = Field(
        None,
        max_length=LOCALE_MAX,
        description="BCP 47 locale of its emails' template (with fallback, as for messages).",
        examples=["fr"],
    )


class VerificationConfirm(Strict):
    token: str = Field(min_length=1, max_length=200)


class VerificationOut(BaseModel):
    id: str
    email: str
    state: VState
    expires_at: datetime
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None
    verified_at: datetime | None
    send_count: int
    message_id: str | None
    locale: str | None = None
