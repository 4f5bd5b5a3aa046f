"""PIPELINING (RFC 2920) on the wire: what leaves together, and how each reply of a
pipelined group is taken, against a scripted server that shows every read it made.

The rest of the provider's behaviour runs against aiosmtpd both with and without
PIPELINING offered (tests/test_provider_smtp.py); these are the cases aiosmtpd cannot
stage: a server that answers 354 after refusing every recipient, replies split anywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mailbag.domain.delivery import Accepted, Deferred, Rejected
from mailbag.providers import smtp
from mailbag.providers.smtp import SMTPProvider
from mailbag.providers.smtp_wire import Wire
from mailbag.settings import Settings as MailbagSettings

from helpers import outgoing_email

Answer = Callable[[bytes], bytes]


class ScriptedServer:
    """Greets, answers EHLO with `extensions`, then each command line with `answer(line)`
    (250 unless told otherwise), all replies to one read in one write, as a pipelining
    server does. Records every read (`reads`) and every message content (`contents`)."""

    def __init__(self, extensions: list[str], answer: Answer | None = None) -> None:
        self.extensions = extensions
        self.answer = answer or (lambda line: b"250 OK\r\n")
        self.reads: list[bytes] = []
        self.contents: list[bytes] = []
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._session, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        writer.write(b"220 scripted ESMTP\r\n")
        buffer, content = b"", None
        while chunk := await reader.read(65536):
            self.reads.append(chunk)
            buffer += chunk
            out = b""
            while b"\r\n" in buffer:
                line, buffer = buffer.split(b"\r\n", 1)
                if content is not None:
                    if line == b".":
                        self.contents.append(content)
                        content = None
                        out += b"250 2.0.0 Ok: queued as ABCDEF123\r\n"
                    else:
                        content += line + b"\r\n"
                    continue
                verb = line[:4].upper()
                if verb == b"EHLO":
                    names = ["scripted", *self.extensions]
                    out += b"".join(
                        f"250{'-' if i < len(names) - 1 else ' '}{name}\r\n".encode()
                        for i, name in enumerate(names)
                    )
                elif verb == b"QUIT":
                    out += b"221 Bye\r\n"
                else:
                    reply = self.answer(line)
                    if verb == b"DATA" and reply.startswith(b"354"):
                        content = b""
                    out += reply
            if out:
                writer.write(out)
        writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    servers: list[ScriptedServer] = []
    providers: list[SMTPProvider] = []

    async def make(
        extensions: list[str], answer: Answer | None = None
    ) -> tuple[ScriptedServer, SMTPProvider]:
        server = ScriptedServer(extensions, answer)
        await server.start()
        servers.append(server)
        settings = MailbagSettings(
            provider="smtp",
            smtp_host="127.0.0.1",
            smtp_port=server.port,
            smtp_tls="none",
            smtp_timeout=5.0,
            concurrency=4,
        )
        provider = SMTPProvider.from_settings(settings)
        providers.append(provider)
        return server, provider

    yield make
    for provider in providers:
        await provider.aclose()
    for server in servers:
        await server.close()


def _data(line: bytes) -> bytes:
    return b"354 Go ahead\r\n" if line.upper() == b"DATA" else b"250 OK\r\n"


async def test_mail_rcpt_and_data_leave_in_one_write_when_pipelining_is_offered(
    serve: Callable[..., Any],
) -> None:
    server, provider = await serve(["PIPELINING", "SIZE 1000000"], _data)
    sent = outgoing_email(1)

    assert isinstance(await provider.send(sent), Accepted)

    [group] = [read for read in server.reads if read.startswith(b"MAIL FROM")]
    lines = group.split(b"\r\n")
    assert lines[0].startswith(b"MAIL FROM:<") and b" SIZE=" in lines[0]
    assert lines[1].startswith(b"RCPT TO:<") and lines[-2:] == [b"DATA", b""]
    assert len(server.contents) == 1


async def test_without_pipelining_each_command_waits_for_its_reply(
    serve: Callable[..., Any],
) -> None:
    server, provider = await serve(["SIZE 1000000"], _data)

    assert isinstance(await provider.send(outgoing_email(1)), Accepted)

    commands = [read for read in server.reads if read[:4] in (b"MAIL", b"RCPT", b"DATA")]
    assert [c.count(b"\r\n") for c in commands] == [1] * len(commands)
    assert len(server.contents) == 1


async def test_many_sends_reuse_one_pipelined_connection(serve: Callable[..., Any]) -> None:
    server, provider = await serve(["PIPELINING"], _data)

    for number in range(20):
        assert isinstance(await provider.send(outgoing_email(number)), Accepted)

    assert server.connections == 1 and len(server.contents) == 20


async def test_a_refused_mail_from_keeps_the_pipelined_session_in_step(
    serve: Callable[..., Any],
) -> None:
    refusals, in_transaction = [1], [False]

    def answer(line: bytes) -> bytes:
        verb = line[:4].upper()
        if verb == b"MAIL":
            in_transaction[0] = not refusals[0]
            if refusals[0]:
                refusals[0] -= 1
                return b"451 4.3.0 Try again later\r\n"
        if verb in (b"RCPT", b"DATA") and not in_transaction[0]:
            return b"503 5.5.1 Error: need MAIL command\r\n"  # the rest of the group
        return _data(line)

    server, provider = await serve(["PIPELINING"], answer)

    first = await provider.send(outgoing_email(1))
    second = await provider.send(outgoing_email(2))

    assert isinstance(first, Deferred) and "MAIL FROM" in str(first), first
    assert isinstance(second, Accepted), second
    # The refused group's RCPT and DATA replies were read off, so the next group read its own.
    assert server.connections == 1 and len(server.contents) == 1


async def test_a_server_that_takes_data_after_refusing_every_recipient_gets_no_content(
    serve: Callable[..., Any],
) -> None:
    def answer(line: bytes) -> bytes:
        verb = line[:4].upper()
        if verb == b"RCPT":
            return b"550 5.1.1 No such user\r\n"
        return _data(line)  # a broken server: 354 although no recipient was taken

    server, provider = await serve(["PIPELINING"], answer)

    outcome = await provider.send(outgoing_email(1))

    assert isinstance(outcome, Rejected) and "RCPT TO" in str(outcome), outcome
    assert server.contents == []
    # That session waits for content: it is closed, and the next send opens another.
    await provider.send(outgoing_email(2))
    assert server.connections == 2


async def test_a_refused_recipient_inside_a_pipelined_group_is_left_out(
    serve: Callable[..., Any],
) -> None:
    from mailbag.domain.content import Address, Recipients

    def answer(line: bytes) -> bytes:
        if line.upper().startswith(b"RCPT TO:<GONE@"):
            return b"550 5.1.1 No such user\r\n"
        return _data(line)

    server, provider = await serve(["PIPELINING"], answer)
    sent = outgoing_email(
        1,
        recipients=Recipients(
            to=(Address("ann@example.com"),),
            cc=(Address("gone@example.com"),),
            bcc=(Address("bob@example.com"),),
        ),
    )

    outcome = await provider.send(sent)

    assert isinstance(outcome, Accepted), outcome
    assert outcome.detail == "refused at RCPT TO: gone@example.com: 550 5.1.1 No such user"
    [group] = [read for read in server.reads if read.startswith(b"MAIL FROM")]
    assert group.count(b"RCPT TO:") == 3 and group.endswith(b"DATA\r\n")
    assert len(server.contents) == 1


async def test_a_reply_no_command_asked_for_retires_the_idle_connection(
    serve: Callable[..., Any],
) -> None:
    server, provider = await serve(["PIPELINING"], _data)
    assert isinstance(await provider.send(outgoing_email(1)), Accepted)

    # A reply nobody asked for, on a session left open: taken for the next MAIL FROM's,
    # it would shift every reply of the next group by one.
    server.writers[0].write(b"250 2.0.0 Stray\r\n")
    await asyncio.sleep(0.05)

    assert isinstance(await provider.send(outgoing_email(2)), Accepted)
    assert server.connections == 2 and len(server.contents) == 2


# --- the reply reader ----------------------------------------------------------------------


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_replies_are_read_in_order_however_the_bytes_arrive() -> None:
    wire = Wire()
    wire.connection_made(_Transport())
    stream = b"250 OK\r\n250-first line\r\n250 second line\r\n354 Go ahead\r\n"
    for index in range(len(stream)):  # one byte at a time: every split point
        wire.data_received(stream[index : index + 1])

    replies = await wire.replies(3, 1.0)

    assert [(r.code, r.message) for r in replies] == [
        (250, "OK"),
        (250, "first line\nsecond line"),
        (354, "Go ahead"),
    ]


async def test_a_reply_that_does_not_come_times_out_and_a_garbled_one_fails() -> None:
    from aiosmtplib import SMTPReadTimeoutError, SMTPResponseException

    wire = Wire()
    wire.connection_made(_Transport())
    with pytest.raises(SMTPReadTimeoutError):
        await wire.reply(0.01)

    wire.data_received(b"hello there\r\n")
    with pytest.raises(SMTPResponseException):
        await wire.reply(1.0)
    assert not wire.is_connected


async def test_a_lost_connection_fails_the_waiting_read() -> None:
    from aiosmtplib import SMTPServerDisconnected

    wire = Wire()
    wire.connection_made(_Transport())
    waiting = asyncio.ensure_future(wire.replies(2, 5.0))
    wire.data_received(b"250 OK\r\n")
    await asyncio.sleep(0)
    wire.connection_lost(None)

    with pytest.raises(SMTPServerDisconnected):
        await waiting
    with pytest.raises(SMTPServerDisconnected):
        wire.write(b"RSET\r\n")


# --- the cheap paths give what the general ones give ----------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab.-_+=@\"<> \\'é!{}\r\n"), max_size=24))
def test_addresses_are_quoted_as_aiosmtplib_quotes_them(address: str) -> None:
    from aiosmtplib.email import quote_address

    try:
        expected: str | type = quote_address(address)
    except ValueError:
        expected = ValueError
    try:
        got: str | type = smtp._quoted(address)
    except ValueError:
        got = ValueError
    assert got == expected


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40) | st.text(alphabet=".\r\nab", max_size=40).map(str.encode))
def test_dot_stuffing_takes_the_cheap_path_only_when_it_changes_nothing(content: bytes) -> None:
    normalized = smtp._BARE_LINE_ENDING.sub(b"\r\n", content)
    if not normalized.endswith(b"\r\n"):
        normalized += b"\r\n"
    expected = smtp._LINE_START_DOT.sub(b"..", normalized) + b".\r\n"
    assert smtp._dot_stuffed(content) == expected
