"""Many messages at once: `mailbag send-bulk` and `POST /v1/messages/batch`.

A batch is written by outbox.write_many in one transaction (the API) or in chunks of one
transaction each (the CLI); what differs from a single enqueue is that one bad message
must refuse that message only. services.intake judges each message alone;
the one rule that needs the database, an explicit `from` being a sender identity of the
message's tenant, is checked here per message before anything is written (enqueue would
refuse the whole batch for it).

The API's batch is idempotent as a whole by its Idempotency-Key (services/idempotency.py):
the answer, every item's result, is stored in the transaction that wrote the messages and
replayed for the same key and body; another body under that key is a 409.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from mailbag.domain.message import InvalidMessage, NewMessage
from mailbag.services import intake
from mailbag.services import outbox as outbox_service
from mailbag.services.idempotency import Response, execute, fingerprint
from mailbag.services.messages import message_fingerprint, public
from mailbag.services.templates import pin_each
from mailbag.settings import Settings
from mailbag.store import sender_domains
from mailbag.store import senders as sender_store
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase, AsyncSession, Session

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

ACTOR = "api"
OPERATION = "POST /v1/messages/batch"
MAX_ITEMS = 1000


def foreign_senders(
    messages: Sequence[NewMessage], ready_from: str | None = None
) -> Plan[dict[int, InvalidMessage]]:
    """The messages (by position) whose explicit `from` is not a sender identity of their
    tenant, or (with `ready_from`, Settings.ready_from) whose From is on a sender domain
    that is not ready, each with the error enqueue would raise for it."""
    refused = (yield from sender_domains.unready(messages, ready_from)) if ready_from else {}
    wanted = {(m.tenant_id, m.from_address.lower()) for m in messages if m.from_address}
    if not wanted:
        return refused
    identities = yield from sender_store.owned(wanted)
    return refused | {
        index: InvalidMessage(
            {
                "from": f"{m.from_address} is not a sender identity of tenant {m.tenant_id}; "
                f"add it with `mailbag tenants senders add {m.tenant_id} {m.from_address}`"
            }
        )
        for index, m in enumerate(messages)
        if m.from_address and (m.tenant_id, m.from_address.lower()) not in identities
    }


def refused_senders(
    conn: Connection, messages: Sequence[NewMessage], ready_from: str | None = None
) -> dict[int, InvalidMessage]:
    """foreign_senders, on a sync connection (send-bulk checks every row before writing)."""
    return Session(conn).run(foreign_senders(messages, ready_from))


@dataclass(frozen=True)
class Item:
    """One item of a batch request: the message it asks for (with the item's own
    idempotency key, if any), or why it cannot be one (a problem body, as the API answers a
    single request with it) and the item as given."""

    message: NewMessage | None
    problem: dict[str, Any] | None = None
    raw: Any = None  # what an invalid item was, for the request's fingerprint

    def fingerprint(self) -> Any:
        if self.message is not None:
            return [message_fingerprint(self.message), self.message.idempotency_key]
        return ["invalid", self.raw]


Problem = Callable[[InvalidMessage], dict[str, Any]]


class Batches:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.db, self.settings = AsyncDatabase(engine), settings

    async def create(
        self,
        *,
        tenant_id: str,
        key: str | None,
        items: Sequence[Item],
        problem: Problem,
        now: datetime,
    ) -> Response:
        """Write every valid item's message in one transaction; answer with one result per
        item, in order. `problem` turns an InvalidMessage into the problem body for it."""

        async def work(tx: AsyncSession) -> Response:
            wanted = [(i, item.message) for i, item in enumerate(items) if item.message]
            ready_from = self.settings.ready_from
            # Each item's template version and one render of it, then its sender: an item
            # refused by either is reported as invalid, and the others are written.
            book = intake.book(self.settings)
            messages, refused = await tx.run(pin_each([m for _, m in wanted], book))
            wanted = [(i, m) for (i, _), m in zip(wanted, messages, strict=True)]
            senders = await tx.run(foreign_senders(messages, ready_from))
            refused = senders | refused
            results: list[dict[str, Any]] = [
                {"index": i, "result": "invalid", "error": item.problem}
                for i, item in enumerate(items)
            ]
            for position, (i, _) in enumerate(wanted):
                if position in refused:
                    results[i]["error"] = problem(refused[position])
            writable = [(i, m) for position, (i, m) in enumerate(wanted) if position not in refused]
            enqueued = await outbox_service.write_many_async(
                tx.connection,
                [m for _, m in writable],
                book=book,
                max_attempts=self.settings.max_attempts,
                actor=ACTOR,
                now=now,
                ready_from=ready_from,
            )
            for (i, _), done in zip(writable, enqueued, strict=True):
                results[i] = {
                    "index": i,
                    "result": "created" if done.created else "existing",
                    "message": public(done.message),
                }
            counts = {kind: 0 for kind in ("created", "existing", "invalid")}
            for result in results:
                counts[result["result"]] += 1
            return Response(200, {**counts, "results": results})

        return await execute(
            self.db,
            tenant_id=tenant_id,
            key=key,
            operation=OPERATION,
            request_fingerprint=fingerprint(OPERATION, {"items": [i.fingerprint() for i in items]}),
            now=now,
            ttl=timedelta(hours=self.settings.idempotency_ttl_hours),
            work=work,
        )
