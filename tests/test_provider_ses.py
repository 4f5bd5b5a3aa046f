"""The SES provider against real HTTP: moto's SES server, and tiny scripted servers for failures.

Every failing case also checks that exactly one request reached the server: botocore's own
retries are off, because a retried read timeout could deliver an email twice.
"""

from __future__ import annotations

import asyncio
import base64
import email
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import botocore.session
import dkim as dkimpy
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    NoRegionError,
    ParamValidationError,
    ReadTimeoutError,
    SSLError,
)
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.server import ThreadedMotoServer
from moto.ses.models import ses_backends
from moto.sesv2.responses import SESV2Response

from mailbag.domain import dkim
from mailbag.domain.delivery import Accepted, Ambiguous, Deferred, Disabled, Rejected, Throttled
from mailbag.providers import create
from mailbag.providers.ses import MESSAGE_ID_TAG, TENANT_ID_TAG, SESProvider, outcome_for
from mailbag.settings import Settings

from helpers import check_full_delivery, full_email, outgoing_email

pytestmark = pytest.mark.timeout(60)

REGION = "us-east-1"
SENDER = "sender@example.com"
SHORT_READ_TIMEOUT = 0.5


# --- environment --------------------------------------------------------------------------


def _isolate_from_host_aws_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    empty = tmp_path / "empty-aws-config"
    empty.write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    # Otherwise botocore asks the EC2 metadata service for credentials, slowly.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _isolate_from_host_aws_config(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    # A deployment's retry settings must not bring botocore's retries back.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("AWS_RETRY_MODE", "legacy")


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _isolate_from_host_aws_config(monkeypatch, tmp_path)


ProviderFactory = Callable[..., SESProvider]


@pytest.fixture
async def make_provider() -> AsyncIterator[ProviderFactory]:
    providers: list[SESProvider] = []

    def make(
        endpoint_url: str,
        *,
        region: str = REGION,
        read_timeout: float = 5.0,
        concurrency: int = 4,
        configuration_set: str | None = None,
    ) -> SESProvider:
        provider = SESProvider(
            region=region,
            endpoint_url=endpoint_url,
            configuration_set=configuration_set,
            max_connections=concurrency,
            connect_timeout=2.0,
            read_timeout=read_timeout,
        )
        providers.append(provider)
        return provider

    yield make
    for provider in providers:
        await provider.aclose()


# --- moto: a real SES endpoint ------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def verified_sender(moto_url: str, aws_credentials: None) -> str:
    # moto, like SES in the sandbox, refuses senders whose identity is not verified.
    client = botocore.session.get_session().create_client(
        "sesv2", region_name=REGION, endpoint_url=moto_url
    )
    client.create_email_identity(EmailIdentity=SENDER)
    client.close()
    return SENDER


@pytest.fixture
def moto_send_requests(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The SendEmail request bodies moto's server received (moto does not keep the tags)."""
    received: list[dict[str, Any]] = []
    original = SESV2Response.send_email

    def recording_send_email(self: SESV2Response) -> str:
        received.append(json.loads(self.body))
        result: str = original(self)
        return result

    monkeypatch.setattr(SESV2Response, "send_email", recording_send_email)
    return received


def moto_raw_message(provider_message_id: str) -> Any:
    sent = ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages
    return next(message for message in sent if message.id == provider_message_id)


async def test_sends_our_raw_mime_with_its_message_id_recipient_and_tags(
    moto_url: str,
    verified_sender: str,
    moto_send_requests: list[dict[str, Any]],
    make_provider: ProviderFactory,
) -> None:
    provider = make_provider(moto_url, configuration_set="transactional")
    sent = outgoing_email(1, from_email=verified_sender, tenant_id="acme-eu_1")

    outcome = await provider.send(sent)

    assert isinstance(outcome, Accepted)
    stored = moto_raw_message(outcome.provider_message_id)
    assert sent.to_email in stored.destinations
    received_mime = email.message_from_string(stored.raw_data)
    assert received_mime["Message-ID"] == sent.rfc_message_id
    assert received_mime["X-Mailbag-Message-ID"] == str(sent.message_id)

    (request,) = moto_send_requests
    assert base64.b64decode(request["Content"]["Raw"]["Data"]) == sent.raw  # byte for byte
    assert request["FromEmailAddress"] == verified_sender
    assert request["Destination"] == {"ToAddresses": [sent.to_email]}
    assert request["ConfigurationSetName"] == "transactional"
    assert request["EmailTags"] == [
        {"Name": MESSAGE_ID_TAG, "Value": str(sent.message_id)},
        {"Name": TENANT_ID_TAG, "Value": "acme-eu_1"},
    ]


async def test_every_recipient_is_a_destination_and_bcc_is_in_no_header(
    moto_url: str,
    verified_sender: str,
    moto_send_requests: list[dict[str, Any]],
    make_provider: ProviderFactory,
) -> None:
    sent = full_email(1, from_email=verified_sender)

    outcome = await make_provider(moto_url).send(sent)

    assert isinstance(outcome, Accepted), outcome
    (request,) = moto_send_requests
    assert request["Destination"] == {"ToAddresses": sent.envelope_recipients}
    assert sent.envelope_recipients == [
        "ann@example.com",
        "bob@example.com",
        "carol@example.com",
        "dave.hidden@example.com",
    ]
    # moto records the Destination and adds the header recipients to it: the Bcc is there
    # only because the Destination carried it.
    stored = moto_raw_message(outcome.provider_message_id)
    assert "dave.hidden@example.com" in stored.destinations
    assert stored.raw_data.encode("utf-8") == sent.raw
    check_full_delivery(stored.raw_data.encode("utf-8"), sent)


async def test_a_tenant_id_ses_cannot_carry_as_a_tag_is_left_out(
    moto_url: str,
    verified_sender: str,
    moto_send_requests: list[dict[str, Any]],
    make_provider: ProviderFactory,
) -> None:
    provider = make_provider(moto_url)
    sent = outgoing_email(2, from_email=verified_sender, tenant_id="acme corp/eu")

    assert isinstance(await provider.send(sent), Accepted)

    (request,) = moto_send_requests
    assert request["EmailTags"] == [{"Name": MESSAGE_ID_TAG, "Value": str(sent.message_id)}]
    assert "ConfigurationSetName" not in request


async def test_the_registered_factory_builds_the_provider_and_batches_send_one_by_one(
    moto_url: str, verified_sender: str
) -> None:
    settings = Settings.model_validate(
        {"ses_region": REGION, "ses_endpoint_url": moto_url, "concurrency": 2}
    )
    provider = create("ses", settings)
    try:
        assert isinstance(provider, SESProvider)
        assert (provider.name, provider.max_batch_size) == ("ses", 1)
        assert provider.idempotency_window is None
        batch = [outgoing_email(i, from_email=verified_sender) for i in range(3)]

        outcomes = await provider.send_batch(batch)

        for sent, outcome in zip(batch, outcomes, strict=True):
            assert isinstance(outcome, Accepted)
            raw = moto_raw_message(outcome.provider_message_id).raw_data
            assert sent.rfc_message_id in raw
    finally:
        await provider.aclose()


async def test_an_unverified_sender_is_rejected(
    moto_url: str, aws_credentials: None, make_provider: ProviderFactory
) -> None:
    provider = make_provider(moto_url)

    outcome = await provider.send(outgoing_email(3, from_email="nobody@unverified.example"))

    assert isinstance(outcome, Rejected)
    assert "MessageRejected" in outcome.error


# --- scripted servers: the failures SES and the network can produce -------------------------


class ScriptedSES:
    """An HTTP server on a free local port that answers every request the same scripted way."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler, ScriptedSES], None]) -> None:
        self.answer = answer
        self.requests: list[dict[str, str]] = []  # the headers of each request that arrived
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = threading.Event()  # ends any answer that is hanging on purpose
        self._lock = threading.Lock()
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with scripted._lock:
                    scripted.requests.append(dict(self.headers))
                    scripted.in_flight += 1
                    scripted.most_in_flight = max(scripted.most_in_flight, scripted.in_flight)
                try:
                    scripted.answer(self, scripted)
                finally:
                    with scripted._lock:
                        scripted.in_flight -= 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted_ses() -> Iterator[Callable[..., ScriptedSES]]:
    servers: list[ScriptedSES] = []

    def start(answer: Callable[[BaseHTTPRequestHandler, ScriptedSES], None]) -> ScriptedSES:
        server = ScriptedSES(answer)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def answer_json(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> None:
    payload = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(payload)


def throttled(handler: BaseHTTPRequestHandler, _: ScriptedSES) -> None:
    # SES v2 (rest-json) names the error in this header; botocore drops the part after ':'.
    answer_json(
        handler,
        429,
        {"message": "Maximum sending rate exceeded."},
        {
            "x-amzn-ErrorType": "TooManyRequestsException:http://internal.amazon.com/coral/",
            "Retry-After": "7",
        },
    )


def internal_error(handler: BaseHTTPRequestHandler, _: ScriptedSES) -> None:
    answer_json(handler, 500, {"message": "We encountered an internal error."})


def hangs(_: BaseHTTPRequestHandler, scripted: ScriptedSES) -> None:
    scripted.release.wait(timeout=10)


def closes_without_answering(handler: BaseHTTPRequestHandler, _: ScriptedSES) -> None:
    handler.close_connection = True


def accepts_slowly(handler: BaseHTTPRequestHandler, _: ScriptedSES) -> None:
    time.sleep(0.2)
    answer_json(handler, 200, {"MessageId": "0100-slow"})


def rejects_echoing_the_authorization(handler: BaseHTTPRequestHandler, _: ScriptedSES) -> None:
    answer_json(
        handler,
        400,
        {"message": f"cannot use {handler.headers['Authorization']}"},
        {"x-amzn-ErrorType": "SomeFutureValidationException"},
    )


@pytest.mark.parametrize(
    ("answer", "expected", "error_part"),
    [
        (throttled, Throttled, "TooManyRequestsException"),
        (internal_error, Deferred, "HTTP 500"),
        (hangs, Ambiguous, "ReadTimeoutError"),
        (closes_without_answering, Ambiguous, "ConnectionClosedError"),
    ],
)
async def test_failures_are_classified_and_never_retried_by_botocore(
    aws_credentials: None,
    scripted_ses: Callable[..., ScriptedSES],
    make_provider: ProviderFactory,
    answer: Callable[[BaseHTTPRequestHandler, ScriptedSES], None],
    expected: type[Deferred | Ambiguous],
    error_part: str,
) -> None:
    server = scripted_ses(answer)
    provider = make_provider(server.url, read_timeout=SHORT_READ_TIMEOUT)

    outcome = await provider.send(outgoing_email(4))

    assert isinstance(outcome, expected)
    assert error_part in outcome.error
    # botocore retries inside the call, so once it has returned the count is final.
    assert len(server.requests) == 1


async def test_throttling_passes_on_the_retry_after_hint(
    aws_credentials: None,
    scripted_ses: Callable[..., ScriptedSES],
    make_provider: ProviderFactory,
) -> None:
    server = scripted_ses(throttled)

    outcome = await make_provider(server.url).send(outgoing_email(5))

    assert isinstance(outcome, Throttled)
    assert outcome.retry_after is not None
    assert outcome.retry_after.total_seconds() == 7


async def test_an_unknown_4xx_is_rejected_without_echoing_credentials(
    monkeypatch: pytest.MonkeyPatch,
    aws_credentials: None,
    scripted_ses: Callable[..., ScriptedSES],
    make_provider: ProviderFactory,
) -> None:
    access_key_id = "AKIAIOSFODNN7EXAMPLE"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    server = scripted_ses(rejects_echoing_the_authorization)

    outcome = await make_provider(server.url).send(outgoing_email(6))

    assert isinstance(outcome, Rejected)
    assert "SomeFutureValidationException" in outcome.error
    assert access_key_id in server.requests[0]["Authorization"]  # the server did echo it
    assert access_key_id not in outcome.error
    assert len(server.requests) == 1


async def test_a_closed_port_is_deferred(
    aws_credentials: None, make_provider: ProviderFactory
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens there any more: the connection is refused before anything is sent.

    outcome = await make_provider(f"http://127.0.0.1:{port}").send(outgoing_email(7))

    assert isinstance(outcome, Deferred)
    assert "EndpointConnectionError" in outcome.error


async def test_no_credentials_disables_the_provider_before_any_request(
    no_aws_credentials: None,
    scripted_ses: Callable[..., ScriptedSES],
    make_provider: ProviderFactory,
) -> None:
    server = scripted_ses(accepts_slowly)

    outcome = await make_provider(server.url).send(outgoing_email(8))

    assert isinstance(outcome, Disabled)
    assert "NoCredentialsError" in outcome.reason
    assert server.requests == []


async def test_no_region_disables_the_provider(
    aws_credentials: None, make_provider: ProviderFactory
) -> None:
    outcome = await make_provider("http://127.0.0.1:9", region="").send(outgoing_email(9))

    assert isinstance(outcome, Disabled)
    assert "NoRegionError" in outcome.reason


async def test_sends_run_in_parallel_up_to_the_configured_concurrency(
    aws_credentials: None,
    scripted_ses: Callable[..., ScriptedSES],
    make_provider: ProviderFactory,
) -> None:
    server = scripted_ses(accepts_slowly)
    provider = make_provider(server.url, concurrency=2)

    outcomes = await asyncio.gather(*(provider.send(outgoing_email(i)) for i in range(6)))

    assert outcomes == [Accepted("0100-slow")] * 6
    assert server.most_in_flight == 2


async def test_a_closed_provider_sends_nothing(
    aws_credentials: None,
    scripted_ses: Callable[..., ScriptedSES],
    make_provider: ProviderFactory,
) -> None:
    server = scripted_ses(accepts_slowly)
    provider = make_provider(server.url)
    await provider.aclose()
    await provider.aclose()  # closing twice is harmless

    outcome = await provider.send(outgoing_email(10))

    assert isinstance(outcome, Disabled)
    assert server.requests == []


# --- the error table, for failures a local server cannot easily produce --------------------


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "SendEmail",
    )


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (client_error("AccountSuspendedException", 400), Disabled),
        (client_error("SendingPausedException", 400), Disabled),
        (client_error("UnrecognizedClientException", 403), Disabled),
        (client_error("AccessDeniedException", 403), Rejected),  # may concern one sender only
        (client_error("LimitExceededException", 400), Deferred),
        (client_error("Throttling", 400), Throttled),
        (client_error("ServiceUnavailable", 503), Deferred),
        (client_error("MailFromDomainNotVerifiedException", 400), Rejected),
        (client_error("NotFoundException", 404), Rejected),
        (client_error("SomethingNew", 429), Throttled),
        (client_error("SomethingNew", 502), Deferred),
        (client_error("SomethingNew", 409), Rejected),
        (NoRegionError(), Disabled),
        (ParamValidationError(report="bad"), Rejected),
        (ConnectTimeoutError(endpoint_url="https://email.example"), Deferred),
        (ReadTimeoutError(endpoint_url="https://email.example"), Ambiguous),
        (SSLError(endpoint_url="https://email.example", error="EOF"), Ambiguous),
        (RuntimeError("something nobody foresaw"), Ambiguous),
    ],
)
def test_error_table(error: Exception, expected: type[Any]) -> None:
    assert isinstance(outcome_for(error), expected)


def test_ambiguous_outcomes_are_not_keyed_because_ses_has_no_idempotency_key() -> None:
    outcome = outcome_for(ReadTimeoutError(endpoint_url="https://email.example"))
    assert isinstance(outcome, Ambiguous)
    assert outcome.keyed is False


async def test_a_signed_email_arrives_at_ses_with_a_signature_that_verifies(
    moto_url: str,
    verified_sender: str,
    moto_send_requests: list[dict[str, Any]],
    make_provider: ProviderFactory,
) -> None:
    domain = verified_sender.rpartition("@")[2]
    pair = dkim.generate(dkim.Algorithm.RSA)
    key = dkim.SigningKey(domain, "s1", pair.algorithm, pair.private)
    sent = outgoing_email(1, from_email=verified_sender, dkim=key)

    outcome = await make_provider(moto_url).send(sent)

    assert isinstance(outcome, Accepted)
    (request,) = moto_send_requests
    arrived = base64.b64decode(request["Content"]["Raw"]["Data"])
    assert arrived.startswith(b"DKIM-Signature: ") and arrived == sent.raw
    assert dkimpy.verify(arrived, dnsfunc=lambda name, timeout=5: pair.record.encode())
