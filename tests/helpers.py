"""Small builders shared by the tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from mailbag.domain.delivery import Decision
from mailbag.domain.message import NewMessage, new_message
from mailbag.store import dispatch, message_transitions
from mailbag.store import enqueue as enqueue_store
from mailbag.store import messages as message_store
from mailbag.store.database import READ_ONLY
from mailbag.store.plan import run
from mailbag.store.schema import message_events, outbox_messages

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=120)


def message(i: int = 0, **fields: Any) -> NewMessage:
    fields.setdefault("to", f"user{i}@example.com")
    fields.setdefault("template", "welcome")
    fields.setdefault("data", {"name": f"User {i}"})
    return new_message(**fields)


def enqueue(db: Any, n: int = 1, now: datetime = T0, **fields: Any) -> list[Any]:
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
    db: Any, now: datetime = T0, limit: int = 100, worker: str = "w1", lease: timedelta = LEASE
) -> dispatch.Claim:
    with db.engine.begin() as conn:
        return run(conn, dispatch.claim(worker_id=worker, now=now, lease=lease, limit=limit))


def finalize(
    db: Any,
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


def sweep(db: Any, now: datetime) -> list[message_transitions.Changed]:
    with db.engine.begin() as conn:
        return run(conn, dispatch.sweep_expired(now=now, actor="sweeper"))


def get(db: Any, message_id: Any) -> Any:
    with db.engine.connect().execution_options(**READ_ONLY) as conn:
        return run(conn, message_store.get(message_id))


def events(db: Any, message_id: Any) -> list[Any]:
    with db.engine.connect() as conn:
        return run(conn, message_store.events(message_id))


def status_counts(db: Any) -> dict[str, int]:
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


def count_rows(db: Any) -> tuple[int, int]:
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
