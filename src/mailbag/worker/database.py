"""Every database call the worker makes, and nothing else of the store: the worker sees
claims, decisions and results, never SQL, plans or connections.

- Each call is one short transaction, bounded by the database timeout: a database that
  does not answer in time is `DatabaseTimeout` (an OSError, one of `DB_ERRORS`).
- A claim reads its messages' attachment bytes in the same transaction (one query, none
  when no claimed message has attachments): a claim whose bytes could not be read is
  rolled back, never left held by nobody.
- A finalize writes every decision of a batch in one transaction, each claim's under its
  own token (the store moves the verifications that follow their email in it too).
- A finalize given up on after its COMMIT left is retried by the writer: the retry finds
  the rows finalized and reports them stale. Noisy, never wrong.
- A claim that fails may still have committed (its COMMIT landed, the answer did not):
  rows held under a token this worker never got messages for, so nobody sends them. The
  token is kept, and the worker releases what it holds before its next claim and when it
  stops, unsent and with no attempt spent. If the database stays away longer than a
  lease, the sweep makes them `unknown` instead, as for any lease nobody renewed.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag.clock import Clock
from mailbag.domain.message import Message
from mailbag.store import attachments, dispatch
from mailbag.store.database import within
from mailbag.store.dispatch import Claim, Finalized
from mailbag.store.enqueue import NOTIFY_CHANNEL
from mailbag.store.message_transitions import Changed
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase
from mailbag.templates import builtin
from mailbag.templates.book import Book, book_of
from mailbag.worker.ledger import Decided, Room, carried_bytes

__all__ = ["Claimed", "Finalized", "WorkerDatabase", "Written"]
T = TypeVar("T")

Written = list[tuple[list[Decided], Finalized]]  # each claim's decisions, and what became of them


@dataclass(frozen=True)
class Claimed:
    token: uuid.UUID
    messages: list[Message]
    contents: Mapping[str, bytes]  # the claimed messages' attachment bytes, by SHA-256
    # Claimed too, but their attachments were left unread: over the claim's room in bytes
    # (MAX_BYTES_IN_FLIGHT). The worker hands them back unsent.
    over: list[Message] = field(default_factory=list)


def fitting(messages: Sequence[Message], room: Room | None) -> tuple[list[Message], list[Message]]:
    """The messages, in claim order, whose attachments fit in the room (None: all), and
    those that do not. A worker holding nothing keeps its first message whatever its size
    (Settings keep MAX_BYTES_IN_FLIGHT at least MAX_MESSAGE_BYTES; a WorkerConfig built by
    hand might not): it is never handed back forever."""
    if room is None:
        return list(messages), []
    kept: list[Message] = []
    left = room.bytes
    for i, message in enumerate(messages):
        size = carried_bytes(message)
        if size > left and (kept or not room.holding_nothing):
            return kept, list(messages[i:])
        left -= size
        kept.append(message)
    return kept, []


class Gate(Protocol):
    """What an operator's pauses let a claim take (worker/fleet.py's Fleet)."""

    @property
    def fleet_paused(self) -> bool: ...

    def paused_tenants(self) -> frozenset[str]: ...


class _Open:
    fleet_paused = False

    def paused_tenants(self) -> frozenset[str]:
        return frozenset()


OPEN: Gate = _Open()


class WorkerDatabase:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        worker_id: str,
        provider: str,
        lease: timedelta,
        timeout: float,
        clock: Clock,
        book: Book | None = None,
    ) -> None:
        self.db = AsyncDatabase(engine)
        # The templates its claims render with: the versions it lacks are read with the claim.
        self.book = book or book_of(builtin())
        self.worker_id, self.provider = worker_id, provider
        self.lease, self.timeout, self.clock = lease, timeout, clock
        self.unconfirmed: list[uuid.UUID] = []  # tokens of claims that failed, maybe committed

    async def claim(
        self,
        limit: int,
        gate: Gate = OPEN,
        before: Plan[None] | None = None,
        room: Room | None = None,
    ) -> Claimed:
        """Due messages under a new token, as `gate` lets (none while the fleet is paused,
        none of a paused tenant), after `before` in the same transaction (the fleet's
        exchange of its state, which the gate then reads); a claim that fails is kept as
        unconfirmed. `room`: the attachment bytes it may read (the rest is `over`)."""
        token = uuid.uuid4()
        try:
            return await self._run(self._claim(token, limit, self.clock(), gate, before, room))
        except BaseException:
            self.unconfirmed.append(token)
            raise

    async def release_unconfirmed(self) -> int:
        """Release what the claims that failed still hold; how many messages that was."""
        if not self.unconfirmed:
            return 0
        tokens = list(self.unconfirmed)
        changed = await self._run(
            dispatch.release_unconfirmed(tokens=tokens, now=self.clock(), actor=self.worker_id)
        )
        del self.unconfirmed[: len(tokens)]
        return len(changed)

    def _claim(
        self,
        token: uuid.UUID,
        limit: int,
        now: datetime,
        gate: Gate,
        before: Plan[None] | None,
        room: Room | None,
    ) -> Plan[Claimed]:
        if before is not None:
            yield from before
        if gate.fleet_paused:
            return Claimed(token, [], {})
        claim: Claim = yield from dispatch.claim(
            worker_id=self.worker_id,
            now=now,
            lease=self.lease,
            limit=limit,
            token=token,
            paused_tenants=gate.paused_tenants(),
        )
        # Template versions not yet held: one more statement the first time each is seen.
        yield from self.book.load([m.template_version_id for m in claim.messages])
        messages, over = fitting(claim.messages, room)
        sha256s = {ref.sha256 for message in messages for ref in message.attachments}
        if not sha256s:  # the usual case: not one more statement
            return Claimed(claim.token, messages, {}, over)
        contents = yield from attachments.contents(sha256s)
        return Claimed(claim.token, messages, contents, over)

    async def finalize(self, batch: Sequence[Decided]) -> Written:
        """Write a batch of decisions; each claim's items with what the store made of them."""
        by_token: dict[uuid.UUID, list[Decided]] = defaultdict(list)
        for item in batch:
            by_token[item.token].append(item)
        return await self._run(self._finalize(by_token, self.clock()))

    def _finalize(
        self, by_token: Mapping[uuid.UUID, list[Decided]], now: datetime
    ) -> Plan[Written]:
        results: Written = []
        for token, items in by_token.items():
            finalized = yield from dispatch.finalize(
                token=token,
                decisions={i.message.id: i.decision for i in items},
                now=now,
                actor=self.worker_id,
                provider=self.provider,
            )
            results.append((items, finalized))
        return results

    async def extend_leases(self, by_token: Mapping[uuid.UUID, list[uuid.UUID]]) -> None:
        await self._run(self._extend_leases(by_token, self.clock()))

    def _extend_leases(
        self, by_token: Mapping[uuid.UUID, list[uuid.UUID]], now: datetime
    ) -> Plan[None]:
        for token, ids in by_token.items():
            yield from dispatch.extend_lease(token=token, ids=ids, now=now, lease=self.lease)

    async def sweep(self) -> list[Changed[Message]]:
        """Every expired lease (anyone's) made `unknown`."""
        return await self._run(dispatch.sweep_expired(now=self.clock(), actor=self.worker_id))

    async def expired_again(self, message_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Those of `message_ids` whose lease had expired before (a worker keeps dying)."""
        return await self._run(dispatch.expired_before(message_ids), read_only=True)

    async def _run(self, plan: Plan[T], *, read_only: bool = False) -> T:
        """One plan in one transaction (or, reading, one connection), within the timeout."""
        return await within(self.timeout, self._session(plan, read_only))

    async def _session(self, plan: Plan[T], read_only: bool) -> T:
        if read_only:
            async with self.db.connect() as session:
                return await session.run(plan)
        async with self.db.transaction() as tx:
            return await tx.run(plan)

    def can_listen(self) -> bool:
        return self.db.dialect == "postgresql"

    async def listen(
        self,
        url: str,
        on_notify: Callable[[str | None], None],
        log: Any,
        on_working: Callable[[bool], None] = lambda working: None,
    ) -> None:
        """Call `on_notify` at every NOTIFY (an enqueue's, a change of the fleet's state),
        reconnecting as needed (PostgreSQL; store/listen.py says what the two calls mean).

        `url` is LISTEN_URL (a direct session); each (re)connect is checked by a probe
        NOTIFY sent on this engine, the way enqueues send theirs (store/listen.py)."""
        from mailbag.store.listen import listen, notify

        async def probe(payload: str) -> None:
            async def send() -> None:
                async with self.db.engine.begin() as conn:
                    await notify(conn, NOTIFY_CHANNEL, payload)

            await within(self.timeout, send())

        await listen(
            url, NOTIFY_CHANNEL, on_notify, log, self.timeout, probe=probe, on_working=on_working
        )
