"""Request and response bodies. Requests forbid unknown fields: a typo is an error, and
every value in them must be storable as given (domain.storable): what passes here is never
refused by the database."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, field_validator
from pydantic.functional_validators import AfterValidator
from pydantic_core import PydanticCustomError

from mailbag.domain import storable
from mailbag.domain.message import (
    ADDRESS_MAX,
    NAME_MAX,
    SUBJECT_MAX,
    TAGS_MAX,
    TEMPLATE_NAME_MAX,
)
from mailbag.domain.states import Status
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


class MessageCreate(Strict):
    to: str = Field(max_length=ADDRESS_MAX, description="Recipient address.")
    to_name: str | None = Field(None, max_length=NAME_MAX)
    template: str = Field(max_length=TEMPLATE_NAME_MAX, description="Template name.")
    data: dict[str, Any] = Field(default_factory=dict, description="Template variables.")
    subject: str | None = Field(
        None, max_length=SUBJECT_MAX, description="Overrides the template's subject."
    )
    send_at: datetime | None = Field(None, description="Send no earlier than this (with zone).")
    tags: list[str] = Field(default_factory=list, max_length=TAGS_MAX)
    metadata: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict, description="Extra email headers.")


class Event(BaseModel):
    from_: str | None = Field(None, alias="from")
    to: str
    at: datetime
    actor: str
    attempt: int
    provider_message_id: str | None = None
    detail: str | None = None


class MessageOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    id: str
    status: Status
    to: str
    to_name: str | None
    from_: str | None = Field(None, alias="from")
    template: str
    subject: str | None
    data: dict[str, Any]
    tags: list[str]
    metadata: dict[str, Any]
    headers: dict[str, str]
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
