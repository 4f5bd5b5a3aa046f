"""A real SMTP server for tests: aiosmtpd in a background thread, recording what arrives.

    with RecordingSMTPServer(starttls=True, auth=True) as server:
        settings = Settings(smtp_port=server.port, smtp_ca_file=server.ca_file, ...)
        ...
        assert server.message_ids() == [email.rfc_message_id]

It listens on 127.0.0.1 on a free port, so clients in other processes can use it too.
Options: STARTTLS or implicit TLS with a certificate from a throwaway CA (`trustme`; clients
trust `server.ca_file`), AUTH PLAIN/LOGIN with USERNAME/PASSWORD, and failure injection:

    server.inject("rcpt", "451 4.3.0 Try again later", times=2)
    server.inject("rcpt", "550 5.1.1 No such user", recipient="gone@example.com", times=None)
    server.inject("end_of_data", DROP)  # content received, connection closed unanswered

`DROP` closes the connection without a reply, `HANG` never replies. After end of data both
leave the client not knowing whether the message was taken: the message is recorded as
arrived, with `reply_code=None`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

# aiosmtpd logs every command at INFO: thousands of lines per race test, and noise leaking
# out of the server thread.
logging.getLogger("mail.log").setLevel(logging.WARNING)

USERNAME = "mailbag"
PASSWORD = "correct-horse-battery-staple"
SERVER_NAME = "smtp.test"

FaultPhase = Literal["mail", "rcpt", "data", "end_of_data"]
FAULT_PHASES: tuple[FaultPhase, ...] = ("mail", "rcpt", "data", "end_of_data")


class NoReply(enum.Enum):
    DROP = "drop"  # close the connection without answering
    HANG = "hang"  # never answer (the connection is closed after `hang_seconds`)


DROP = NoReply.DROP
HANG = NoReply.HANG


@dataclass
class Fault:
    at: FaultPhase  # "data" is the DATA command itself; "end_of_data" follows the content
    reply: str | NoReply
    recipient: str | None  # only transactions to this recipient; None: any
    remaining: int | None  # None: forever


@dataclass(frozen=True)
class ReceivedMessage:
    """A message whose content arrived in full, whatever the server answered to it."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    raw: bytes
    message_id: str | None
    queue_id: str
    connection: int  # which connection carried it, numbered from 1 in the order opened
    tls: bool  # the connection was encrypted (STARTTLS or implicit TLS)
    authenticated_as: str | None  # the AUTH user, if the client logged in
    reply_code: int | None  # what the server answered; None: it never answered

    @property
    def accepted(self) -> bool:
        return self.reply_code == 250

    @property
    def may_be_delivered(self) -> bool:
        """Accepted, or left unanswered: a recipient may end up with this one."""
        return self.reply_code is None or self.accepted


class RecordingSMTPServer:
    """An SMTP server on 127.0.0.1:`port` in a background thread (see the module docstring).

    What happened: `arrived`, `accepted`, `message_ids()`, `message_id_counts()`,
    `duplicates()`, `connections_opened`, `open_connections`, `max_concurrent_connections`,
    `auth_attempts`, `errors`. Control: `inject()`, `clear_faults()`, `reset()`,
    `close_connections()`, `stop()` / `start()` (same port), `close()`.
    """

    def __init__(
        self,
        *,
        starttls: bool = False,
        implicit_tls: bool = False,
        auth: bool = False,
        auth_required: bool = False,
        auth_require_tls: bool = False,
        smtputf8: bool = True,
        queue_ids: bool = True,
        idle_timeout: float = 300.0,
        hang_seconds: float = 30.0,
    ) -> None:
        if starttls and implicit_tls:
            raise ValueError("choose STARTTLS or implicit TLS, not both")
        self.starttls = starttls
        self.implicit_tls = implicit_tls
        self.auth = auth or auth_required
        self.auth_required = auth_required
        self.auth_require_tls = auth_require_tls
        self.smtputf8 = smtputf8
        self.queue_ids = queue_ids
        self.idle_timeout = idle_timeout
        self.hang_seconds = hang_seconds
        self.reply_delay = 0.0  # seconds to wait before answering the message content
        # While cleared, every message's content waits unanswered (`hold_replies`), so a test
        # can be sure sends are in flight at a moment of its choosing.
        self._replies_open = threading.Event()
        self._replies_open.set()
        self.held = 0  # messages waiting for their answer right now
        self.host = "127.0.0.1"
        self.port = _free_port(self.host)

        self._lock = threading.Lock()
        self._arrived: list[ReceivedMessage] = []
        self._faults: list[Fault] = []
        self._open_sessions: set[_Session] = set()
        self._connections_opened = 0
        self._max_concurrent = 0
        self._auth_attempts = 0
        self._errors: list[BaseException] = []
        self._controller: _Controller | None = None

        self._ca: trustme.CA | None = None
        self._tls_context: ssl.SSLContext | None = None
        self._ca_dir: tempfile.TemporaryDirectory[str] | None = None
        self.ca_file: Path | None = None
        if starttls or implicit_tls:
            self._ca = trustme.CA()
            self._tls_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ca.issue_cert(self.host, "localhost").configure_cert(self._tls_context)
            self._ca_dir = tempfile.TemporaryDirectory(prefix="mailbag-smtp-ca-")
            self.ca_file = Path(self._ca_dir.name) / "ca.pem"
            self._ca.cert_pem.write_to_path(str(self.ca_file))

    def hold_replies(self) -> None:
        """From now on, answer no message's content until `release_replies`."""
        self._replies_open.clear()

    def release_replies(self) -> None:
        self._replies_open.set()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Listen (again) on `self.port`."""
        if self._controller is not None:
            return
        smtp_options: dict[str, Any] = {
            "enable_SMTPUTF8": self.smtputf8,
            "timeout": self.idle_timeout,
            # aiosmtpd only counts STARTTLS as TLS; with implicit TLS everything is encrypted.
            "auth_require_tls": self.auth_require_tls and not self.implicit_tls,
            "authenticator": _check_credentials,
        }
        if self.starttls:
            smtp_options["tls_context"] = self._tls_context
        if self.auth_required:
            smtp_options["auth_required"] = True
        controller = _Controller(
            self,
            _Handler(self),
            hostname=self.host,
            port=self.port,
            ssl_context=self._tls_context if self.implicit_tls else None,
            server_hostname=SERVER_NAME,  # else aiosmtpd looks up the FQDN per connection
            **smtp_options,
        )
        with self._lock:
            opened_before, max_before = self._connections_opened, self._max_concurrent
        controller.start()
        self._controller = controller
        # start() opens a probe connection of its own; keep it out of the statistics.
        self.wait_until(lambda: self.open_connections == 0, timeout=5)
        with self._lock:
            self._connections_opened, self._max_concurrent = opened_before, max_before

    def stop(self) -> None:
        """Stop listening and cut every open connection; `start()` listens again."""
        controller, self._controller = self._controller, None
        if controller is not None:
            controller.stop()
        with self._lock:
            self._open_sessions.clear()

    def close(self) -> None:
        self.stop()
        if self._ca_dir is not None:
            self._ca_dir.cleanup()
            self._ca_dir = None

    def __enter__(self) -> RecordingSMTPServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._controller is not None

    # --- failure injection ---------------------------------------------------------------

    def inject(
        self,
        at: FaultPhase,
        reply: str | NoReply,
        *,
        times: int | None = 1,
        recipient: str | None = None,
    ) -> None:
        """Answer the next `times` transactions (None: all) at `at` with `reply` instead.

        `reply` is a full SMTP reply ("451 4.3.0 Try again later"), DROP or HANG. Faults
        are matched in the order injected; `recipient` limits one to that recipient."""
        if at not in FAULT_PHASES:
            raise ValueError(f"at must be one of {FAULT_PHASES}, not {at!r}")
        if at == "mail" and recipient is not None:
            raise ValueError("the recipient is not known yet at MAIL FROM")
        if isinstance(reply, str) and not (reply[:3].isdigit() and reply[:1] in "2345"):
            raise ValueError(f"not an SMTP reply: {reply!r}")
        with self._lock:
            self._faults.append(Fault(at, reply, recipient, times))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def reset(self) -> None:
        """Forget the messages, the faults and the connection statistics."""
        with self._lock:
            self._arrived.clear()
            self._faults.clear()
            self._connections_opened = len(self._open_sessions)
            self._max_concurrent = len(self._open_sessions)
            self._auth_attempts = 0
            self._errors.clear()

    def close_connections(self) -> int:
        """Close every open connection from the server side, as an idle timeout does."""
        controller = self._controller
        with self._lock:
            sessions = list(self._open_sessions)
        if controller is None or not sessions:
            return 0

        def close_all() -> None:
            for session in sessions:
                if session.transport is not None:
                    session.transport.close()

        controller.loop.call_soon_threadsafe(close_all)
        self.wait_until(lambda: not (set(sessions) & self._sessions()), timeout=5)
        return len(sessions)

    # --- what happened -------------------------------------------------------------------

    @property
    def arrived(self) -> list[ReceivedMessage]:
        """Every message whose content arrived, whatever the answer, in arrival order."""
        with self._lock:
            return list(self._arrived)

    @property
    def accepted(self) -> list[ReceivedMessage]:
        return [message for message in self.arrived if message.accepted]

    def message_ids(self) -> list[str | None]:
        """Message-IDs of the messages a recipient may have: accepted or left unanswered."""
        return [message.message_id for message in self.arrived if message.may_be_delivered]

    def message_id_counts(self) -> Counter[str | None]:
        return Counter(self.message_ids())

    def duplicates(self) -> dict[str | None, int]:
        return {mid: n for mid, n in self.message_id_counts().items() if n > 1}

    @property
    def connections_opened(self) -> int:
        with self._lock:
            return self._connections_opened

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised inside sessions (a failed TLS handshake, a handler bug)."""
        with self._lock:
            return list(self._errors)

    @property
    def auth_attempts(self) -> int:
        """How many times a client offered credentials (right or wrong)."""
        with self._lock:
            return self._auth_attempts

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open_sessions)

    @property
    def max_concurrent_connections(self) -> int:
        with self._lock:
            return self._max_concurrent

    def wait_until(self, condition: Callable[[], bool], *, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def wait_for_messages(self, count: int, *, timeout: float = 10.0) -> bool:
        return self.wait_until(lambda: len(self.arrived) >= count, timeout=timeout)

    # --- called from the server thread ---------------------------------------------------

    def _sessions(self) -> set[_Session]:
        with self._lock:
            return set(self._open_sessions)

    def _opened(self, session: _Session) -> int:
        with self._lock:
            self._open_sessions.add(session)
            self._connections_opened += 1
            self._max_concurrent = max(self._max_concurrent, len(self._open_sessions))
            return self._connections_opened

    def _closed(self, session: _Session) -> None:
        with self._lock:
            self._open_sessions.discard(session)

    def _take_fault(self, at: FaultPhase, recipients: Iterable[str]) -> Fault | None:
        wanted = {r.lower() for r in recipients}
        with self._lock:
            for fault in self._faults:
                if fault.at != at:
                    continue
                if fault.recipient is not None and fault.recipient.lower() not in wanted:
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def _record_error(self, error: BaseException) -> None:
        with self._lock:
            self._errors.append(error)

    def _count_auth_attempt(self) -> None:
        with self._lock:
            self._auth_attempts += 1

    def _record(self, message: ReceivedMessage) -> None:
        with self._lock:
            self._arrived.append(message)


class _Session(SMTP):
    """One connection. Counts itself, and can refuse the DATA command itself."""

    def __init__(self, recorder: RecordingSMTPServer, handler: Any, **options: Any) -> None:
        super().__init__(handler, **options)
        self.recorder = recorder
        self.number = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        first_time = self.transport is None  # STARTTLS calls this again for the TLS layer
        super().connection_made(transport)
        if first_time:
            self.number = self.recorder._opened(self)

    def connection_lost(self, error: Exception | None) -> None:
        self.recorder._closed(self)
        super().connection_lost(error)

    async def smtp_DATA(self, arg: str) -> None:
        envelope = self.envelope
        fault = None
        if envelope is not None and envelope.rcpt_tos and not arg:
            fault = self.recorder._take_fault("data", envelope.rcpt_tos)
        if fault is None:
            await super().smtp_DATA(arg)
        elif isinstance(fault.reply, NoReply):
            await _withhold_reply(self, fault.reply)
        else:
            await self.push(fault.reply)


class _Handler:
    def __init__(self, recorder: RecordingSMTPServer) -> None:
        self.recorder = recorder

    async def handle_EHLO(
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str, lines: list[str]
    ) -> list[str]:
        session.host_name = hostname  # aiosmtpd leaves this to an EHLO hook
        if not self.recorder.auth:
            lines = [line for line in lines if not line[4:].upper().startswith("AUTH")]
        return lines

    async def handle_exception(self, error: Exception) -> str:
        # Kept for the test to inspect instead of logged: some tests cause them on purpose.
        self.recorder._record_error(error)
        return f"451 4.3.0 Error: ({type(error).__name__}) {error}"

    async def handle_MAIL(
        self,
        server: _Session,
        session: Session,
        envelope: Envelope,
        address: str,
        options: list[str],
    ) -> str:
        fault = self.recorder._take_fault("mail", ())
        if fault is not None:
            return await _fault_reply(server, fault)
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self,
        server: _Session,
        session: Session,
        envelope: Envelope,
        address: str,
        options: list[str],
    ) -> str:
        fault = self.recorder._take_fault("rcpt", (address,))
        if fault is not None:
            return await _fault_reply(server, fault)
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 OK"

    async def handle_DATA(self, server: _Session, session: Session, envelope: Envelope) -> str:
        if self.recorder.reply_delay:
            await asyncio.sleep(self.recorder.reply_delay)  # a slow relay
        if not self.recorder._replies_open.is_set():
            with self.recorder._lock:
                self.recorder.held += 1
            while not self.recorder._replies_open.is_set():
                await asyncio.sleep(0.01)
            with self.recorder._lock:
                self.recorder.held -= 1
        fault = self.recorder._take_fault("end_of_data", envelope.rcpt_tos)
        queue_id = uuid.uuid4().hex[:12].upper()
        if fault is not None:
            reply = fault.reply
        elif self.recorder.queue_ids:
            reply = f"250 2.0.0 Ok: queued as {queue_id}"
        else:
            reply = "250 OK"
        raw: bytes = envelope.original_content or b""
        message_id = BytesHeaderParser().parsebytes(raw).get("Message-ID")
        transport = server.transport
        credentials = session.auth_data  # what _check_credentials accepted, if anything
        self.recorder._record(
            ReceivedMessage(
                mail_from=envelope.mail_from or "",
                rcpt_tos=tuple(envelope.rcpt_tos),
                raw=raw,
                message_id=message_id.strip() if message_id else None,
                queue_id=queue_id,
                connection=server.number,
                tls=transport is not None and transport.get_extra_info("sslcontext") is not None,
                authenticated_as=(
                    credentials.login.decode() if isinstance(credentials, LoginPassword) else None
                ),
                reply_code=None if isinstance(reply, NoReply) else int(reply[:3]),
            )
        )
        if isinstance(reply, NoReply):
            await _withhold_reply(server, reply)
        assert isinstance(reply, str)
        return reply


class _Controller(Controller):
    def __init__(self, recorder: RecordingSMTPServer, handler: _Handler, **options: Any) -> None:
        super().__init__(handler, **options)
        self.recorder = recorder

    def factory(self) -> _Session:
        return _Session(self.recorder, self.handler, **self.SMTP_kwargs)


async def _fault_reply(server: _Session, fault: Fault) -> str:
    if isinstance(fault.reply, NoReply):
        await _withhold_reply(server, fault.reply)
    assert isinstance(fault.reply, str)
    return fault.reply


async def _withhold_reply(server: _Session, how: NoReply) -> None:
    """Never return: close the connection (now, or after `hang_seconds`) without a reply."""
    if how is NoReply.HANG:
        await asyncio.sleep(server.recorder.hang_seconds)
    if isinstance(server.transport, asyncio.Transport):
        server.transport.abort()  # abort, not close: nothing written after this may leave
    # Losing the connection cancels this session's task, which ends the wait.
    await asyncio.sleep(3600)


def _check_credentials(
    server: _Session, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
) -> AuthResult:
    server.recorder._count_auth_attempt()
    ok = (
        isinstance(auth_data, LoginPassword)
        and auth_data.login == USERNAME.encode()
        and auth_data.password == PASSWORD.encode()
    )
    # handled=False: let aiosmtpd answer 535 itself; auth_data: remembered as the login.
    return AuthResult(success=ok, handled=False, auth_data=auth_data)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port
