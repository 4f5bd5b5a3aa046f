"""A Python client for mailbag's HTTP API: `Client` (blocking) and `AsyncClient`, on httpx.

Every call that creates something carries an Idempotency-Key (one per call unless given)
and is retried with backoff on no answer, 429 and 502/503/504, with the same key: a retry
never sends an email twice. Error answers are raised as typed exceptions
(client/errors.py). Imports only httpx and pydantic, not the server.
"""

from __future__ import annotations

from mailbag.client.clients import AsyncClient, Client
from mailbag.client.errors import (
    ActiveVerificationExists,
    APIError,
    AuthenticationFailed,
    BadRequest,
    Conflict,
    ConnectionFailed,
    FieldError,
    Gone,
    IdempotencyKeyReused,
    Locked,
    MailbagError,
    NotCancellable,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    ValidationError,
)
from mailbag.client.models import (
    Address,
    Attachment,
    AttachmentInfo,
    BatchItemResult,
    BatchResult,
    Event,
    Message,
    MessagePage,
    MessageStatus,
    Problem,
    Recipients,
    Verification,
    VerificationState,
)
from mailbag.client.operations import Draft, draft
from mailbag.client.retry import NO_RETRIES, RetryPolicy

__all__ = [
    "NO_RETRIES",
    "APIError",
    "ActiveVerificationExists",
    "Address",
    "AsyncClient",
    "Attachment",
    "AttachmentInfo",
    "AuthenticationFailed",
    "BadRequest",
    "BatchItemResult",
    "BatchResult",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Draft",
    "Event",
    "FieldError",
    "Gone",
    "IdempotencyKeyReused",
    "Locked",
    "MailbagError",
    "Message",
    "MessagePage",
    "MessageStatus",
    "NotCancellable",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "Problem",
    "RateLimited",
    "Recipients",
    "RetryPolicy",
    "ServerError",
    "ServiceUnavailable",
    "ValidationError",
    "Verification",
    "VerificationState",
    "draft",
]
