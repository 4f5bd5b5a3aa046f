"""Small builders shared by the tests."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Executable, func, select

from mailbag.domain.delivery import Decision
from mailbag.domain.ids import uuid7
from mailbag.domain.message import NewMessage, new_message
from mailbag.domain.states import Status
from mailbag.store import dispatch, message_transitions
from mailbag.store import enqueue as enqueue_store
from mailbag.store import messages as message_store
from mailbag.store.database import READ_ONLY
from mailbag.store.plan import Plan, dialect_of_connection, run
from mailbag.store.schema import message_events, outbox_messages

from conftest import TestDB

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=120)


def message(i: int = 0, **fields: Any) -> NewMessage:
    fields.setdefault("to", f"user{i}@example.com")
    fields.setdefault("template", "welcome")
    fields.setdefault("data", {"name": f"User {i}"})
    return new_message(**fields)


def enqueue(db: TestDB, n: int = 1, now: datetime = T0, **fields: Any) -> list[Any]:
    with db.engine.begin() as conn:
        results = run(
            conn,
            enqueue_store.enqueue(
                [message(i, **fields) for i in range(n)],
                now=now,
                default_max_attempts=5,
            ),
        )
    return [r.message for r in results]


def claim(
    db: TestDB, now: datetime = T0, limit: int = 100, worker: str = "w1", lease: timedelta = LEASE
) -> dispatch.Claim:
    with db.engine.begin() as conn:
        return run(conn, dispatch.claim(worker_id=worker, now=now, lease=lease, limit=limit))


def race_claims(
    db: TestDB,
    claimers: int,
    limit: int,
    *,
    take: Callable[[str, int], Plan[list[Any]]] | None = None,
) -> list[list[Any]]:
    """Claimers on separate connections, started together, claiming until nothing is due:
    the ids each one took. Raises what any of them raised. `take(worker_id, limit)` claims
    something other than messages (hook deliveries) and answers the ids it took."""
    engine = db.new_engine(pool_size=claimers)
    start = threading.Barrier(claimers)
    taken: list[list[Any]] = [[] for _ in range(claimers)]
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            start.wait()
            while True:
                worker_id = f"w{index}"
                with engine.begin() as conn:
                    ids = (
                        run(conn, take(worker_id, limit))
                        if take
                        else [
                            m.id
                            for m in run(
                                conn,
                                dispatch.claim(
                                    worker_id=worker_id, now=T0, lease=LEASE, limit=limit
                                ),
                            ).messages
                        ]
                    )
                if not ids:
                    return
                taken[index].extend(ids)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.dispose()
    assert not errors, errors
    return taken


def finalize(
    db: TestDB,
    token: Any,
    *outcomes: tuple[uuid.UUID, Decision],
    now: datetime = T0,
    actor: str = "w1",
) -> dispatch.Finalized:
    with db.engine.begin() as conn:
        return run(
            conn,
            dispatch.finalize(
                token=token,
                decisions=dict(outcomes),
                now=now,
                actor=actor,
                provider="test",
            ),
        )


def sweep(db: TestDB, now: datetime) -> list[message_transitions.Changed]:
    with db.engine.begin() as conn:
        return run(conn, dispatch.sweep_expired(now=now, actor="sweeper"))


def get(db: TestDB, message_id: Any) -> Any:
    with db.engine.connect().execution_options(**READ_ONLY) as conn:
        return run(conn, message_store.get(message_id))


def events(db: TestDB, message_id: Any) -> list[Any]:
    with db.engine.connect() as conn:
        return run(conn, message_store.events(message_id))


def status_counts(db: TestDB) -> dict[str, int]:
    """Messages by state. Read-only: on SQLite it must not queue behind a running worker."""
    with db.engine.connect().execution_options(**READ_ONLY) as conn:
        return run(conn, message_store.count_by_status())


async def run_worker_until(
    worker: Any, done: Callable[[], bool | Awaitable[bool]], timeout: float = 15.0
) -> None:
    """Run a worker in this event loop until `done()` holds, then stop it (drained)."""
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(timeout):
            while True:
                result = done()
                if not isinstance(result, bool):
                    result = await result
                if result:
                    break
                if task.done():
                    task.result()
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task


def count_rows(db: TestDB) -> tuple[int, int]:
    with db.engine.connect() as conn:
        messages = conn.execute(select(func.count()).select_from(outbox_messages)).scalar_one()
        logged = conn.execute(select(func.count()).select_from(message_events)).scalar_one()
    return messages, logged


def outgoing_email(i: int = 0, **overrides: Any) -> Any:
    """A composed email as a provider receives it (built through the real compose path).

    `to_email`/`to_name` set the one To recipient (what most tests need); `recipients`
    (a Recipients) replaces them for an email with several."""
    import uuid

    from mailbag.compose import OutgoingEmail, rfc_message_id
    from mailbag.domain.content import Address, Recipients

    message_id = overrides.pop("message_id", uuid.uuid4())
    to_email = overrides.pop("to_email", f"user{i}@example.com")
    to_name = overrides.pop("to_name", f"User {i}")
    fields: dict[str, Any] = {
        "message_id": message_id,
        "attempt": 1,
        "tenant_id": "default",
        "from_email": "sender@example.com",
        "from_name": "Sender",
        "recipients": Recipients(to=(Address(to_email, to_name),)),
        "subject": f"Hello {i}",
        "html": f"<p>Hello {i}</p>",
        "text": f"Hello {i}",
        "rfc_message_id": rfc_message_id(message_id, "example.com"),
        "date": T0,
        "headers": {},
        "tags": ["test"],
    }
    fields.update(overrides)
    return OutgoingEmail(**fields)


# --- an email carrying everything (the test message) --------------------------------


def tiny_pdf() -> bytes:
    """A minimal valid PDF (one empty page), its xref offsets computed, with bytes of every
    kind in it: a binary comment line, as real PDFs have."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 72 72] >>",
    ]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def tiny_png() -> bytes:
    """A valid 1x1 red PNG."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte, then one red pixel
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


LOGO_CID = "logo@mailbag.test"


def full_email(i: int = 0, **overrides: Any) -> Any:
    """An email with two To, one Cc, one Bcc, a Reply-To, a PDF attachment and an inline
    PNG the HTML refers to as cid:, and an unsubscribe link."""
    from mailbag.domain.content import Address, Attachment, Recipients

    fields: dict[str, Any] = {
        "recipients": Recipients(
            to=(Address("ann@example.com", "Ann Ångström"), Address("bob@example.com")),
            cc=(Address("carol@example.com", "Carol, CFO"),),
            bcc=(Address("dave.hidden@example.com", "Dave Hidden"),),
        ),
        "reply_to": (Address("help@example.com", "Help Desk"),),
        "subject": f"Your invoice {i}",
        "html": f'<p>Invoice {i}</p><img src="cid:{LOGO_CID}" alt="logo">',
        "text": f"Invoice {i}",
        "attachments": (
            Attachment("Rechnung März.pdf", "application/pdf", tiny_pdf()),
            Attachment("logo.png", "image/png", tiny_png(), LOGO_CID),
        ),
        "unsubscribe_url": "https://example.com/unsubscribe?u=1",
    }
    fields.update(overrides)
    return outgoing_email(i, **fields)


def check_full_delivery(raw: bytes, sent: Any) -> None:
    """What a server received for `full_email` is that email: To, Cc and Reply-To parse back
    to the given mailboxes, no Bcc anywhere in the message, the attachment's bytes are the
    same, and each cid: in the HTML names an inline part of the same multipart/related."""
    import email.policy
    import re
    from email.parser import BytesParser

    message = BytesParser(policy=email.policy.default).parsebytes(raw)

    def mailboxes(header: str) -> list[tuple[str, str]]:
        return [(a.display_name, a.addr_spec) for a in message[header].addresses]

    def given(addresses: Any) -> list[tuple[str, str]]:
        return [(a.name or "", a.address) for a in addresses]

    assert mailboxes("To") == given(sent.recipients.to)
    assert mailboxes("Cc") == given(sent.recipients.cc)
    assert mailboxes("Reply-To") == given(sent.reply_to)
    assert "Bcc" not in message
    for hidden in sent.recipients.bcc:
        assert hidden.address.encode() not in raw.lower()
        assert (hidden.name or hidden.address).encode() not in raw
    assert message.get_content_type() == "multipart/mixed"
    regular = [a for a in sent.attachments if not a.inline]
    found = [part for part in message.iter_attachments() if not part["Content-ID"]]
    assert [(p.get_filename(), p.get_content_type()) for p in found] == [
        (a.filename, a.content_type) for a in regular
    ]
    assert [p.get_content() for p in found] == [a.content for a in regular]
    assert all(p.get_content_disposition() == "attachment" for p in found)
    (related,) = [p for p in message.walk() if p.get_content_type() == "multipart/related"]
    html = related.get_body(("html",))
    assert html is not None
    references = re.findall(r"cid:([^\"'\s>]+)", html.get_content())
    assert references, "the HTML refers to an inline image"
    inline = {str(p["Content-ID"]).strip("<>"): p for p in related.iter_parts() if p["Content-ID"]}
    for reference in references:
        part = inline[reference]
        (attachment,) = [a for a in sent.attachments if a.content_id == reference]
        assert part.get_content() == attachment.content
        assert part.get_content_disposition() == "inline"


def query_plan(conn: Connection, statement: Executable) -> str:
    """How the database says it would run `statement` (EXPLAIN), one line per plan row:
    what a test reads to tell an index probe from a scan or a sort."""
    dialect = dialect_of_connection(conn)
    compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params: Any = compiled.params
    if compiled.positional:
        params = tuple(compiled.params[name] for name in compiled.positiontup or ())
    prefix = {"sqlite": "EXPLAIN QUERY PLAN ", "postgresql": "EXPLAIN ", "mysql": "EXPLAIN "}
    rows = conn.exec_driver_sql(prefix[dialect] + compiled.string, params).mappings().all()
    if dialect == "mysql":
        return "\n".join(f"key={row['key']} extra={row['Extra']}" for row in rows)
    return "\n".join(str(list(row.values())[-1]) for row in rows)


def message_row(
    *, status: Status = Status.PENDING, at: datetime = T0, **columns: Any
) -> dict[str, Any]:
    """One outbox_messages row to INSERT as it stands (no enqueue, no events), changed last
    `at`: for tests that lay out many rows in an exact shape."""
    return {
        "id": uuid7(),
        "tenant_id": "t1",
        "to_address": "a@example.com",
        "template_data": {},
        "headers": {},
        "tags": [],
        "metadata": {},
        "status": status.value,
        "attempt_count": 0 if status is Status.PENDING else 1,
        "max_attempts": 5,
        "next_attempt_at": at,
        "created_at": at,
        "updated_at": at,
        **columns,
    }


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> None:
    """Poll `condition` (from a test's thread) until it holds; AssertionError after
    `timeout` seconds, naming `what` was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
