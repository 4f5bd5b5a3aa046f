"""Amazon SES (API v2) through botocore: our own raw MIME, one email per call.

We send `Content.Raw`, so the MIME we built, and with it our stable Message-ID, is what
recipients receive. botocore is synchronous: calls run in a thread pool of `max_connections`
threads (MAILBAG_CONCURRENCY), all through one shared client (botocore clients are
thread-safe).

botocore's own retries are switched off. A retry after a read timeout re-sends an email SES
may already have taken, and SES has no idempotency key to deduplicate it; the outbox
decides what to retry, from the outcome this module reports (see `ERROR_OUTCOMES`).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from email.errors import MessageError
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
    InvalidRegionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ProfileNotFound,
    ProxyConnectionError,
    ReadTimeoutError,
    ResponseStreamingError,
    SSLError,
)

from mailbag.compose import OutgoingEmail
from mailbag.domain import delivery
from mailbag.providers import register
from mailbag.providers.base import Capabilities, SendOneByOne
from mailbag.providers.kit import (
    OutcomeTable,
    ascii_envelope_address,
    failure_outcome,
    first_match,
    retry_after,
    scrub,
)

if TYPE_CHECKING:
    from mailbag.settings import Settings

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
DEFAULT_READ_TIMEOUT: Final = 30.0

MESSAGE_ID_TAG: Final = "mailbag_message_id"
TENANT_ID_TAG: Final = "mailbag_tenant_id"
# SES accepts only these characters in tag names and values.
_TAG_VALUE = re.compile(r"[A-Za-z0-9_-]{1,256}")

ERROR_OUTCOMES: Final[OutcomeTable] = (
    # SES answered with an error code: it did not take the message. Throttled: the send
    # rate (or the daily quota) was reached; no attempt spent, the fleet slows down.
    ("Throttling", delivery.Throttled),
    ("ThrottlingException", delivery.Throttled),
    ("TooManyRequestsException", delivery.Throttled),
    ("LimitExceededException", delivery.Deferred),
    ("InternalFailure", delivery.Deferred),
    ("ServiceUnavailable", delivery.Deferred),
    ("AccountSuspendedException", delivery.Disabled),
    ("SendingPausedException", delivery.Disabled),
    # Bad or expired credentials are the account's problem, never the message's.
    ("UnrecognizedClientException", delivery.Disabled),
    ("InvalidClientTokenId", delivery.Disabled),
    ("InvalidSignatureException", delivery.Disabled),
    ("SignatureDoesNotMatch", delivery.Disabled),
    ("IncompleteSignature", delivery.Disabled),
    ("MissingAuthenticationTokenException", delivery.Disabled),
    ("ExpiredToken", delivery.Disabled),
    ("ExpiredTokenException", delivery.Disabled),
    ("MessageRejected", delivery.Rejected),
    ("BadRequestException", delivery.Rejected),
    ("MailFromDomainNotVerifiedException", delivery.Rejected),
    ("NotFoundException", delivery.Rejected),
    # SES answered with a code not named above: go by the HTTP status.
    (408, delivery.Deferred),  # the request did not arrive in time, so nothing was taken
    (429, delivery.Throttled),
    (range(500, 600), delivery.Deferred),
    (range(400, 500), delivery.Rejected),
    # No usable configuration: nothing was sent, and nothing will be until an operator acts.
    (NoCredentialsError, delivery.Disabled),
    (PartialCredentialsError, delivery.Disabled),
    (CredentialRetrievalError, delivery.Disabled),
    (ProfileNotFound, delivery.Disabled),
    (NoRegionError, delivery.Disabled),
    (InvalidRegionError, delivery.Disabled),
    # botocore refused the request before sending it; the same email would fail again.
    (ParamValidationError, delivery.Rejected),
    # The request never left: no connection was made.
    (EndpointConnectionError, delivery.Deferred),
    (ConnectTimeoutError, delivery.Deferred),
    (ProxyConnectionError, delivery.Deferred),
    # The request may have left and no verdict came back. An SSL error usually means a
    # failed handshake, but it can also break a response mid-read, so it stays ambiguous.
    (ReadTimeoutError, delivery.Ambiguous),
    (ConnectionClosedError, delivery.Ambiguous),
    (ResponseStreamingError, delivery.Ambiguous),
    (IncompleteReadError, delivery.Ambiguous),
    (SSLError, delivery.Ambiguous),
    (HTTPClientError, delivery.Ambiguous),
)
"""How each way an SES call can fail maps to an outcome; first match wins.

A `str` key is an SES error code; an `int` or `range` is the HTTP status of an SES error
answer whose code is not listed; an exception class is a failure inside botocore. Anything
not matched is Ambiguous: we cannot prove SES did not take the message. Success is
`Accepted(MessageId)`.
"""

# AWS credentials, should a server echo them (the Authorization header names the key id).
AWS_SECRETS: Final = (
    (re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|ANPA|ANVA|AGPA)[A-Z0-9]{12,}\b"), "[access key id]"),
    (re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])"), "[redacted]"),
)


def outcome_for(error: Exception) -> delivery.SendOutcome:
    """Classify a failed `send_email` call through `ERROR_OUTCOMES`."""
    hint: timedelta | None = None
    if isinstance(error, ClientError):
        code, status, headers = _error_details(error)
        text = f"SES {code} (HTTP {status}): {_error_message(error)}"
        found = first_match(ERROR_OUTCOMES, code=code, status=status)
        hint = retry_after(headers)
    else:
        text = f"SES {type(error).__name__}: {error}"
        found = first_match(ERROR_OUTCOMES, error=error)
    # Not keyed: SES has no idempotency key, so no retry of this request is deduplicated.
    return failure_outcome(found, scrub(text, patterns=AWS_SECRETS), keyed=False, retry_after=hint)


def _error_details(error: ClientError) -> tuple[str, int | None, Mapping[str, str]]:
    response: dict[str, Any] = error.response
    code = str(response.get("Error", {}).get("Code") or "Unknown")
    metadata: dict[str, Any] = response.get("ResponseMetadata", {})
    status = metadata.get("HTTPStatusCode")
    headers: Mapping[str, str] = metadata.get("HTTPHeaders", {})
    return code, status if isinstance(status, int) else None, headers


def _error_message(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Message") or "no message")


class SESProvider(SendOneByOne):
    name = "ses"
    max_batch_size = 1  # SES has no call that sends several distinct raw messages
    capabilities = Capabilities(  # SES documents no SMTPUTF8 support
        utf8_local_part=False, spf="include:amazonses.com", sends_raw_mime=True
    )
    idempotency_window: timedelta | None = None  # no idempotency key: ambiguous means unknown

    def __init__(
        self,
        *,
        region: str | None,
        endpoint_url: str | None = None,
        configuration_set: str | None = None,
        max_connections: int = 32,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
    ) -> None:
        # An empty region lets botocore fall back to AWS_REGION / AWS_DEFAULT_REGION.
        self._region = region or None
        self._endpoint_url = endpoint_url
        self._configuration_set = configuration_set
        self._config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            # One attempt in total, whatever AWS_MAX_ATTEMPTS or a config file says.
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max_connections,
            tcp_keepalive=True,
            user_agent_extra="mailbag",
        )
        self._executor = ThreadPoolExecutor(
            max_workers=max_connections, thread_name_prefix="mailbag-ses"
        )
        # Created on first use, in a pool thread: resolving credentials may read files or
        # call the instance metadata service, and a failure is a send outcome, not a crash.
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings) -> SESProvider:
        return cls(
            region=settings.ses_region,
            endpoint_url=settings.ses_endpoint_url,
            configuration_set=settings.ses_configuration_set,
            max_connections=settings.concurrency,
        )

    async def send(self, email: OutgoingEmail) -> delivery.SendOutcome:
        if self._closed:
            return delivery.Disabled("the SES provider is closed")
        try:
            request = self._request(email)
        except (ValueError, MessageError) as error:
            return delivery.Rejected(
                scrub(f"cannot build the SES request: {error}", patterns=AWS_SECRETS)
            )
        loop = asyncio.get_running_loop()
        try:
            pending = loop.run_in_executor(self._executor, partial(self._send_blocking, request))
        except RuntimeError:  # aclose() shut the pool down after the check above
            return delivery.Disabled("the SES provider is closed")
        return await pending

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Sends already handed to the pool finish (each is bounded by the timeouts).
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        if self._client is not None:
            self._client.close()
            self._client = None

    def _request(self, email: OutgoingEmail) -> dict[str, Any]:
        tags = [{"Name": MESSAGE_ID_TAG, "Value": str(email.message_id)}]
        if _TAG_VALUE.fullmatch(email.tenant_id):
            tags.append({"Name": TENANT_ID_TAG, "Value": email.tenant_id})
        request: dict[str, Any] = {
            # SES takes ASCII envelope addresses only: it documents no SMTPUTF8 support.
            "FromEmailAddress": ascii_envelope_address("ses", email.from_email),
            # Every envelope recipient as a To destination: SES delivers to the Destination
            # and leaves the raw headers alone, so Cc shows as written and Bcc nowhere.
            "Destination": {
                "ToAddresses": [
                    ascii_envelope_address("ses", address) for address in email.envelope_recipients
                ]
            },
            "Content": {"Raw": {"Data": email.raw}},
            "EmailTags": tags,
        }
        if self._configuration_set:
            request["ConfigurationSetName"] = self._configuration_set
        return request

    def _send_blocking(self, request: dict[str, Any]) -> delivery.SendOutcome:
        try:
            response: dict[str, Any] = self._shared_client().send_email(**request)
        except Exception as error:
            return outcome_for(error)
        message_id = response.get("MessageId")
        if not isinstance(message_id, str) or not message_id:
            return delivery.Ambiguous("SES answered success without a MessageId", keyed=False)
        return delivery.Accepted(message_id)

    def _shared_client(self) -> Any:
        if self._client is not None:
            return self._client
        with self._client_lock:
            if self._client is None:
                self._client = botocore.session.get_session().create_client(
                    "sesv2",
                    region_name=self._region,
                    endpoint_url=self._endpoint_url,
                    config=self._config,
                )
            return self._client


register("ses")(SESProvider.from_settings)
