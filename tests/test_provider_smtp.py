"""The SMTP provider against a real SMTP server (aiosmtpd, tests/smtp_server.py).

Nothing outside is mocked: every outcome below comes from a real conversation over TCP,
with the failure injected by the server at the phase under test.
"""

from __future__ import annotations

import asyncio
import base64
import email
import email.policy
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from mailbag import providers
from mailbag.domain.delivery import Accepted, Ambiguous, Deferred, Disabled, Rejected, Throttled
from mailbag.providers.base import Provider
from mailbag.providers.smtp import (
    OUTCOME_TABLE,
    Failure,
    Phase,
    SMTPProvider,
    provider_message_id,
)
from mailbag.settings import Settings

import smtp_server as smtp_server_module
from helpers import check_full_delivery, full_email, outgoing_email
from smtp_server import DROP, HANG, PASSWORD, USERNAME, RecordingSMTPServer

ServerFactory = Callable[..., RecordingSMTPServer]
ProviderFactory = Callable[..., SMTPProvider]
WRONG_PASSWORD = "hunter2-not-the-password"


# --- fixtures (shared ones will move to conftest.py) -------------------------------------


@pytest.fixture(params=["pipelining", "one-by-one"])
def make_smtp_server(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ServerFactory]:
    """Start a RecordingSMTPServer with the given options; all are closed after the test.

    Every test runs twice: against a server that offers PIPELINING (aiosmtpd reads commands
    line by line, so it takes pipelined ones; it just does not say so) and one that does not.
    """
    started: list[RecordingSMTPServer] = []
    if request.param == "pipelining":
        monkeypatch.setattr(smtp_server_module._Handler, "handle_EHLO", _offering_pipelining)

    def make(**options: Any) -> RecordingSMTPServer:
        server = RecordingSMTPServer(**options)
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()


_plain_ehlo = smtp_server_module._Handler.handle_EHLO


async def _offering_pipelining(
    self: Any, server: Any, session: Any, envelope: Any, hostname: str, lines: list[str]
) -> list[str]:
    lines = await _plain_ehlo(self, server, session, envelope, hostname, lines)
    return [*lines[:-1], "250-PIPELINING", lines[-1]]


@pytest.fixture
def smtp_server(make_smtp_server: ServerFactory) -> RecordingSMTPServer:
    """A plain-text server: no TLS, no AUTH."""
    return make_smtp_server()


def smtp_settings(server: RecordingSMTPServer, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "provider": "smtp",
        "smtp_host": server.host,
        "smtp_port": server.port,
        "smtp_tls": "none",
        "smtp_timeout": 5.0,
        "concurrency": 4,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
async def make_provider() -> AsyncIterator[ProviderFactory]:
    """SMTPProviders for a server (or plain settings); each is closed after the test."""
    made: list[SMTPProvider] = []

    def make(server: RecordingSMTPServer | None = None, **overrides: Any) -> SMTPProvider:
        settings = smtp_settings(server, **overrides) if server else Settings(**overrides)
        provider = SMTPProvider.from_settings(settings)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        await provider.aclose()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --- delivery ------------------------------------------------------------------------------


async def test_delivers_the_message_as_composed(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    # Lines starting with "." must survive the transparency procedure (dot-stuffing).
    sent = outgoing_email(1, text=".starts with a dot\n..and two\nlast line")
    provider = make_provider(smtp_server)

    outcome = await provider.send(sent)

    [received] = smtp_server.arrived
    assert isinstance(outcome, Accepted)
    assert received.queue_id in outcome.provider_message_id
    assert received.mail_from == "sender@example.com"
    assert received.rcpt_tos == ("user1@example.com",)
    assert received.message_id == sent.rfc_message_id
    parsed = email.message_from_bytes(received.raw, policy=email.policy.default)
    assert parsed["Subject"] == "Hello 1"
    assert parsed["X-Mailbag-Message-ID"] == str(sent.message_id)
    text_part = parsed.get_body(("plain",))
    assert text_part is not None
    assert text_part.get_content().splitlines() == [".starts with a dot", "..and two", "last line"]


async def test_every_recipient_is_in_the_envelope_and_bcc_in_no_header(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    sent = full_email(1)

    outcome = await make_provider(smtp_server).send(sent)

    assert isinstance(outcome, Accepted), outcome
    [received] = smtp_server.arrived
    # One transaction: RCPT TO for both To, the Cc and the Bcc.
    assert received.rcpt_tos == (
        "ann@example.com",
        "bob@example.com",
        "carol@example.com",
        "dave.hidden@example.com",
    )
    check_full_delivery(received.raw, sent)


async def test_a_bcc_with_a_non_ascii_local_part_needs_smtputf8(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    from mailbag.domain.content import Address, Recipients

    sent = outgoing_email(
        1,
        recipients=Recipients(to=(Address("ann@example.com"),), bcc=(Address("zoë@example.com"),)),
    )
    assert sent.needs_smtputf8

    assert isinstance(await make_provider(smtp_server).send(sent), Accepted)

    [received] = smtp_server.arrived
    assert received.rcpt_tos == ("ann@example.com", "zoë@example.com")
    assert "zoë".encode() not in received.raw


async def test_recipients_the_server_refuses_are_left_out_and_named_in_the_outcome(
    smtp_server: RecordingSMTPServer,
    make_provider: ProviderFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    smtp_server.inject("rcpt", "550 5.1.1 No such user", recipient="carol@example.com")
    smtp_server.inject("rcpt", "452 4.2.2 Mailbox full", recipient="dave.hidden@example.com")
    sent = full_email(2)

    with caplog.at_level("WARNING", logger="mailbag.providers.smtp"):
        outcome = await make_provider(smtp_server).send(sent)

    # Taken for the two To recipients: sent (a retry would send it to them twice).
    assert isinstance(outcome, Accepted), outcome
    [received] = smtp_server.arrived
    assert received.rcpt_tos == ("ann@example.com", "bob@example.com")
    assert outcome.detail == (
        "refused at RCPT TO: carol@example.com: 550 5.1.1 No such user; "
        "dave.hidden@example.com: 452 4.2.2 Mailbox full"
    )
    assert outcome.detail in caplog.text
    # Everyone taken: no detail.
    assert (await make_provider(smtp_server).send(full_email(3))).detail is None


@pytest.mark.parametrize(
    ("replies", "expected"),
    [
        (("550 5.1.1 No such user", "550 5.1.1 No such user"), Rejected),
        (("550 5.1.1 No such user", "451 4.3.0 Try again later"), Deferred),
        (("550 5.1.1 No such user", "530 5.7.0 Authentication required"), Disabled),
    ],
)
async def test_when_every_recipient_is_refused_the_most_hopeful_reply_decides(
    smtp_server: RecordingSMTPServer,
    make_provider: ProviderFactory,
    replies: tuple[str, str],
    expected: type,
) -> None:
    from mailbag.domain.content import Address, Recipients

    sent = outgoing_email(
        3,
        recipients=Recipients(to=(Address("ann@example.com"),), cc=(Address("bob@example.com"),)),
    )
    smtp_server.inject("rcpt", replies[0], recipient="ann@example.com")
    smtp_server.inject("rcpt", replies[1], recipient="bob@example.com")
    provider = make_provider(smtp_server)

    outcome = await provider.send(sent)

    assert type(outcome) is expected, outcome
    text = str(outcome)
    assert "ann@example.com: " + replies[0] in text and "bob@example.com: " + replies[1] in text
    assert smtp_server.arrived == []  # no DATA: nothing was sent
    # The connection was reset and serves the next email.
    assert isinstance(await provider.send(outgoing_email(4)), Accepted)
    assert smtp_server.connections_opened == 1


async def test_without_a_queue_id_in_the_reply_the_message_id_identifies_it(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(queue_ids=False)  # answers a bare "250 OK"
    sent = outgoing_email(2)

    outcome = await make_provider(server).send(sent)

    assert outcome == Accepted(provider_message_id=sent.rfc_message_id)


async def test_is_registered_as_the_smtp_provider(smtp_server: RecordingSMTPServer) -> None:
    provider = providers.create("smtp", smtp_settings(smtp_server))
    try:
        assert isinstance(provider, SMTPProvider)
        assert isinstance(provider, Provider)
        assert provider.idempotency_window is None  # no key: ambiguity must mean unknown
        assert isinstance(await provider.send(outgoing_email(3)), Accepted)
    finally:
        await provider.aclose()


async def test_internationalized_address_goes_out_with_smtputf8(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    outcome = await make_provider(smtp_server).send(outgoing_email(4, to_email="jürgen@exämple.de"))

    assert isinstance(outcome, Accepted)
    [received] = smtp_server.arrived
    assert received.rcpt_tos == ("jürgen@xn--exmple-cua.de",)  # domain in IDNA form


async def test_internationalized_address_is_rejected_when_smtputf8_is_missing(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(smtputf8=False)

    outcome = await make_provider(server).send(outgoing_email(5, to_email="jürgen@example.de"))

    assert isinstance(outcome, Rejected)
    assert "SMTPUTF8" in outcome.error
    assert server.arrived == []


# --- the connection pool -------------------------------------------------------------------


async def test_reuses_one_connection_for_consecutive_sends(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server)

    outcomes = [await provider.send(outgoing_email(i)) for i in range(5)]

    assert all(isinstance(outcome, Accepted) for outcome in outcomes)
    assert len(smtp_server.accepted) == 5
    assert smtp_server.connections_opened == 1


async def test_concurrent_sends_never_open_more_connections_than_the_bound(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server, concurrency=4)
    emails = [outgoing_email(i) for i in range(40)]

    outcomes = await asyncio.gather(*(provider.send(sent) for sent in emails))

    assert all(isinstance(outcome, Accepted) for outcome in outcomes)
    assert smtp_server.message_id_counts() == {sent.rfc_message_id: 1 for sent in emails}
    assert smtp_server.max_concurrent_connections <= 4
    assert smtp_server.connections_opened <= 4


async def test_a_refusal_keeps_the_connection_for_the_next_send(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server)
    smtp_server.inject("rcpt", "550 5.1.1 No such user")

    first = await provider.send(outgoing_email(1))
    second = await provider.send(outgoing_email(2))

    assert isinstance(first, Rejected)
    assert isinstance(second, Accepted)  # RSET cleared the refused transaction
    assert [m.rcpt_tos for m in smtp_server.accepted] == [("user2@example.com",)]
    assert smtp_server.connections_opened == 1


async def test_reconnects_after_the_server_closed_an_idle_connection(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server)
    assert isinstance(await provider.send(outgoing_email(1)), Accepted)

    assert smtp_server.close_connections() == 1  # as an idle timeout would
    await asyncio.sleep(0.05)  # let the client see the FIN
    outcome = await provider.send(outgoing_email(2))

    assert isinstance(outcome, Accepted)
    assert smtp_server.connections_opened == 2
    assert len(smtp_server.accepted) == 2


async def test_a_pooled_connection_dead_at_mail_from_is_retried_once_on_a_new_one(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server)
    assert isinstance(await provider.send(outgoing_email(1)), Accepted)
    # The reused connection dies at MAIL FROM, before the client could notice it idle.
    smtp_server.inject("mail", DROP)

    outcome = await provider.send(outgoing_email(2))

    assert isinstance(outcome, Accepted)
    assert smtp_server.connections_opened == 2
    assert [m.rcpt_tos for m in smtp_server.accepted] == [
        ("user1@example.com",),
        ("user2@example.com",),
    ]


async def test_the_stale_connection_retry_happens_only_once(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server)
    assert isinstance(await provider.send(outgoing_email(1)), Accepted)
    smtp_server.inject("mail", DROP, times=2)  # the fresh connection fails the same way

    outcome = await provider.send(outgoing_email(2))

    assert isinstance(outcome, Deferred)
    assert "MAIL FROM" in outcome.error
    assert smtp_server.connections_opened == 2


async def test_survives_a_server_restart(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server)
    assert isinstance(await provider.send(outgoing_email(1)), Accepted)

    smtp_server.stop()
    while_down = await provider.send(outgoing_email(2))
    smtp_server.start()
    after = await provider.send(outgoing_email(3))

    assert isinstance(while_down, Deferred)
    assert isinstance(after, Accepted)
    assert smtp_server.connections_opened == 2  # the pooled one died with the old server


async def test_aclose_quits_the_idle_connections(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server)
    await asyncio.gather(*(provider.send(outgoing_email(i)) for i in range(8)))
    assert smtp_server.open_connections >= 1

    await provider.aclose()

    assert smtp_server.wait_until(lambda: smtp_server.open_connections == 0, timeout=5)


# --- TLS -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["starttls", "auto"])
async def test_starttls_verified_against_a_private_ca(
    mode: str, make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(starttls=True)
    provider = make_provider(server, smtp_tls=mode, smtp_ca_file=server.ca_file)

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Accepted)
    [received] = server.arrived
    assert received.tls


@pytest.mark.parametrize(
    ("server_tls", "mode", "phase"),
    [("starttls", "auto", "STARTTLS"), ("implicit_tls", "implicit", "connect")],
)
async def test_an_untrusted_certificate_is_deferred_never_downgraded(
    server_tls: str,
    mode: str,
    phase: str,
    make_smtp_server: ServerFactory,
    make_provider: ProviderFactory,
) -> None:
    server = make_smtp_server(**{server_tls: True})
    provider = make_provider(server, smtp_tls=mode)  # the test CA is not trusted

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Deferred)
    assert f", {phase}: " in outcome.error
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.error
    assert server.arrived == []
    if server_tls == "starttls":  # an implicit-TLS handshake fails before any session exists
        assert server.wait_until(lambda: len(server.errors) == 1, timeout=5)


async def test_verification_can_be_switched_off(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(starttls=True)
    provider = make_provider(server, smtp_tls="starttls", smtp_tls_verify=False)

    assert isinstance(await provider.send(outgoing_email(1)), Accepted)
    assert server.arrived[0].tls


async def test_implicit_tls(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(implicit_tls=True)
    provider = make_provider(server, smtp_tls="implicit", smtp_ca_file=server.ca_file)

    outcomes = [await provider.send(outgoing_email(i)) for i in range(2)]

    assert all(isinstance(outcome, Accepted) for outcome in outcomes)
    assert all(received.tls for received in server.arrived)
    assert server.connections_opened == 1


async def test_required_starttls_that_is_not_offered_disables_sending(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server, smtp_tls="starttls")

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Disabled)
    assert "does not offer STARTTLS" in outcome.reason
    assert smtp_server.arrived == []


# --- AUTH ------------------------------------------------------------------------------------


async def test_authenticates_over_starttls(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(starttls=True, auth=True, auth_require_tls=True)
    provider = make_provider(
        server,
        smtp_tls="starttls",
        smtp_ca_file=server.ca_file,
        smtp_username=USERNAME,
        smtp_password=PASSWORD,
    )

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Accepted)
    assert server.arrived[0].authenticated_as == USERNAME


async def test_a_wrong_password_disables_sending_without_revealing_it(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(auth=True)
    provider = make_provider(server, smtp_username=USERNAME, smtp_password=WRONG_PASSWORD)

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Disabled)
    assert "535" in outcome.reason
    assert WRONG_PASSWORD not in outcome.reason
    assert base64.b64encode(WRONG_PASSWORD.encode()).decode() not in outcome.reason
    assert server.auth_attempts >= 1
    assert server.arrived == []


async def test_credentials_are_not_sent_in_clear_text_unless_tls_is_none(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(auth=True)  # offers AUTH but no STARTTLS
    provider = make_provider(
        server, smtp_tls="auto", smtp_username=USERNAME, smtp_password=PASSWORD
    )

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Disabled)
    assert "unencrypted" in outcome.reason
    assert server.auth_attempts == 0


async def test_auth_not_offered_while_credentials_are_set_disables_sending(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(smtp_server, smtp_username=USERNAME, smtp_password=PASSWORD)

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Disabled)
    assert "does not offer AUTH" in outcome.reason


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
async def test_a_server_demanding_auth_we_lack_disables_sending(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(auth_required=True)  # 530 at MAIL FROM

    outcome = await make_provider(server).send(outgoing_email(1))

    assert isinstance(outcome, Disabled)
    assert "530" in outcome.reason


# --- refusals, by phase ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "reply", "expected"),
    [
        ("mail", "451 4.3.0 Try again later", Deferred),
        ("mail", "553 5.7.1 Sender not allowed", Rejected),
        ("rcpt", "451 4.7.1 Greylisted", Deferred),
        ("rcpt", "550 5.1.1 No such user", Rejected),
        ("data", "451 4.3.0 Not now", Deferred),
        ("data", "554 5.7.1 Transaction failed", Rejected),
        # Amazon SES's SMTP interface over its sending rate: no attempt spent.
        ("mail", "454 4.7.0 Throttling failure: Maximum sending rate exceeded.", Throttled),
    ],
)
async def test_a_refusal_before_the_content_is_known_not_delivered(
    at: Any,
    reply: str,
    expected: type[Deferred | Rejected | Throttled],
    smtp_server: RecordingSMTPServer,
    make_provider: ProviderFactory,
) -> None:
    smtp_server.inject(at, reply)

    outcome = await make_provider(smtp_server).send(outgoing_email(1))

    assert isinstance(outcome, expected)
    assert reply in outcome.error
    assert smtp_server.arrived == []


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("451 4.3.0 Queue full", Deferred), ("554 5.6.0 Content rejected", Rejected)],
)
async def test_a_refusal_after_the_content_is_believed(
    reply: str,
    expected: type[Deferred | Rejected],
    smtp_server: RecordingSMTPServer,
    make_provider: ProviderFactory,
) -> None:
    smtp_server.inject("end_of_data", reply)

    outcome = await make_provider(smtp_server).send(outgoing_email(1))

    assert isinstance(outcome, expected)
    assert "end of data" in outcome.error
    [arrived] = smtp_server.arrived
    assert arrived.reply_code == int(reply[:3])


@pytest.mark.parametrize("at", ["mail", "rcpt", "data"])
async def test_a_connection_lost_before_the_content_is_deferred(
    at: Any, smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    smtp_server.inject(at, DROP)

    outcome = await make_provider(smtp_server).send(outgoing_email(1))

    assert isinstance(outcome, Deferred)
    assert smtp_server.arrived == []


# --- the ambiguous case ------------------------------------------------------------------------


async def test_a_connection_lost_after_end_of_data_is_ambiguous(
    smtp_server: RecordingSMTPServer, make_provider: ProviderFactory
) -> None:
    sent = outgoing_email(1)
    smtp_server.inject("end_of_data", DROP)
    provider = make_provider(smtp_server)

    outcome = await provider.send(sent)

    assert isinstance(outcome, Ambiguous)
    assert outcome.keyed is False
    assert "end of data" in outcome.error
    # The server did get it: resending would deliver it twice.
    assert smtp_server.message_ids() == [sent.rfc_message_id]
    assert smtp_server.arrived[0].reply_code is None
    # The broken connection is not reused.
    assert isinstance(await provider.send(outgoing_email(2)), Accepted)
    assert smtp_server.connections_opened == 2


async def test_no_final_reply_within_the_timeout_is_ambiguous(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(hang_seconds=5)
    server.inject("end_of_data", HANG)
    provider = make_provider(server, smtp_timeout=0.5)

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Ambiguous)
    assert "Timeout" in outcome.error
    assert len(server.arrived) == 1


async def test_a_cancelled_send_leaves_no_half_used_connection_behind(
    make_smtp_server: ServerFactory, make_provider: ProviderFactory
) -> None:
    server = make_smtp_server(hang_seconds=5)
    server.inject("end_of_data", HANG)
    provider = make_provider(server, concurrency=1)
    hung = asyncio.create_task(provider.send(outgoing_email(1)))
    while not server.arrived:  # the content is out; the verdict never comes
        await asyncio.sleep(0.01)

    hung.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hung
    # The one slot is free again, and the next send does not inherit the hung conversation.
    outcome = await asyncio.wait_for(provider.send(outgoing_email(2)), timeout=3)

    assert isinstance(outcome, Accepted)
    assert server.connections_opened == 2


# --- no conversation at all ----------------------------------------------------------------------


async def test_a_refused_connection_is_deferred(make_provider: ProviderFactory) -> None:
    provider = make_provider(
        smtp_host="127.0.0.1", smtp_port=free_port(), smtp_tls="none", smtp_timeout=2.0
    )

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Deferred)
    assert "connect" in outcome.error


async def test_a_server_that_never_greets_is_deferred_after_the_timeout(
    make_provider: ProviderFactory,
) -> None:
    async def stay_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up
        writer.close()

    silent = await asyncio.start_server(stay_silent, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    provider = make_provider(
        smtp_host="127.0.0.1", smtp_port=port, smtp_tls="auto", smtp_timeout=0.5
    )
    try:
        started = time.monotonic()
        outcome = await provider.send(outgoing_email(1))
        elapsed = time.monotonic() - started
    finally:
        silent.close()
        await silent.wait_closed()

    assert isinstance(outcome, Deferred)
    assert "connect" in outcome.error
    assert elapsed < 3


# --- the table itself -----------------------------------------------------------------------------


def test_only_a_missing_final_reply_is_ambiguous() -> None:
    replies = {Failure.TEMPORARY, Failure.PERMANENT, Failure.ACCESS}
    for phase, row in OUTCOME_TABLE.items():
        for failure in Failure:
            verdict = getattr(row, failure.name.lower())
            ambiguous = phase is Phase.CONTENT and failure not in replies
            assert (verdict is Ambiguous) == ambiguous, (phase, failure)
    assert set(OUTCOME_TABLE) == set(Phase)


@pytest.mark.parametrize(
    ("reply", "is_queue_id"),
    [
        ("2.0.0 Ok: queued as 4BqF3X1Zz5z9sW", True),  # Postfix
        ("OK id=1rXyZa-000abc-De", True),  # Exim
        ("2.0.0 x8AB12345 Message accepted for delivery", True),  # sendmail
        ("Ok 0100018b2e1f7c3a-5e3a4c1b-0000-000000", True),  # Amazon SES
        ("OK", False),
        ("2.0.0 Ok", False),
        ("Message accepted for delivery", False),
    ],
)
def test_provider_message_id_is_the_reply_when_it_names_a_queue_id(
    reply: str, is_queue_id: bool
) -> None:
    sent = outgoing_email(1)

    expected = reply if is_queue_id else sent.rfc_message_id

    assert provider_message_id(reply, sent) == expected
