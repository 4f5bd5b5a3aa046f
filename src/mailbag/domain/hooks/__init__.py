"""Event hooks: what a tenant subscribes to, where it may be sent, how it is signed, how
each delivery moves, and what a receiver gets. One module per concern:

- events.py: the events (`HookEvent`) and which message change or provider event is which;
- endpoints.py: an endpoint, the rules of its fields, how its events are stored;
- urls.py: where a hook may be sent (checked at registration and at every connection);
- signing.py: Standard Webhooks signatures (`sign`, `verify`) and secrets sealed at rest;
- deliveries.py: a delivery's machine (`DELIVERIES`), its record, the endpoint `Breaker`;
- payloads.py: the JSON a receiver gets.

Every delivery is one event for one endpoint, written in the transaction that changed the
message, and a worker POSTs it until the endpoint answers 2xx or the attempts are spent.
The names below are the package's public face (`from mailbag.domain.hooks import verify`,
as a receiver does). Pure: no I/O.
"""

from __future__ import annotations

from mailbag.domain.breaker import Breaker
from mailbag.domain.hooks.deliveries import (
    CLAIMABLE_DELIVERIES,
    DELIVERIES,
    DELIVERY_TRANSITIONS,
    REPLAYABLE,
    DAction,
    DeliveryEvent,
    DState,
    HookDelivery,
    webhook_id_for,
)
from mailbag.domain.hooks.endpoints import (
    DESCRIPTION_MAX,
    EndpointFields,
    HookEndpoint,
    InvalidHook,
    check_description,
    check_endpoint,
    check_url,
    events_column,
    events_from_column,
    parse_events,
)
from mailbag.domain.hooks.events import (
    ALL_EVENTS,
    FOR_PROVIDER_EVENT,
    FOR_STATUS,
    HookEvent,
)
from mailbag.domain.hooks.payloads import (
    ERROR_MAX,
    MessageFacts,
    payload,
)
from mailbag.domain.hooks.signing import (
    SECRET_BYTES,
    SECRET_PREFIX,
    SIGNATURE_VERSION,
    TOLERANCE_SECONDS,
    InvalidSignature,
    SecretBox,
    WrongHooksKey,
    new_secret,
    parse_secret,
    sign,
    signed_headers,
    verify,
)
from mailbag.domain.hooks.urls import (
    URL_MAX,
    Policy,
    UnsafeUrl,
)

__all__ = [
    "ALL_EVENTS",
    "CLAIMABLE_DELIVERIES",
    "DELIVERIES",
    "DELIVERY_TRANSITIONS",
    "DESCRIPTION_MAX",
    "ERROR_MAX",
    "FOR_PROVIDER_EVENT",
    "FOR_STATUS",
    "REPLAYABLE",
    "SECRET_BYTES",
    "SECRET_PREFIX",
    "SIGNATURE_VERSION",
    "TOLERANCE_SECONDS",
    "URL_MAX",
    "Breaker",
    "DAction",
    "DState",
    "DeliveryEvent",
    "EndpointFields",
    "HookDelivery",
    "HookEndpoint",
    "HookEvent",
    "InvalidHook",
    "InvalidSignature",
    "MessageFacts",
    "Policy",
    "SecretBox",
    "UnsafeUrl",
    "WrongHooksKey",
    "check_description",
    "check_endpoint",
    "check_url",
    "events_column",
    "events_from_column",
    "new_secret",
    "parse_events",
    "parse_secret",
    "payload",
    "sign",
    "signed_headers",
    "verify",
    "webhook_id_for",
]
