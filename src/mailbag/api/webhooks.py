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

Postmark does not sign its webhooks: the secret (POSTMARK_WEBHOOK_SECRET) comes as Brevo's
does, best as the password of the webhook URL's userinfo (HTTP Basic) or the
X-Mailbag-Webhook-Secret header. Resend signs with Svix, the Standard Webhooks scheme
(providers/resend_events: the svix-* headers checked by domain.hooks.signing, its
timestamp tolerance refusing replays): unsigned is 401, a wrong or stale signature 403.
Both retry anything but a 2xx for hours (Postmark stops on a 403 only), so a record or
event type mailbag does not keep, or does not know, is answered 200 with `ignored` (an
unknown one is logged by name), never stored.

SendGrid and Mailgun sign their webhooks themselves: SendGrid's Signed Event Webhook
(ECDSA, the key in SENDGRID_WEBHOOK_PUBLIC_KEY) and Mailgun's HMAC of a timestamp and a
single-use token (MAILGUN_WEBHOOK_SIGNING_KEY). Unsigned is 401, a wrong or stale signature
403 (signed_webhooks: the replay window). SendGrid retries anything but a 2xx for a day,
Mailgun anything but a 200 or a 406 for 8 hours: event types mailbag does not keep are
answered 200 `ignored`, a malformed Mailgun event 406 (Mailgun's "do not retry").
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import lru_cache
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi import APIRouter, Request
from pydantic import SecretStr

from mailbag import log
from mailbag.api.deps import NowDep, ServicesDep
from mailbag.api.problems import ProblemError, documented, not_found, unauthorized
from mailbag.domain.events import InvalidPayload, ProviderEvent, UnsupportedEvent
from mailbag.keys import secret_matches
from mailbag.providers import mailgun_events, sendgrid_events, signed_webhooks
from mailbag.providers.brevo_events import parse_brevo_events
from mailbag.providers.postmark_events import parse_postmark_webhook
from mailbag.providers.resend_events import (
    InvalidResendSignature,
    parse_resend_webhook,
    verify_resend_signature,
)
from mailbag.providers.resend_events import Unsigned as ResendUnsigned
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
from mailbag.providers.signed_webhooks import Unsigned
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


def _some_usable(
    provider: str, events: list[ProviderEvent], problems: list[InvalidPayload]
) -> None:
    """Log why events of a batch were skipped; 400 when none of it is usable."""
    if problems:
        # Why, without the event's content: a log must not carry what providers send.
        log.get("mailbag.webhooks").warning(
            "provider_events_skipped",
            provider=provider,
            skipped=len(problems),
            reasons=sorted({type(p).__name__ for p in problems}),
        )
        if not events:
            raise _invalid("Invalid webhook payload", problems[0])


@router.post("/brevo", responses=RESPONSES)
async def brevo_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """Brevo transactional webhook events (one object or a list)."""
    _check_secret(request, svc.settings.brevo_webhook_secret, "brevo")
    try:
        events, problems = parse_brevo_events(await request.json())
    except (ValueError, RecursionError) as exc:  # not JSON (InvalidPayload is a ValueError)
        raise _invalid("Invalid webhook payload", exc) from None
    _some_usable("brevo", events, problems)
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


# --- SendGrid and Mailgun: signed by the provider (providers/signed_webhooks.py) ---------


def _refused(provider: str, exc: InvalidSignature) -> ProblemError:
    """401 for a request with no signature, 403 for a wrong or stale one."""
    if isinstance(exc, Unsigned):
        return unauthorized(str(exc), f'Signature realm="mailbag {provider}"')
    if isinstance(exc, StaleMessage):
        return ProblemError(403, "stale-message", "Stale webhook", str(exc)[:DETAIL_MAX])
    return ProblemError(403, "invalid-signature", "Invalid signature", str(exc)[:DETAIL_MAX])


@lru_cache(maxsize=4)
def _sendgrid_key(configured: str) -> ec.EllipticCurvePublicKey:
    return sendgrid_events.load_public_key(configured)


@router.post("/sendgrid", responses=RESPONSES)
async def sendgrid_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """SendGrid Event Webhook batches, signed (Signed Event Webhook: ECDSA over the
    X-Twilio-Email-Event-Webhook-Timestamp and the body)."""
    configured = svc.settings.sendgrid_webhook_public_key
    if configured is None or not configured.strip():
        raise not_found("sendgrid webhooks are not enabled")
    try:
        public_key = _sendgrid_key(configured)
    except ValueError as exc:  # the operator's key, not the caller's request
        log.get("mailbag.webhooks").error("sendgrid_webhook_key_unusable", error=str(exc))
        raise ProblemError(
            503,
            "webhook-misconfigured",
            "Webhook misconfigured",
            "SENDGRID_WEBHOOK_PUBLIC_KEY cannot be read: see the server's log",
        ) from None
    body = await request.body()
    try:
        sendgrid_events.authenticate(public_key, request.headers, body, now)
    except InvalidSignature as exc:
        raise _refused("sendgrid", exc) from None
    try:
        payload = signed_webhooks.json_body(body, "SendGrid")
        events, problems = sendgrid_events.parse_sendgrid_events(payload)
    except InvalidPayload as exc:
        raise _invalid("Invalid webhook payload", exc) from None
    # An event type mailbag does not keep is ignored (a resend could not change that); a
    # malformed event is skipped, and a batch with nothing else is 400.
    unknown = [p for p in problems if isinstance(p, UnsupportedEvent)]
    for problem in unknown:
        _ignored("sendgrid", [], problem)
    malformed = [p for p in problems if not isinstance(p, UnsupportedEvent)]
    if not unknown:
        _some_usable("sendgrid", events, malformed)
    answer = await _ingest(svc, events, now, skipped=len(malformed))
    return {**answer, **({"ignored": len(unknown)} if unknown else {})}


@router.post("/mailgun", responses=documented(400, 401, 403, 404, 406, 413, 500, 503))
async def mailgun_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """Mailgun webhook events (one per request, JSON), signed with the HTTP webhook signing
    key. An unusable event is 406, which Mailgun takes as "do not retry"; any other error
    it retries for hours."""
    key = svc.settings.mailgun_webhook_signing_key
    if key is None:
        raise not_found("mailgun webhooks are not enabled")
    try:  # the signature is in the body: what is not JSON carries none
        payload = signed_webhooks.json_body(await request.body(), "Mailgun")
    except InvalidPayload as exc:
        raise _refused("mailgun", Unsigned(str(exc))) from None
    try:
        token = mailgun_events.authenticate(key.get_secret_value(), payload, now)
    except InvalidSignature as exc:
        raise _refused("mailgun", exc) from None
    try:
        event = mailgun_events.parse_mailgun_event(payload, token)
    except UnsupportedEvent as exc:  # a type mailbag does not keep: answered, not stored
        _ignored("mailgun", [], exc)
        return {**(await _ingest(svc, [], now)), "ignored": 1}
    except InvalidPayload as exc:
        raise ProblemError(
            406, "invalid-event", "Invalid webhook payload", str(exc)[:DETAIL_MAX]
        ) from None
    return await _ingest(svc, [event], now)


# --- Postmark and Resend ---------------------------------------------------------------------


def _ignored(provider: str, events: list[ProviderEvent], exc: UnsupportedEvent | None) -> None:
    """Log a body that gave no event (a record or type mailbag does not keep, or one it
    does not know): answered 200 all the same, so the provider does not resend it."""
    if exc is not None:
        log.get("mailbag.webhooks").warning(
            "provider_event_unknown", provider=provider, name=exc.event_name
        )
    elif not events:
        log.get("mailbag.webhooks").info("provider_event_ignored", provider=provider)


@router.post("/postmark", responses=RESPONSES)
async def postmark_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """Postmark webhook records (one a request). Postmark does not sign them: the secret
    is the password of the webhook URL's userinfo, or X-Mailbag-Webhook-Secret."""
    _check_secret(request, svc.settings.postmark_webhook_secret, "postmark")
    try:
        events = parse_postmark_webhook(await request.json())
    except UnsupportedEvent as exc:
        _ignored("postmark", [], exc)
        return {**(await _ingest(svc, [], now)), "ignored": 1}
    except (ValueError, RecursionError) as exc:  # not JSON (InvalidPayload is a ValueError)
        raise _invalid("Invalid webhook payload", exc) from None
    _ignored("postmark", events, None)
    return {**(await _ingest(svc, events, now)), **({} if events else {"ignored": 1})}


@router.post("/resend", responses=RESPONSES)
async def resend_webhook(request: Request, svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """Resend webhook events (one a request), signed by Svix with RESEND_WEBHOOK_SECRET."""
    secret = svc.settings.resend_webhook_secret
    if secret is None:  # not configured: the endpoint does not exist
        raise not_found("resend webhooks are not enabled")
    body = await request.body()
    try:
        event_id = verify_resend_signature(
            secret.get_secret_value(), request.headers, body, now=now.timestamp()
        )
    except ResendUnsigned as exc:
        raise unauthorized(str(exc), 'Signature realm="mailbag resend"') from None
    except InvalidResendSignature as exc:
        raise ProblemError(
            403, "invalid-signature", "Invalid signature", str(exc)[:DETAIL_MAX]
        ) from None
    try:
        events = parse_resend_webhook(json.loads(body), event_id)
    except UnsupportedEvent as exc:
        _ignored("resend", [], exc)
        return {**(await _ingest(svc, [], now)), "ignored": 1}
    except (ValueError, RecursionError) as exc:  # not JSON (InvalidPayload is a ValueError)
        raise _invalid("Invalid webhook payload", exc) from None
    _ignored("resend", events, None)
    return {**(await _ingest(svc, events, now)), **({} if events else {"ignored": 1})}
