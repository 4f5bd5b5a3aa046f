"""`/v1/webhooks/{provider}`: delivery events from Brevo and from SES (through SNS).

Both need the provider's shared secret, compared in constant time, in any of: a custom
header `X-Mailbag-Webhook-Secret` (Brevo's webhook `headers`), `Authorization: Bearer`
(Brevo's webhook `auth` of type bearer), HTTP Basic with the secret as password (a URL with
userinfo), or `?secret=` (last resort: a query string ends up in proxy logs). SNS messages
are also verified against AWS's signature with the signing certificate (fetched over HTTPS
from an allowed host, cached for a while), must be recent (a signature never expires, a
replay would), and only topics listed in SES_TOPIC_ARNS are accepted when that setting is
given.

What is answered, given how providers retry: Brevo and SNS both give up on a 4xx (Brevo
retries 429 only, SNS retries 5xx for an hour at most). An authenticated body that is not
the provider's format is 400; in a batch, each unusable event is skipped and counted
(`skipped`) while the others are stored, and a batch with nothing usable is 400. Bodies are
never logged.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import httpx
from fastapi import APIRouter, Request
from pydantic import SecretStr

from mailbag import log
from mailbag.api.deps import NowDep, ServicesDep
from mailbag.api.problems import ProblemError, documented, not_found, unauthorized
from mailbag.domain.events import InvalidPayload, ProviderEvent
from mailbag.keys import secret_matches
from mailbag.providers.brevo_events import parse_brevo_events
from mailbag.providers.ses_events import (
    InvalidSignature,
    SnsMessageType,
    StaleMessage,
    check_fresh,
    is_trusted_cert_url,
    parse_ses_notification,
    parse_sns_envelope,
    verify_sns_signature,
)
from mailbag.services.container import Services
from mailbag.services.reconciliation import ingest

SECRET_HEADER = "x-mailbag-webhook-secret"  # noqa: S105 (a header name)
DETAIL_MAX = 200  # a problem's detail quotes at most this much of what was sent

router = APIRouter(prefix="/v1/webhooks", tags=["provider webhooks"])
RESPONSES = documented(400, 401, 403, 404, 413, 500, 503)


class SnsCertificates:
    """Signing certificates by URL, fetched over HTTPS from hosts we trust, kept for TTL
    seconds (AWS rotates them) and at most SIZE of them (the least recently used go)."""

    TTL = 6 * 3600.0
    SIZE = 32

    def __init__(self, allowed_hosts: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed_hosts = allowed_hosts
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def put(self, url: str, certificate_pem: bytes) -> None:
        self._cache[url] = (self.clock() + self.TTL, certificate_pem)
        self._cache.move_to_end(url)
        while len(self._cache) > self.SIZE:
            self._cache.popitem(last=False)

    def cached(self, url: str) -> bytes | None:
        entry = self._cache.get(url)
        if entry is None or entry[0] <= self.clock():
            self._cache.pop(url, None)
            return None
        self._cache.move_to_end(url)
        return entry[1]

    def __len__(self) -> int:
        return len(self._cache)

    async def get(self, url: str) -> bytes:
        if not is_trusted_cert_url(url, self.allowed_hosts):
            raise InvalidSignature("untrusted signing certificate URL")
        found = self.cached(url)
        if found is None:
            async with httpx.AsyncClient(timeout=10) as client:
                response = await client.get(url)
                response.raise_for_status()
            found = response.content
            self.put(url, found)
        return found


async def confirm_subscription(url: str) -> None:
    """Visiting SubscribeURL is how an SNS subscription is confirmed."""
    async with httpx.AsyncClient(timeout=10) as client:
        (await client.get(url)).raise_for_status()


def _offered_secret(request: Request) -> str | None:
    """The secret the caller sent, wherever it put it."""
    if SECRET_HEADER in request.headers:
        return request.headers[SECRET_HEADER]
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value, validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return None
    return request.query_params.get("secret")


def _check_secret(request: Request, secret: SecretStr | None, provider: str) -> None:
    if secret is None:  # not configured: the endpoint does not exist
        raise not_found(f"{provider} webhooks are not enabled")
    if not secret_matches(_offered_secret(request), secret):
        raise unauthorized("wrong or missing webhook secret", f'Basic realm="mailbag {provider}"')


def _invalid(title: str, problem: Exception) -> ProblemError:
    return ProblemError(400, "invalid-event", title, str(problem)[:DETAIL_MAX])


async def _ingest(
    svc: Services, events: list[ProviderEvent], now: datetime, skipped: int = 0
) -> dict[str, int]:
    report = await ingest(svc.engine, events, now)
    answer = {**report.as_dict(), **({"skipped": skipped} if skipped else {})}
    log.get("mailbag.webhooks").info("provider_events", **answer)
    return answer


@router.post("/brevo", responses=RESPONSES)
async def brevo_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """Brevo transactional webhook events (one object or a list)."""
    _check_secret(request, svc.settings.brevo_webhook_secret, "brevo")
    try:
        events, problems = parse_brevo_events(await request.json())
    except (ValueError, RecursionError) as exc:  # not JSON (InvalidPayload is a ValueError)
        raise _invalid("Invalid webhook payload", exc) from None
    if problems:
        # Why, without the event's content: a log must not carry what providers send.
        log.get("mailbag.webhooks").warning(
            "provider_events_skipped",
            provider="brevo",
            skipped=len(problems),
            reasons=sorted({type(p).__name__ for p in problems}),
        )
        if not events:
            raise _invalid("Invalid webhook payload", problems[0])
    return await _ingest(svc, events, now, skipped=len(problems))


@router.post("/ses", responses=RESPONSES)
async def ses_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, Any]:
    """SES events delivered by SNS: subscription confirmations and notifications."""
    _check_secret(request, svc.settings.ses_webhook_secret, "ses")
    try:
        message = parse_sns_envelope(await request.body())
    except InvalidPayload as exc:
        raise _invalid("Invalid SNS message", exc) from None
    allowed = [arn.strip() for arn in svc.settings.ses_topic_arns.split(",") if arn.strip()]
    if allowed and message.topic_arn not in allowed:
        raise ProblemError(
            403, "unknown-topic", "Topic not accepted", "this SNS topic is not in SES_TOPIC_ARNS"
        )
    certificates: SnsCertificates = request.app.state.sns_certificates
    try:
        certificate = await certificates.get(message.signing_cert_url)
        verify_sns_signature(message, certificate, now=now)
        check_fresh(message, now)
    except StaleMessage as exc:
        raise ProblemError(403, "stale-message", "Stale SNS message", str(exc)) from None
    except (InvalidSignature, httpx.HTTPError) as exc:
        raise ProblemError(
            403, "invalid-signature", "Invalid SNS signature", str(exc)[:DETAIL_MAX]
        ) from None
    if message.message_type is SnsMessageType.SUBSCRIPTION_CONFIRMATION:
        url = message.subscribe_url or ""
        if not re.match(r"^https://", url) or not is_trusted_cert_url(
            url, certificates.allowed_hosts
        ):
            raise ProblemError(400, "invalid-event", "Invalid SubscribeURL", url[:DETAIL_MAX])
        confirm: Callable[[str], Awaitable[None]] = request.app.state.confirm_subscription
        await confirm(url)
        return {"confirmed": True}
    if message.message_type is not SnsMessageType.NOTIFICATION:
        return {"ignored": message.message_type.value}
    try:
        events = parse_ses_notification(message.message)
    except InvalidPayload as exc:
        raise _invalid("Invalid SES event", exc) from None
    return await _ingest(svc, events, now)
