"""Bulk mail as the mailbox providers want it (Gmail's and Yahoo's sender rules, 2024).

A message is bulk when NewMessage.bulk says so (domain/message.py, the one definition):
`mailbag send-bulk` and `POST /v1/messages/batch` send bulk mail, a caller may say
`bulk=True`, and a `bulk` tag (a category) says it too. A bulk message carries:

- List-Unsubscribe with one-click (RFC 8058). Its own `unsubscribe_url` if it has one; else,
  with PUBLIC_URL set, mailbag's own link (`UnsubscribeLinks`): `PUBLIC_URL/v1/unsubscribe/
  TOKEN`, where the token signs (tenant, address, message id) under a subkey of SECRET_KEY
  and is derived again at each render, never stored. A POST to it suppresses the address for
  the tenant (api/unsubscribe.py). With REQUIRE_UNSUBSCRIBE_FOR_BULK, a bulk message that
  would have no unsubscribe target is refused at enqueue (`unsubscribe_problem`).
- `Precedence: bulk` and `Feedback-ID: CAMPAIGN:TENANT:mailbag` (Gmail's feedback loop; the
  campaign is the template's name, or `message`), unless the message sets them itself
  (`bulk_headers`). Providers that send mailbag's MIME carry them as they are; the JSON API
  providers pass them on as custom headers.

Pure: the signing is itsdangerous's, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BULK_TAG = "bulk"
LINK_NAMESPACE = "mailbag.unsubscribe"
UNSUBSCRIBE_PATH = "/v1/unsubscribe"
FEEDBACK_ID_PART_MAX = 60  # Gmail's Feedback-ID: a few short colon-separated parts


class BadToken(ValueError):
    """An unsubscribe token that is not one of this deployment's."""


def bulk_headers(own: Mapping[str, str], tenant_id: str, template: str | None) -> dict[str, str]:
    """The headers a bulk message adds to its own: those it does not set itself."""
    present = {name.lower() for name in own}
    campaign = _feedback_part(template or "message")
    added = {
        "Precedence": "bulk",
        "Feedback-ID": f"{campaign}:{_feedback_part(tenant_id)}:mailbag",
    }
    return {name: value for name, value in added.items() if name.lower() not in present}


def _feedback_part(text: str) -> str:
    # A Feedback-ID part is a token: no colons (its separator), no spaces.
    cleaned = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)
    return cleaned[:FEEDBACK_ID_PART_MAX] or "-"


@dataclass(frozen=True)
class Unsubscriber:
    """Who a token unsubscribes: an address, from one tenant's mail."""

    tenant_id: str
    address: str
    message_id: str


@dataclass(frozen=True)
class UnsubscribeLinks:
    """mailbag's own one-click links, under PUBLIC_URL, signed with `key`."""

    public_url: str
    key: bytes = field(repr=False)

    def _serializer(self) -> Any:
        from itsdangerous import URLSafeSerializer

        return URLSafeSerializer(self.key, salt=LINK_NAMESPACE)

    def link(self, tenant_id: str, address: str, message_id: str) -> str:
        token = self._serializer().dumps([tenant_id, address.lower(), message_id])
        return f"{self.public_url.rstrip('/')}{UNSUBSCRIBE_PATH}/{token}"

    def read(self, token: str) -> Unsubscriber:
        """Who `token` unsubscribes; BadToken for one this deployment did not sign."""
        from itsdangerous import BadSignature

        try:
            tenant_id, address, message_id = self._serializer().loads(token)
        except (BadSignature, ValueError, TypeError):
            raise BadToken("not an unsubscribe link of this deployment") from None
        if not all(isinstance(part, str) for part in (tenant_id, address, message_id)):
            raise BadToken("not an unsubscribe link of this deployment")
        return Unsubscriber(tenant_id, address, message_id)


def unsubscribe_problem(bulk: bool, url: str | None, mailto: str | None, links: bool) -> str | None:
    """REQUIRE_UNSUBSCRIBE_FOR_BULK: why a message cannot go as it is, or None. `links`:
    whether mailbag makes its own (PUBLIC_URL is set)."""
    if not bulk or url or mailto or links:
        return None
    return (
        "a bulk message needs an unsubscribe target: give unsubscribe_url (one-click, "
        "HTTPS) or unsubscribe_mailto, or set PUBLIC_URL so that mailbag makes its own"
    )
