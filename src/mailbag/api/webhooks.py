"""`/v1/webhooks/{provider}`: delivery events from Brevo and from SES (through SNS).

Both need the provider's shared secret (`Authorization: Bearer <secret>`, HTTP Basic with
the secret as password, or `?secret=`), compared in constant time. SNS messages are also
verified against AWS's signature with the signing certificate (fetched over HTTPS from an
allowed host and cached), and only topics listed in SES_TOPIC_ARNS are accepted when that
setting is given.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from fastapi import APIRouter, Request
from pydantic import SecretStr

from mailbag import log
from mailbag.api.deps import NowDep, ServicesDep
from mailbag.api.problems import ProblemError, documented
from mailbag.domain.events import InvalidPayload, ProviderEvent
from mailbag.providers.brevo_events import parse_brevo_webhook
from mailbag.providers.ses_events import (
    InvalidSignature,
    SnsMessageType,
    is_trusted_cert_url,
    parse_ses_notification,
    parse_sns_envelope,
    verify_sns_signature,
)
from mailbag.services.reconciliation import ingest

router = APIRouter(prefix="/v1/webhooks", tags=["provider webhooks"])
RESPONSES = documented(400, 401, 403, 404, 413, 500, 503)


class SnsCertificates:
    """Signing certificates by URL, fetched once over HTTPS from hosts we trust."""

    def __init__(self, allowed_hosts: str) -> None:
        self.allowed_hosts = allowed_hosts
        self.cache: dict[str, bytes] = {}

    async def get(self, url: str) -> bytes:
        if not is_trusted_cert_url(url, self.allowed_hosts):
            raise InvalidSignature(f"untrusted signing certificate URL {url!r}")
        if url not in self.cache:
            async with httpx.AsyncClient(timeout=10) as client:
                response = await client.get(url)
                response.raise_for_status()
            self.cache[url] = response.content
        return self.cache[url]


async def confirm_subscription(url: str) -> None:
    """Visiting SubscribeURL is how an SNS subscription is confirmed."""
    async with httpx.AsyncClient(timeout=10) as client:
        (await client.get(url)).raise_for_status()


def _check_secret(request: Request, secret: SecretStr | None, provider: str) -> None:
    if secret is None:  # not configured: the endpoint does not exist
        raise ProblemError(404, "not-found", "Not found", f"{provider} webhooks are not enabled")
    offered = request.query_params.get("secret", "")
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        offered = value
    elif scheme.lower() == "basic":
        try:
            offered = base64.b64decode(value).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            offered = ""
    if not hmac.compare_digest(offered.encode(), secret.get_secret_value().encode()):
        raise ProblemError(
            401,
            "unauthorized",
            "Unauthorized",
            "wrong or missing webhook secret",
            headers={"WWW-Authenticate": f'Basic realm="mailbag {provider}"'},
        )


async def _ingest(svc: Any, events: list[ProviderEvent], now: Any) -> dict[str, int]:
    report = await ingest(svc.engine, svc.operations.dialect, events, now)
    log.get("mailbag.webhooks").info("provider_events", **report.as_dict())
    return report.as_dict()


@router.post("/brevo", responses=RESPONSES)
async def brevo_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """Brevo transactional webhook events (one object or a list)."""
    _check_secret(request, svc.settings.brevo_webhook_secret, "brevo")
    try:
        payload = await request.json()
        events = parse_brevo_webhook(payload)
    except (ValueError, InvalidPayload) as exc:
        raise ProblemError(400, "invalid-event", "Invalid webhook payload", str(exc)) from None
    return await _ingest(svc, events, now)


@router.post("/ses", responses=RESPONSES)
async def ses_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, Any]:
    """SES events delivered by SNS: subscription confirmations and notifications."""
    _check_secret(request, svc.settings.ses_webhook_secret, "ses")
    try:
        message = parse_sns_envelope(await request.body())
    except InvalidPayload as exc:
        raise ProblemError(400, "invalid-event", "Invalid SNS message", str(exc)) from None
    allowed = [arn.strip() for arn in svc.settings.ses_topic_arns.split(",") if arn.strip()]
    if allowed and message.topic_arn not in allowed:
        raise ProblemError(
            403, "unknown-topic", "Topic not accepted", "this SNS topic is not in SES_TOPIC_ARNS"
        )
    certificates: SnsCertificates = request.app.state.sns_certificates
    try:
        verify_sns_signature(message, await certificates.get(message.signing_cert_url))
    except (InvalidSignature, httpx.HTTPError) as exc:
        raise ProblemError(
            403, "invalid-signature", "Invalid SNS signature", str(exc)[:200]
        ) from None
    if message.message_type is SnsMessageType.SUBSCRIPTION_CONFIRMATION:
        url = message.subscribe_url or ""
        if not re.match(r"^https://", url) or not is_trusted_cert_url(
            url, certificates.allowed_hosts
        ):
            raise ProblemError(400, "invalid-event", "Invalid SubscribeURL", url[:200])
        confirm: Callable[[str], Awaitable[None]] = request.app.state.confirm_subscription
        await confirm(url)
        return {"confirmed": True}
    if message.message_type is not SnsMessageType.NOTIFICATION:
        return {"ignored": message.message_type.value}
    try:
        events = parse_ses_notification(message.message)
    except InvalidPayload as exc:
        raise ProblemError(400, "invalid-event", "Invalid SES event", str(exc)) from None
    return await _ingest(svc, events, now)
