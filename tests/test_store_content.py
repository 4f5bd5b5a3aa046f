"""What a message can carry, through the store, on every database: recipients, reply-to,
sender identities, attachments stored once per content, suppression per recipient,
priority in the claim, expiry, and the purge of attachments nothing references."""

from __future__ import annotations

import os
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from mailbag.domain.content import HEAD_START, Address, Attachment, Limits, Recipients
from mailbag.domain.delivery import Decision
from mailbag.domain.message import Filter, InvalidMessage, NewMessage
from mailbag.domain.states import Action, Status
from mailbag.services import maintenance
from mailbag.store import attachments, operator, senders, stats, suppressions
from mailbag.store import enqueue as enqueue_store
from mailbag.store.plan import Plan, run, run_async
from mailbag.store.schema import (
    attachments as attachments_table,
)
from mailbag.store.schema import (
    message_attachments,
    message_events,
    outbox_messages,
    tenant_senders,
)

from conftest import TestDB
from helpers import T0, claim, finalize, get, message, race_claims

PDF = b"%PDF-1.7\n" + os.urandom(200_000) + b"\n%%EOF\n"
LOGO = b"\x89PNG\r\n\x1a\n" + os.urandom(3_000)


def pdf(name: str = "invoice.pdf", content: bytes = PDF) -> Attachment:
    return Attachment(name, "application/pdf", content)


def do(db: TestDB, plan: Plan[Any]) -> Any:
    with db.engine.begin() as conn:
        return run(conn, plan)


def put(db: TestDB, *messages: NewMessage, now: Any = T0) -> list[Any]:
    results = do(db, enqueue_store.enqueue(list(messages), now=now, default_max_attempts=5))
    return [r.message for r in results]


def counts(db: TestDB) -> dict[str, int]:
    tables = (outbox_messages, message_events, attachments_table, message_attachments)
    with db.engine.connect() as conn:
        return {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar_one() for t in tables
        }


def test_one_pdf_sent_to_a_thousand_recipients_is_stored_once(db):
    batch = [message(i, attachments=[pdf()]) for i in range(1000)]
    stored = put(db, *batch)
    assert len({m.id for m in stored}) == 1000
    assert counts(db)["attachments"] == 1
    assert counts(db)["message_attachments"] == 1000
    with db.engine.connect() as conn:
        (content,) = conn.execute(select(attachments_table.c.content)).scalars().all()
    assert bytes(content) == PDF
    # A second bulk send of the same bytes adds references, not content.
    put(db, *[message(i, attachments=[pdf("copy.pdf")]) for i in range(3)])
    assert counts(db)["attachments"] == 1


def test_attachment_bytes_and_order_come_back_identical(db):
    logo = Attachment("logo.png", "image/png", LOGO, content_id="logo")
    ready_made = message(
        template=None,
        data=None,
        subject="Your invoice",
        html='<p><img src="cid:logo"> Your invoice</p>',
        attachments=[pdf(), logo],
    )
    (stored,) = put(db, ready_made)
    read = get(db, stored.id)
    assert read.attachments == (pdf().ref, logo.ref) == stored.attachments
    assert read.attachments[1].content_id == "logo" and read.attachments[0].size == len(PDF)
    with db.engine.connect() as conn:
        found = run(conn, attachments.contents({a.sha256 for a in read.attachments}))
        assert found == {pdf().sha256: PDF, logo.sha256: LOGO}
        assert run(conn, attachments.content(stored.id, 1)) == (logo.ref, LOGO)
        assert run(conn, attachments.content(stored.id, 2)) is None
    (claimed,) = claim(db).messages
    assert claimed.attachments == read.attachments


def test_an_attachment_at_the_size_limit_is_stored_whole(db):
    # 10 MiB, the default limit: within MariaDB's default max_allowed_packet (16 MiB) even
    # escaped, in one INSERT.
    big = pdf("scan.pdf", os.urandom(Limits().max_attachment_bytes - 2048))
    (stored,) = put(db, message(attachments=[big]))
    with db.engine.connect() as conn:
        assert run(conn, attachments.content(stored.id, 0)) == (big.ref, big.content)


async def test_the_async_drivers_store_and_read_a_large_attachment_whole(db, async_engine):
    # The API and the worker run on asyncmy, psycopg's async side and aiosqlite.
    big = pdf("scan.pdf", os.urandom(Limits().max_message_bytes - len(PDF) - 2048))
    async with async_engine.begin() as conn:
        (result,) = await run_async(
            conn,
            enqueue_store.enqueue(
                [message(attachments=[big, pdf()])], now=T0, default_max_attempts=5
            ),
        )
    async with async_engine.connect() as conn:
        found = await run_async(conn, attachments.contents([big.sha256, pdf().sha256]))
        assert found == {big.sha256: big.content, pdf().sha256: PDF}
    assert get(db, result.message.id).attachments == (big.ref, pdf().ref)


def test_a_claim_of_plain_messages_carries_no_attachments(db):
    put(db, message(0), message(1, attachments=[pdf()]))
    by_address = {m.to_address: m for m in claim(db).messages}
    assert by_address["user0@example.com"].attachments == ()
    assert by_address["user1@example.com"].attachments == (pdf().ref,)
    assert [by_address[f"user{i}@example.com"].attachment_count for i in (0, 1)] == [0, 1]


def test_a_send_accepted_for_some_recipients_records_the_refused_ones(db):
    a, b = put(db, message(0, to=["ada@example.com", "bob@example.com"]), message(1))
    token = claim(db).token
    refused = "refused at RCPT TO: bob@example.com: 550 no such user"
    finalize(
        db,
        token,
        (a.id, Decision(Action.MARK_SENT, error=refused, provider_message_id="<p-a>")),
        (b.id, Decision(Action.MARK_SENT, provider_message_id="<p-b>")),
    )
    assert (get(db, a.id).status, get(db, a.id).last_error) == (Status.SENT.value, refused)
    assert (get(db, b.id).status, get(db, b.id).last_error) == (Status.SENT.value, None)
    with db.engine.connect() as conn:
        rows = conn.execute(
            select(message_events.c.message_id, message_events.c.detail).where(
                message_events.c.to_status == Status.SENT.value
            )
        )
        details = {row.message_id: row.detail for row in rows}
    assert details == {a.id: refused, b.id: None}


def test_recipients_and_reply_to_round_trip(db):
    (single,) = put(db, message(0, to={"address": "ada@example.com", "name": "Ada L"}))
    (multi,) = put(
        db,
        message(
            to=["ada@example.com", {"address": "bob@example.com", "name": "Bob"}],
            cc=["carol@example.com"],
            bcc=["dave@example.com"],
            reply_to=[{"address": "help@example.com", "name": "Help desk"}],
        ),
    )
    with db.engine.connect() as conn:
        rows = conn.execute(select(outbox_messages.c.id, outbox_messages.c.carried))
        stored = {row.id: row.carried for row in rows}
    assert stored[single.id] is None  # one To and nothing else: no JSON at all
    assert set(stored[multi.id]) == {"recipients", "reply_to"}
    read = get(db, multi.id)
    assert read.recipients == Recipients(
        to=(Address("ada@example.com"), Address("bob@example.com", "Bob")),
        cc=(Address("carol@example.com"),),
        bcc=(Address("dave@example.com"),),
    )
    assert (read.to_address, read.to_name) == ("ada@example.com", None)
    assert read.reply_to == (Address("help@example.com", "Help desk"),)
    assert get(db, single.id).all_recipients == Recipients(
        to=(Address("ada@example.com", "Ada L"),)
    )
    assert read == multi


def suppress(db: TestDB, *emails: str) -> None:
    for email in emails:
        do(db, suppressions.add(tenant_id="default", email=email, reason="hard_bounce", now=T0))


def test_a_suppressed_to_is_dropped_and_recorded(db):
    suppress(db, "ADA@example.com")
    (msg,) = put(db, message(to=["ada@example.com", "bob@example.com"], cc=["carol@example.com"]))
    read = get(db, msg.id)
    assert read.status == Status.PENDING.value
    assert read.to_address == "bob@example.com"
    assert read.all_recipients.envelope == ["bob@example.com", "carol@example.com"]
    assert read.suppressed == ("ada@example.com",)


def test_a_suppressed_copy_is_dropped_and_the_message_still_goes(db):
    suppress(db, "carol@example.com")
    (msg,) = put(db, message(to=["ada@example.com"], cc=["carol@example.com"]))
    read = get(db, msg.id)
    assert read.status == Status.PENDING.value
    assert read.recipients is None and read.to_address == "ada@example.com"
    assert read.suppressed == ("carol@example.com",)


def test_a_message_whose_every_to_is_suppressed_fails_even_with_copies_left(db):
    suppress(db, "ada@example.com", "bob@example.com")
    (msg,) = put(db, message(to=["ada@example.com", "bob@example.com"], cc=["carol@example.com"]))
    read = get(db, msg.id)
    assert (read.status, read.last_error) == (Status.FAILED.value, "suppressed")
    assert read.suppressed == ("ada@example.com", "bob@example.com")
    assert claim(db).messages == []


def test_a_from_the_tenant_does_not_own_is_refused_and_writes_nothing(db):
    do(db, senders.add("acme", "billing@acme.example", "Acme Billing", T0))
    before = counts(db)
    foreign = message(tenant_id="acme", from_address="ceo@other.example", attachments=[pdf()])
    with pytest.raises(InvalidMessage) as refused:
        put(db, message(0, tenant_id="acme"), foreign)
    assert "not a sender identity of tenant acme" in refused.value.errors["from"]
    assert "mailbag tenants senders add acme ceo@other.example" in refused.value.errors["from"]
    assert counts(db) == before
    # Another tenant's identity is no better.
    with pytest.raises(InvalidMessage):
        put(db, message(tenant_id="other", from_address="billing@acme.example"))
    assert counts(db) == before

    (ok,) = put(db, message(tenant_id="acme", from_address="Billing@acme.example"))
    assert (ok.from_address, ok.from_name) == ("Billing@acme.example", "Acme Billing")
    (named,) = put(
        db, message(tenant_id="acme", from_address="billing@acme.example", from_name="Invoices")
    )
    assert get(db, named.id).from_name == "Invoices"


def test_sender_identities_are_added_listed_and_removed(db):
    assert do(db, senders.add("acme", "billing@acme.example", "Billing", T0)) is True
    assert do(db, senders.add("acme", "BILLING@acme.example", None, T0)) is False
    assert do(db, senders.add("acme", "news@acme.example", None, T0)) is True
    assert do(db, senders.add("other", "news@acme.example", None, T0)) is True
    listed = do(db, senders.listing("acme"))
    assert [(s.address, s.name, s.created_at) for s in listed] == [
        ("billing@acme.example", "Billing", T0),
        ("news@acme.example", None, T0),
    ]
    assert do(db, senders.remove("acme", "Billing@acme.example")) is True
    assert do(db, senders.remove("acme", "billing@acme.example")) is False
    assert [s.address for s in do(db, senders.listing("acme"))] == ["news@acme.example"]
    with db.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(tenant_senders)).scalar_one() == 2


def test_a_replayed_key_writes_no_attachment_and_returns_the_first(db):
    (first,) = put(db, message(idempotency_key="inv-1", attachments=[pdf()]))
    before = counts(db)
    results = do(
        db,
        enqueue_store.enqueue(
            [message(idempotency_key="inv-1", attachments=[pdf(content=LOGO)])],
            now=T0,
            default_max_attempts=5,
        ),
    )
    assert [(r.created, r.message.id) for r in results] == [(False, first.id)]
    assert results[0].message.attachments == (pdf().ref,)
    assert counts(db) == before


def test_higher_priority_is_claimed_first_among_due_messages(db):
    low, normal, high = put(
        db,
        message(0, priority="low"),
        message(1, priority="normal"),
        message(2, priority="high"),
    )
    assert (high.claim_order_at, low.claim_order_at) == (T0 - HEAD_START, T0 + HEAD_START)
    assert [m.id for m in claim(db, limit=10).messages] == [high.id, normal.id, low.id]


def test_claims_one_at_a_time_follow_the_claim_order_not_the_enqueue_order(db):
    # Enqueued first, largest id last: MariaDB's claim once locked its window in id order,
    # taking the high-priority message last.
    stored = put(
        db,
        message(0, priority="low"),
        *[message(i) for i in range(1, 6)],
        message(6, priority="high"),
    )
    taken = [m.id for _ in stored for m in claim(db, limit=1).messages]
    assert taken == [stored[-1].id, *[m.id for m in stored[1:-1]], stored[0].id]


def test_a_stream_of_high_priority_mail_does_not_starve_a_low_one(db):
    (low,) = put(db, message(0, priority="low"))
    # High-priority messages keep arriving from just over 2 * HEAD_START later on.
    later = T0 + 2 * HEAD_START + timedelta(seconds=1)
    put(db, *[message(i, priority="high") for i in range(1, 6)], now=later)
    now = later + timedelta(seconds=30)
    assert [m.id for m in claim(db, now=now, limit=1).messages] == [low.id]
    assert len(claim(db, now=now, limit=10).messages) == 5


def test_the_oldest_due_message_is_found_whatever_the_priorities(db):
    with db.engine.connect() as conn:
        assert run(conn, stats.oldest_due(T0)) is None
    put(db, message(0, priority="high"), now=T0 + timedelta(minutes=8))
    put(db, message(1, priority="low"), now=T0)  # claimed last of the three, waiting longest
    put(db, message(2, priority="high", send_at=T0 + timedelta(hours=1)))  # not due
    with db.engine.connect() as conn:
        assert run(conn, stats.oldest_due(T0 + timedelta(minutes=9))) == T0
        assert run(conn, stats.oldest_due(T0 - timedelta(minutes=1))) is None


def test_a_high_priority_message_is_not_claimed_before_it_is_due(db):
    (high,) = put(db, message(0, priority="high", send_at=T0 + timedelta(minutes=1)))
    assert claim(db, now=T0).messages == []
    assert [m.id for m in claim(db, now=T0 + timedelta(minutes=1)).messages] == [high.id]


def test_a_low_priority_message_due_now_is_claimed_when_nothing_else_waits(db):
    (low,) = put(db, message(0, priority="low"))
    assert [m.id for m in claim(db, now=T0).messages] == [low.id]


def test_retry_and_requeue_keep_the_priority_in_the_claim_order(db):
    (high,) = put(db, message(0, priority="high"))
    token = claim(db).token
    retry_at = T0 + timedelta(minutes=10)
    finalize(db, token, (high.id, Decision(Action.RETRY, error="421", next_attempt_at=retry_at)))
    assert get(db, high.id).claim_order_at == retry_at - HEAD_START
    token = claim(db, now=retry_at).token
    finalize(db, token, (high.id, Decision(Action.MARK_UNKNOWN, error="timeout")), now=retry_at)
    later = retry_at + timedelta(hours=1)
    do(
        db,
        operator.requeue(
            where=Filter(ids=[high.id]), now=later, actor="operator", extra_attempts=2
        ),
    )
    assert get(db, high.id).claim_order_at == later - HEAD_START


def test_an_expired_claim_lapses_without_spending_an_attempt(db):
    (msg,) = put(db, message(0, expires_at=T0 + timedelta(minutes=1)))
    held = claim(db, now=T0 + timedelta(minutes=2))
    detail = "expired before it could be sent"
    finalize(db, held.token, (msg.id, Decision(Action.LAPSE, error=detail)))
    read = get(db, msg.id)
    assert (read.status, read.attempt_count, read.last_error) == (
        Status.EXPIRED.value,
        0,
        detail,
    )
    assert read.claim_token is None and read.expires_at == T0 + timedelta(minutes=1)
    with db.engine.connect() as conn:
        last = conn.execute(
            select(message_events.c.to_status, message_events.c.detail)
            .where(message_events.c.message_id == msg.id)
            .order_by(message_events.c.id.desc())
        ).first()
    assert tuple(last) == (Status.EXPIRED.value, detail)


# SQLite has one writer at a time: the servers are where claims race.
@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_concurrent_claims_with_mixed_priorities_take_every_message_once(db):
    total, claimers = 900, 6
    levels = ("high", "normal", "low")
    put(db, *[message(i, priority=levels[i % 3]) for i in range(total)])
    taken = race_claims(db, claimers, limit=20)
    every = [mid for ids in taken for mid in ids]
    assert [mid for mid, n in Counter(every).items() if n > 1] == []
    assert len(every) == total
    assert sum(1 for ids in taken if ids) > 1


def test_purge_removes_unreferenced_attachments_and_keeps_referenced_ones(db):
    shared = pdf("terms.pdf", b"%PDF terms" + os.urandom(100))
    only_old = pdf("old.pdf", b"%PDF old" + os.urandom(100))
    only_new = pdf("new.pdf", b"%PDF new" + os.urandom(100))
    (old,) = put(db, message(0, attachments=[only_old, shared]))
    (new,) = put(db, message(1, attachments=[only_new, shared]))
    do(db, operator.cancel(where=Filter(ids=[old.id]), now=T0, actor="test"))
    purged = maintenance.purge(
        db.engine, older_than=T0 + timedelta(days=1), now=T0 + timedelta(days=1)
    )
    assert (purged.messages, purged.attachments) == (1, 1)
    with db.engine.connect() as conn:
        left = set(conn.execute(select(attachments_table.c.sha256)).scalars())
        assert run(conn, attachments.contents(left)) == {
            shared.sha256: shared.content,
            only_new.sha256: only_new.content,
        }
    assert get(db, new.id).attachments == (only_new.ref, shared.ref)
    again = maintenance.purge(db.engine, older_than=T0, now=T0)
    assert again.attachments == 0
