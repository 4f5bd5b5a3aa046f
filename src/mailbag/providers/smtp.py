"""`smtp`: any SMTP relay (Postfix, a smarthost, the SMTP endpoints of SES, Brevo, ...).

A send takes a pooled connection (or opens one: connect, EHLO, STARTTLS, AUTH, with
aiosmtplib), then runs the mail transaction on the connection's `Wire` (providers.smtp_wire):
MAIL FROM, RCPT TO for each recipient and DATA, written together when the server offers
PIPELINING (RFC 2920) and one at a time when it does not, their replies read in order;
then the content with its closing ".". Every failure is known by the phase it happened in
(the reply it came with, when pipelined). `OUTCOME_TABLE` turns (phase, kind of failure)
into an outcome; nothing else decides.

The line that matters: once the content's closing "." may have left, only the server's
final reply says what happened. A timeout or a lost connection while waiting for that
reply is Ambiguous: the server may have queued the message, and SMTP has no idempotency
key (`idempotency_window` is None), so mailbag marks it `unknown` and never resends it
blindly. Every failure before that point is known not to have delivered anything: the
content is written only after the server's 354 to DATA, pipelined or not.

Connections: at most `concurrency` are open at once (in use plus idle), opened lazily and
reused newest first. A connection that failed below the reply level (timeout, reset, TLS
error) or whose replies are out of step is closed, never reused. One that got a refusal
reply is kept and reset (RSET) before its next use. A reused connection that turns out
dead at MAIL FROM (the server closed it while it sat idle) is replaced and the message
tried once more on a fresh connection: nothing of it had been sent.

TLS (SMTP_TLS): `implicit` speaks TLS from the first byte (port 465); `starttls` requires
STARTTLS and refuses to go on without it; `auto` upgrades when the server offers STARTTLS;
`none` stays in plain text. Certificates are verified against the system CAs plus
SMTP_CA_FILE; SMTP_TLS_VERIFY=false turns verification off. Credentials are never sent
over an unencrypted connection unless SMTP_TLS=none says so explicitly.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import logging
import re
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

from aiosmtplib import (
    SMTP,
    SMTPHeloError,
    SMTPResponse,
    SMTPResponseException,
)
from aiosmtplib.email import quote_address

from mailbag.compose import OutgoingEmail
from mailbag.domain import delivery, domain_shaping
from mailbag.providers import register
from mailbag.providers.base import Capabilities, SendOneByOne
from mailbag.providers.kit import OutcomeClass, describe, envelope_address, failure_outcome, scrub
from mailbag.providers.smtp_wire import Wire

if TYPE_CHECKING:
    from mailbag.settings import Settings, TLSMode

log = logging.getLogger(__name__)

PROVIDER_MESSAGE_ID_MAX: Final = 255  # the outbox column's width
# How long aclose() waits for each idle connection's QUIT before dropping it.
QUIT_TIMEOUT: Final = 5.0
REPLY_START_INPUT: Final = 354
REPLY_COMPLETED: Final = 250
REPLY_SERVICE_CLOSING: Final = 421
REPLY_ACCESS_DENIED: Final = 530  # "authentication required" / "issue STARTTLS first"


class Phase(enum.Enum):
    """Where in the conversation a send stopped. Everything before CONTENT is known not to
    have delivered anything; CONTENT starts the moment the message bytes are written."""

    PREPARE = "preparing the message"  # building the MIME bytes and the envelope: no I/O yet
    CONNECT = "connect"  # TCP, the implicit-TLS handshake, the server's greeting
    EHLO = "EHLO"
    STARTTLS = "STARTTLS"
    AUTH = "AUTH"
    MAIL = "MAIL FROM"
    RCPT = "RCPT TO"
    DATA = "DATA"  # the DATA command itself, answered before any content is sent
    CONTENT = "end of data"  # content and "." sent (or being sent); waiting for the verdict


class Failure(enum.Enum):
    TEMPORARY = "4xx"  # a reply: try again later
    PERMANENT = "5xx"  # a reply: no
    ACCESS = "530"  # a reply: authenticate (or STARTTLS) first -- our configuration
    NETWORK = "network"  # refused, DNS, reset, closed by the server
    TIMEOUT = "timeout"  # connect or read timeout
    TLS = "tls"  # handshake or certificate failure, a broken TLS record
    NOT_OFFERED = "not offered"  # the server lacks an extension we need (STARTTLS, AUTH, ...)
    OTHER = "other"  # anything else: a malformed reply, an unexpected exception


class Row(NamedTuple):
    temporary: OutcomeClass
    permanent: OutcomeClass
    access: OutcomeClass
    network: OutcomeClass
    timeout: OutcomeClass
    tls: OutcomeClass
    not_offered: OutcomeClass
    other: OutcomeClass


# The domain's outcome classes, one letter each so that a row reads at a glance.
D, R, A, X = delivery.Deferred, delivery.Rejected, delivery.Ambiguous, delivery.Disabled

OUTCOME_TABLE: Final[dict[Phase, Row]] = {
    #                  4xx 5xx 530 network timeout tls not-offered other
    Phase.PREPARE:  Row(R, R, R, R, R, R, R, R),
    Phase.CONNECT:  Row(D, X, X, D, D, D, X, D),
    Phase.EHLO:     Row(D, X, X, D, D, D, X, D),
    Phase.STARTTLS: Row(D, X, X, D, D, D, X, D),
    Phase.AUTH:     Row(D, X, X, D, D, D, X, D),
    Phase.MAIL:     Row(D, R, X, D, D, D, R, D),
    Phase.RCPT:     Row(D, R, X, D, D, D, R, D),
    Phase.DATA:     Row(D, R, X, D, D, D, R, D),
    Phase.CONTENT:  Row(D, R, X, A, A, A, A, A),
}  # fmt: skip
"""How a send that did not end in a 250 to its content becomes an outcome.

A 250 reply to the content is Accepted: `provider_message_id` is the server's reply text
when it carries a queue id ("250 2.0.0 Ok: queued as 4BqF3X"), else the email's Message-ID.
Every other ending is (phase, kind of failure) looked up here:

- PREPARE: the email cannot be expressed in SMTP (bad address, unencodable MIME): Rejected.
- Setting up the session (CONNECT, EHLO, STARTTLS, AUTH): a connection refused, a DNS
  failure, a timeout, a TLS handshake failure or a 4xx is Deferred. A 5xx, a 530, or a
  missing extension we were told to use (STARTTLS with SMTP_TLS=starttls, AUTH when
  SMTP_USERNAME is set, AUTH over plain text) is Disabled: it is not this email's fault
  and every email would fail the same way (AUTH 535 bad credentials is the usual case).
- MAIL FROM, RCPT TO, the DATA command: 4xx Deferred, 5xx Rejected, 530 Disabled; a
  timeout or lost connection Deferred (no content was sent); an address that needs
  SMTPUTF8 when the server lacks it Rejected.
- RCPT TO is sent for every envelope recipient (To, Cc, Bcc) in the one transaction. When
  the server refuses some and takes others, the message goes to those it took: Accepted,
  with the refused ones and their replies as its `detail` (a retry would duplicate the
  email for everyone else). When it
  refuses all of them, that is the RCPT TO failure: with several, the most hopeful reply
  decides (530 before any 4xx before 5xx), and the text lists every recipient's reply.
- CONTENT, after the message bytes started to leave: 4xx Deferred and 5xx Rejected (the
  server answered), 530 Disabled (answered, so not delivered); anything without a reply
  -- timeout, lost connection, TLS error, a garbled reply -- Ambiguous.
- A Deferred 4xx whose text says the sender is over its rate (`THROTTLE_REPLY`: Amazon
  SES's "454 Throttling failure: Maximum sending rate exceeded") is Throttled instead: no
  attempt spent, and the fleet slows down (PROVIDER_RATE).
- A Deferred 421 or 451 to RCPT TO, or a 4.7.x to RCPT TO, DATA or the content, is the
  recipients' domain deferring (`domain_deferral`): DOMAIN_SHAPING slows that domain for
  the fleet.

A reused connection found dead at MAIL FROM (lost, or a 421) is retried once on a fresh
connection before this table is consulted: the server had not seen the message yet.
"""

del D, R, A, X

SESSION_PHASES: Final = frozenset({Phase.CONNECT, Phase.EHLO, Phase.STARTTLS, Phase.AUTH})
# Replies here answer for the recipients' domain (a 4xx may defer the domain: shaping).
RECIPIENT_PHASES: Final = frozenset({Phase.RCPT, Phase.DATA, Phase.CONTENT})

THROTTLE_REPLY: Final = re.compile(r"throttl|rate limit|sending rate", re.IGNORECASE)
_ENHANCED_STATUS = re.compile(r"^\d\.\d{1,3}\.\d{1,3}\s*")
# "queued as 4BqF3X1Zz5z9sW" (Postfix), "id=1rXyZ-000abc-De" (Exim), or a bare token with a
# digit in it, 8+ characters long (sendmail "x8AB12345", SES "0100018b...-000000").
_QUEUE_ID = re.compile(
    r"queued as \S+|\bid=\S+|\b(?=[A-Za-z0-9._-]*\d)[A-Za-z0-9][A-Za-z0-9._-]{7,}", re.IGNORECASE
)
_LINE_START_DOT = re.compile(rb"(?m)^\.")
_BARE_LINE_ENDING = re.compile(rb"\r\n|\r|\n")
# A dot-atom address (what nearly every address is): parseaddr gives it back unchanged and
# it holds nothing that could smuggle a parameter or a command into MAIL FROM / RCPT TO.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_PLAIN_ADDRESS = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")


def outcome_class(phase: Phase, kind: Failure) -> OutcomeClass:
    found: OutcomeClass = getattr(OUTCOME_TABLE[phase], kind.name.lower())
    return found


def classify(exc: BaseException) -> Failure:
    """The kind of failure an exception from aiosmtplib (or the socket below) stands for."""
    if isinstance(exc, SMTPResponseException) and 400 <= exc.code < 600:
        if exc.code == REPLY_ACCESS_DENIED:
            return Failure.ACCESS
        return Failure.TEMPORARY if exc.code < 500 else Failure.PERMANENT
    if _caused_by(exc, ssl.SSLError):
        return Failure.TLS
    if isinstance(exc, TimeoutError):  # aiosmtplib's timeouts subclass it
        return Failure.TIMEOUT
    if isinstance(exc, OSError):  # ConnectionError, gaierror, SMTPServerDisconnected, ...
        return Failure.NETWORK
    return Failure.OTHER


def provider_message_id(reply_text: str, email: OutgoingEmail) -> str:
    """The server's final reply when it names a queue id, else our own Message-ID."""
    text = " ".join(reply_text.split())
    if _QUEUE_ID.search(_ENHANCED_STATUS.sub("", text)):
        return text[:PROVIDER_MESSAGE_ID_MAX]
    return email.rfc_message_id


class StepFailed(Exception):
    """A step of the SMTP conversation failed: where, what kind, and what to tell people."""

    def __init__(
        self, phase: Phase, failure: Failure, detail: str, *, reply_code: int | None = None
    ) -> None:
        super().__init__(f"{phase.value}: {detail}")
        self.phase = phase
        self.failure = failure
        self.detail = detail
        self.reply_code = reply_code

    @property
    def provider_fault(self) -> bool:
        """Whether a Deferred here is the server's fault, not the message's: anything while
        setting up the session, a connection lost or timed out before the content, and a
        421 (service not available) anywhere. A 4xx to MAIL FROM, RCPT TO or DATA is about
        this message (greylisting, a full mailbox): its own attempts pay for that."""
        if self.phase in SESSION_PHASES or self.reply_code == REPLY_SERVICE_CLOSING:
            return True
        return self.failure is not Failure.TEMPORARY

    @property
    def domain_deferral(self) -> bool:
        """Whether the recipients' domain deferred the message (domain_shaping slows it): a
        421 or 451 to RCPT TO, a 4.7.x to RCPT TO, DATA or the content. Before that the
        answer is the server's own (the relay's, the sender's)."""
        return (
            self.phase in RECIPIENT_PHASES
            and self.reply_code is not None
            and domain_shaping.is_deferral_reply(
                self.reply_code, self.detail, to_rcpt=self.phase is Phase.RCPT
            )
        )

    @classmethod
    def from_exception(cls, phase: Phase, exc: BaseException) -> StepFailed:
        if isinstance(exc, StepFailed):
            return exc
        code = exc.code if isinstance(exc, SMTPResponseException) else None
        return cls(phase, classify(exc), _detail(exc), reply_code=code)

    @property
    def is_reply(self) -> bool:
        """The server answered: the session is still in a known state."""
        return self.failure in (Failure.TEMPORARY, Failure.PERMANENT, Failure.ACCESS)

    @property
    def looks_like_stale_connection(self) -> bool:
        """What a connection the server dropped while idle looks like at its next command."""
        return self.phase is Phase.MAIL and (
            self.failure is Failure.NETWORK or self.reply_code == REPLY_SERVICE_CLOSING
        )


@dataclass(frozen=True)
class Envelope:
    """What goes on the wire for one email, prepared before any connection is touched."""

    sender: str
    recipients: tuple[str, ...]  # To, Cc and Bcc: Bcc travels only here
    content: bytes
    needs_smtputf8: bool
    mail_from: bytes  # "MAIL FROM:<sender>", without its options (they depend on the server)
    rcpt_to: tuple[bytes, ...]  # "RCPT TO:<recipient>\r\n" for each recipient

    @classmethod
    def of(cls, email: OutgoingEmail) -> Envelope:
        sender, _ = envelope_address(email.from_email)
        recipients = tuple(envelope_address(r)[0] for r in email.envelope_recipients)
        # Any address with a non-ASCII local part, in the envelope or in a header (Reply-To
        # too), needs SMTPUTF8, and the headers in UTF-8 (RFC 6532).
        needs_smtputf8 = email.needs_smtputf8
        content = email.raw_utf8 if needs_smtputf8 else email.raw
        encoding = "utf-8" if needs_smtputf8 else "ascii"
        mail_from = f"MAIL FROM:{_quoted(sender)}".encode(encoding)
        rcpt_to = tuple(f"RCPT TO:{_quoted(r)}\r\n".encode(encoding) for r in recipients)
        return cls(sender, recipients, _dot_stuffed(content), needs_smtputf8, mail_from, rcpt_to)


class Delivered(NamedTuple):
    """The server's final reply, and the recipients it refused at RCPT TO while taking
    the message for the others."""

    reply: SMTPResponse
    refused: tuple[str, ...] = ()


@dataclass(eq=False)
class Connection:
    """A session ready for mail transactions, and what its server offered at EHLO."""

    wire: Wire
    loop: asyncio.AbstractEventLoop  # the event loop its transport belongs to
    pipelining: bool = False
    size: bool = False
    smtputf8: bool = False
    reused: bool = False  # it carried a transaction before this one
    needs_reset: bool = False  # its last transaction ended in a refusal: RSET before reuse


class SMTPProvider(SendOneByOne):
    name = "smtp"
    max_batch_size = 1
    capabilities = Capabilities(  # with SMTPUTF8, when the server has it
        utf8_local_part=True, sends_raw_mime=True
    )
    idempotency_window: timedelta | None = None  # SMTP has no idempotency key

    def __init__(
        self,
        *,
        host: str,
        port: int,
        tls: TLSMode = "auto",
        tls_verify: bool = True,
        ca_file: Path | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
        max_connections: int = 32,
    ) -> None:
        self._host = host
        self._port = port
        self._tls_mode = tls
        self._timeout = timeout
        self._username = username
        self._password = password
        # Error texts never carry the password, nor its base64 form (what AUTH LOGIN sends).
        self._secrets = (password, base64.b64encode(password.encode()).decode()) if password else ()
        # Built now, so a missing or unreadable SMTP_CA_FILE fails at startup, loudly.
        self._tls_context = _tls_context(tls, tls_verify, ca_file)
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[Connection] = []  # a stack: the most recently used is reused first
        self._local_hostname: str | None = None
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings) -> SMTPProvider:
        password = settings.smtp_password
        return cls(
            host=settings.smtp_host,
            port=settings.smtp_port,
            tls=settings.smtp_tls,
            tls_verify=settings.smtp_tls_verify,
            ca_file=settings.smtp_ca_file,
            username=settings.smtp_username,
            password=password.get_secret_value() if password else None,
            timeout=settings.smtp_timeout,
            max_connections=settings.concurrency,
        )

    # --- sending ---------------------------------------------------------------------------

    async def send(self, email: OutgoingEmail) -> delivery.SendOutcome:
        try:
            envelope = Envelope.of(email)
        except Exception as exc:
            return self._outcome(StepFailed.from_exception(Phase.PREPARE, exc))
        async with self._slots:
            try:
                delivered = await self._send_over_pool(envelope)
            except StepFailed as failed:
                return self._outcome(failed)
        detail = None
        if delivered.refused:
            # The message went to everyone else, so it is sent (a retry would duplicate it
            # for them); the refused recipients are its detail, kept with the message.
            detail = scrub("refused at RCPT TO: " + "; ".join(delivered.refused), *self._secrets)
            log.warning("smtp: message %s accepted, but %s", email.message_id, detail)
        message_id = provider_message_id(delivered.reply.message, email)
        return delivery.Accepted(provider_message_id=message_id, detail=detail)

    async def _send_over_pool(self, envelope: Envelope) -> Delivered:
        connection = await self._checkout()
        try:
            return await self._transact(connection, envelope)
        except StepFailed as failed:
            if not (connection.reused and failed.looks_like_stale_connection):
                raise
            log.info("smtp: a pooled connection was dead (%s); retrying on a new one", failed)
        # Only MAIL FROM had been sent, and it was not accepted: nothing to duplicate.
        return await self._transact(await self._open(), envelope)

    async def _transact(self, connection: Connection, envelope: Envelope) -> Delivered:
        """One mail transaction; hands the connection back to the pool or closes it."""
        try:
            delivered = await self._deliver(connection, envelope)
        except StepFailed as failed:
            connection.needs_reset = True
            self._checkin(connection, healthy=failed.is_reply)
            raise
        except BaseException:  # cancelled mid-conversation: its state is unknown
            connection.wire.close()
            raise
        self._checkin(connection, healthy=True)
        return delivered

    async def _deliver(self, connection: Connection, envelope: Envelope) -> Delivered:
        """MAIL FROM, RCPT TO for each recipient, DATA, content: the final reply, or
        StepFailed naming the phase. Recipients the server refuses are left out while it
        takes at least one; if it refuses them all, that is the RCPT TO failure.

        With PIPELINING the three commands leave in one write and their replies are read
        in order, each mapped to its own phase; a refusal still reads the replies that
        follow it, so the session stays in step. Without it, each waits for its reply and
        DATA is not sent when every recipient was refused."""
        wire, timeout = connection.wire, self._timeout
        phase = Phase.MAIL
        try:
            mail = envelope.mail_from
            if envelope.needs_smtputf8:
                if not connection.smtputf8:
                    raise StepFailed(
                        phase,
                        Failure.NOT_OFFERED,
                        "an address needs SMTPUTF8, which the server does not offer",
                    )
                mail += b" SMTPUTF8"
            if connection.size:
                mail += b" SIZE=%d" % len(envelope.content)
            mail += b"\r\n"
            if connection.pipelining:
                wire.write(b"".join((mail, *envelope.rcpt_to, b"DATA\r\n")))
            else:
                wire.write(mail)
            reply = await wire.reply(timeout)
            if reply.code != REPLY_COMPLETED:
                if connection.pipelining:  # RCPT TO and DATA were answered too
                    await _skip(wire, len(envelope.rcpt_to) + 1, reply, timeout)
                raise SMTPResponseException(reply.code, reply.message)
            phase = Phase.RCPT
            replies = []
            for command in envelope.rcpt_to:
                if not connection.pipelining:
                    wire.write(command)
                reply = await wire.reply(timeout)
                if reply.code == REPLY_SERVICE_CLOSING:
                    wire.close()  # the session is over, not just this recipient
                    raise SMTPResponseException(reply.code, reply.message)
                replies.append(reply)
            if connection.pipelining:
                start = await wire.reply(timeout)  # DATA's, in turn
                if start.code == REPLY_START_INPUT and REPLY_COMPLETED not in {
                    r.code for r in replies
                }:
                    wire.close()  # it waits for content no one should get: end the session
            refused = _refusals(envelope.recipients, replies)  # raises if all were refused
            phase = Phase.DATA
            if not connection.pipelining:
                wire.write(b"DATA\r\n")
                start = await wire.reply(timeout)
            if start.code != REPLY_START_INPUT:
                raise SMTPResponseException(start.code, start.message)
            wire.write(envelope.content)
            # From here on the server may end up with the message, whatever happens next.
            phase = Phase.CONTENT
            final = await _final_reply(wire, timeout)
            if final.code != REPLY_COMPLETED:
                raise SMTPResponseException(final.code, final.message)
            return Delivered(final, refused)
        except Exception as exc:
            raise StepFailed.from_exception(phase, exc) from exc

    def _outcome(self, failed: StepFailed) -> delivery.SendOutcome:
        found = outcome_class(failed.phase, failed.failure)
        if found is delivery.Deferred and failed.is_reply and THROTTLE_REPLY.search(failed.detail):
            found = delivery.Throttled
        where = f"SMTP {self._host}:{self._port}, {failed.phase.value}"
        text = scrub(f"{where}: {failed.detail}", *self._secrets)
        log.debug("smtp: %s -> %s", text, found.__name__)
        # Not keyed: no key to resend under, so the worker must not retry an Ambiguous one,
        # only reconcile it. No provider_message_id either: the server gave none.
        return failure_outcome(
            found,
            text,
            keyed=False,
            provider_fault=failed.provider_fault,
            domain_deferral=found is delivery.Deferred and failed.domain_deferral,
        )

    # --- the pool --------------------------------------------------------------------------

    async def _checkout(self) -> Connection:
        """An idle connection that still looks alive, or a new one. Call holding a slot."""
        while self._idle:
            connection = self._idle.pop()
            if connection.loop is not asyncio.get_running_loop():
                continue  # opened under an event loop that has since ended: unusable here
            if not connection.wire.is_connected or connection.wire.has_unread:
                connection.wire.close()  # the server hung up (or said goodbye) while idle
                continue
            if connection.needs_reset:
                try:
                    await _reset(connection.wire, self._timeout)
                except Exception:  # before MAIL FROM: just take another connection
                    connection.wire.close()
                    continue
                except BaseException:
                    connection.wire.close()
                    raise
                connection.needs_reset = False
            return connection
        return await self._open()

    def _checkin(self, connection: Connection, *, healthy: bool) -> None:
        if healthy and not self._closed and connection.wire.is_connected:
            connection.reused = True
            self._idle.append(connection)
        else:
            connection.wire.close()

    async def _open(self) -> Connection:
        """Connect, greet, upgrade to TLS and log in, as configured."""
        phase = Phase.CONNECT
        client: SMTP | None = None
        try:
            client = SMTP(
                hostname=self._host,
                port=self._port,
                timeout=self._timeout,
                local_hostname=await self._ehlo_name(),
                use_tls=self._tls_mode == "implicit",
                start_tls=False,  # done below, step by step, so each failure has its phase
                tls_context=self._tls_context,
            )
            await client.connect()
            phase = Phase.EHLO
            await _greet(client)
            if self._tls_mode == "starttls" or (
                self._tls_mode == "auto" and client.supports_extension("starttls")
            ):
                phase = Phase.STARTTLS
                if not client.supports_extension("starttls"):
                    raise StepFailed(
                        phase,
                        Failure.NOT_OFFERED,
                        "the server does not offer STARTTLS, and SMTP_TLS=starttls requires it",
                    )
                await client.starttls()
                phase = Phase.EHLO
                await _greet(client)  # RFC 3207: forget what was learned before TLS
            if self._username is not None:
                phase = Phase.AUTH
                await self._authenticate(client)
        except BaseException as exc:
            if client is not None:
                client.close()
            if isinstance(exc, Exception):
                raise StepFailed.from_exception(phase, exc) from exc
            raise
        return _hand_over(client)

    async def _authenticate(self, client: SMTP) -> None:
        assert self._username is not None
        encrypted = client.get_transport_info("sslcontext") is not None
        if not encrypted and self._tls_mode != "none":
            raise StepFailed(
                Phase.AUTH,
                Failure.NOT_OFFERED,
                "refusing to send credentials over an unencrypted connection (the server "
                "did not offer STARTTLS); set SMTP_TLS=none to allow it",
            )
        if not client.supports_extension("auth"):
            raise StepFailed(
                Phase.AUTH,
                Failure.NOT_OFFERED,
                "the server does not offer AUTH, but SMTP_USERNAME is set",
            )
        if not client.supported_auth_methods:
            offered = " ".join(client.server_auth_methods) or "none"
            raise StepFailed(
                Phase.AUTH,
                Failure.NOT_OFFERED,
                f"no AUTH mechanism in common (the server offers: {offered})",
            )
        await client.login(self._username, self._password or "")

    async def _ehlo_name(self) -> str:
        # getfqdn can block on DNS: look it up once, off the event loop.
        if self._local_hostname is None:
            name = await asyncio.to_thread(socket.getfqdn)
            usable = name.isascii() and name.isprintable() and " " not in name
            self._local_hostname = name if name and usable else "localhost"
        return self._local_hostname

    async def aclose(self) -> None:
        """QUIT every idle connection; in-flight ones are closed when they come back."""
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(_quit(connection) for connection in idle))


register("smtp")(SMTPProvider.from_settings)


# --- helpers -------------------------------------------------------------------------------


def _tls_context(mode: TLSMode, verify: bool, ca_file: Path | None) -> ssl.SSLContext | None:
    if mode == "none":
        return None
    context = ssl.create_default_context()  # the system's CAs, hostname checks, TLS >= 1.2
    if ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _hand_over(client: SMTP) -> Connection:
    """The session aiosmtplib set up, its transport now read and written by a Wire."""
    transport = client.protocol.transport if client.protocol is not None else None
    if not isinstance(transport, asyncio.Transport) or transport.is_closing():
        client.close()
        raise StepFailed(Phase.EHLO, Failure.NETWORK, "the connection closed during setup")
    wire = Wire()
    transport.set_protocol(wire)
    wire.connection_made(transport)
    return Connection(
        wire,
        asyncio.get_running_loop(),
        pipelining=client.supports_extension("pipelining"),
        size=client.supports_extension("size"),
        smtputf8=client.supports_extension("smtputf8"),
    )


async def _greet(client: SMTP) -> None:
    """EHLO, falling back to HELO for servers that only speak plain SMTP."""
    try:
        await client.ehlo()
    except SMTPHeloError:
        if not client.is_connected:
            raise
        await client.helo()


async def _skip(wire: Wire, count: int, refusal: SMTPResponse, wait: float) -> None:
    """Read the COUNT pipelined replies that follow a refused MAIL FROM (the server answers
    every command, 503 "need MAIL command" for the rest), so the next transaction on this
    session reads its own replies. When the session cannot be put back in step, close it."""
    if refusal.code == REPLY_SERVICE_CLOSING:
        wire.close()
        return
    try:
        await wire.replies(count, wait)
    except Exception:
        wire.close()


def _refusals(recipients: Sequence[str], replies: Sequence[SMTPResponse]) -> tuple[str, ...]:
    """The recipients refused at RCPT TO ("address: reply") when the server took some;
    raises when it took none: the one refusal as it is, or for several the most hopeful
    (530 before 4xx before 5xx) with every reply in it."""
    refusals = [
        (recipient, SMTPResponseException(reply.code, reply.message))
        for recipient, reply in zip(recipients, replies, strict=True)
        if reply.code != REPLY_COMPLETED
    ]
    texts = tuple(f"{recipient}: {_detail(exc)}" for recipient, exc in refusals)
    if len(refusals) < len(recipients):
        return texts
    if len(refusals) == 1:
        raise refusals[0][1]
    codes = [exc.code for _, exc in refusals]
    code = (
        REPLY_ACCESS_DENIED
        if REPLY_ACCESS_DENIED in codes
        else min(codes, key=lambda c: (c >= 500, c))
    )
    raise SMTPResponseException(code, "every recipient refused: " + "; ".join(texts))


async def _final_reply(wire: Wire, reply_wait: float) -> SMTPResponse:
    try:
        return await wire.reply(reply_wait)
    except BaseException:
        wire.close()  # a reply read late would be taken for the next command's
        raise


async def _reset(wire: Wire, wait: float) -> None:
    wire.write(b"RSET\r\n")
    reply = await wire.reply(wait)
    if reply.code != REPLY_COMPLETED:
        raise SMTPResponseException(reply.code, reply.message)


async def _quit(connection: Connection) -> None:
    wire = connection.wire
    try:
        wire.write(b"QUIT\r\n")
        await wire.reply(QUIT_TIMEOUT)
    except Exception as exc:  # a goodbye that fails changes nothing
        log.debug("smtp: QUIT failed: %s", describe(exc))
    finally:
        wire.close()


def _quoted(address: str) -> str:
    """<address> for MAIL FROM / RCPT TO; aiosmtplib's quote_address (which refuses
    whitespace, brackets and quotes outside a quoted local part) for anything but a plain
    dot-atom address, which it would give back as it is."""
    if _PLAIN_ADDRESS.fullmatch(address):
        return f"<{address}>"
    return quote_address(address)


def _dot_stuffed(content: bytes) -> bytes:
    """The DATA payload: CRLF line endings, leading dots doubled, then CRLF "." CRLF."""
    crlf = content.count(b"\r\n")
    # Composed MIME has CRLF endings only: counting is far cheaper than rewriting.
    if content.count(b"\r") != crlf or content.count(b"\n") != crlf:
        content = _BARE_LINE_ENDING.sub(b"\r\n", content)
    if not content.endswith(b"\r\n"):
        content += b"\r\n"
    if content.startswith(b".") or b"\n." in content:
        content = _LINE_START_DOT.sub(b"..", content)
    return content + b".\r\n"


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _detail(exc: BaseException) -> str:
    """A reply as the server gave it ("550 5.1.1 No such user"); anything else described."""
    if isinstance(exc, SMTPResponseException):
        return " ".join(f"{exc.code} {exc.message}".split())
    return describe(exc)
