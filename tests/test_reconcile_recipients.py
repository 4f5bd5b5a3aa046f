"""Provider events about one recipient of a message with several: matched to the message,
and a bounce or complaint suppresses the recipient it names, not the message's first To."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from mailbag.domain.events import BounceType, EventKind, ProviderEvent
from mailbag.services import outbox as outbox_service
from mailbag.services.reconciliation import ingest, own_recipient
from mailbag.store.schema import suppressions

from conftest import TestDB
from helpers import get, message


def bounce(message_id: Any, recipient: str | None, key: str) -> ProviderEvent:
    return ProviderEvent(
        provider="brevo",
        kind=EventKind.BOUNCED,
        provider_event="hard_bounce",
        occurred_at=datetime.now(UTC),
        provider_message_id=None,
        message_id=message_id,
        recipient=recipient,
        dedup_key=key,
        detail="550 no such user",
        raw={},
        bounce_type=BounceType.HARD,
    )


def suppressed(db: TestDB) -> set[str]:
    with db.engine.connect() as conn:
        return {row.email for row in conn.execute(select(suppressions))}


async def test_a_bounce_of_the_cc_suppresses_the_cc_only(db, async_engine):
    with db.engine.begin() as conn:
        (result,) = outbox_service.write_many(
            conn,
            [message(0, to=["ada@example.com", "bob@example.com"], cc=["cy@example.com"])],
        )
    msg = get(db, result.message.id)
    assert [own_recipient(msg, a) for a in ("CY@example.com", "eve@example.com")] == [
        "cy@example.com",
        None,
    ]
    # Naming nobody, an event cannot say which of three recipients bounced.
    assert own_recipient(msg, None) is None

    report = await ingest(async_engine, [bounce(msg.id, "cy@example.com", "b1")], datetime.now(UTC))
    assert report.suppressed == 1
    assert suppressed(db) == {"cy@example.com"}

    report = await ingest(async_engine, [bounce(msg.id, None, "b2")], datetime.now(UTC))
    assert report.suppressed == 0  # stored, matched, but whose address it is is unknown
    report = await ingest(
        async_engine, [bounce(msg.id, "eve@example.com", "b3")], datetime.now(UTC)
    )
    assert report.suppressed == 0 and suppressed(db) == {"cy@example.com"}


async def test_a_single_recipient_message_still_suppresses_its_to(db, async_engine):
    with db.engine.begin() as conn:
        (result,) = outbox_service.write_many(conn, [message(0, to="ada@example.com")])
    report = await ingest(async_engine, [bounce(result.message.id, None, "b1")], datetime.now(UTC))
    assert report.suppressed == 1 and suppressed(db) == {"ada@example.com"}
