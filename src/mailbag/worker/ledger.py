"""Every message this worker holds, from its claim until its outcome is written.

A held message moves one way: claimed -> sending -> decided -> written (then forgotten).

- CONCURRENCY bounds the messages claimed or sending. A message gives its slot back when
  its outcome is decided, not when that is written: a decided message only waits for its
  finalize and needs no slot (`slot_freed` wakes a loop waiting for one).
- Every held message keeps its lease, decided ones too (`by_token`), and while any
  decision is unwritten the sweep waits (`unwritten`): it would turn our own rows, whose
  outcome we know, into `unknown`.
- When BACKLOG_FACTOR * CONCURRENCY decisions wait to be written the database has fallen
  behind: no slot is free until it catches up.
- What was claimed and never sent (`unstarted`) is handed back at shutdown.
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mailbag.domain.delivery import Decision
from mailbag.domain.message import Message

BACKLOG_FACTOR = 4


class Stage(enum.Enum):
    CLAIMED = "claimed"
    SENDING = "sending"
    DECIDED = "decided"


@dataclass(slots=True)
class Held:
    token: uuid.UUID  # the claim this message came in
    message: Message
    stage: Stage = Stage.CLAIMED


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision waiting to be written: the claim it settles and what the log line needs."""

    token: uuid.UUID
    message: Message
    decision: Decision


class Ledger:
    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.held: dict[uuid.UUID, Held] = {}
        self.unwritten = 0  # held messages in stage DECIDED
        self.slot_freed = asyncio.Event()

    @property
    def undecided(self) -> int:
        """Messages claimed or sending: what CONCURRENCY bounds."""
        return len(self.held) - self.unwritten

    @property
    def full(self) -> bool:
        return self.undecided >= self.concurrency

    @property
    def backlogged(self) -> bool:
        return self.unwritten >= BACKLOG_FACTOR * self.concurrency

    def free_slots(self) -> int:
        """How many messages the next claim may take."""
        return 0 if self.backlogged else self.concurrency - self.undecided

    def claimed(self, token: uuid.UUID, messages: Iterable[Message]) -> None:
        for message in messages:
            self.held[message.id] = Held(token, message)

    def sending(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.held[message.id].stage = Stage.SENDING

    def decided(self, message: Message, decision: Decision) -> Decided:
        """Record the decision; the slot is free from now on. Returns what is to be written."""
        held = self.held[message.id]
        held.stage = Stage.DECIDED
        self.unwritten += 1
        self.slot_freed.set()
        return Decided(held.token, message, decision)

    def written(self, items: Sequence[Decided]) -> None:
        for item in items:
            self.held.pop(item.message.id, None)
        self.unwritten -= len(items)

    def by_token(self) -> dict[uuid.UUID, list[uuid.UUID]]:
        """Every held message's id, by claim: the leases to keep."""
        ids: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        for message_id, held in self.held.items():
            ids[held.token].append(message_id)
        return ids

    def unstarted(self) -> list[Message]:
        """Claimed, never sent, not decided: safe to hand back."""
        return [h.message for h in self.held.values() if h.stage is Stage.CLAIMED]
