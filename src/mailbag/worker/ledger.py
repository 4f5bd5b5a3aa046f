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
- MAX_BYTES_IN_FLIGHT bounds the attachment bytes of the messages claimed or sending
  (`bytes_held`): a claim keeps what fits (`room`) and hands the rest back unsent, and
  after that claims nothing (`full`) until a held message is decided.
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


@dataclass(frozen=True)
class Room:
    """The attachment bytes a claim may read, and whether the worker holds none now."""

    bytes: int
    holding_nothing: bool


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


def carried_bytes(message: Message) -> int:
    """The attachment bytes a claim of `message` reads into memory."""
    return sum(ref.size for ref in message.attachments)


class Ledger:
    def __init__(self, concurrency: int, max_bytes: int | None = None) -> None:
        self.concurrency = concurrency
        self.max_bytes = max_bytes  # MAX_BYTES_IN_FLIGHT (None: no bound)
        self.held: dict[uuid.UUID, Held] = {}
        self.unwritten = 0  # held messages in stage DECIDED
        self.bytes_held = 0  # attachment bytes of the undecided held messages
        self.bytes_refused = False  # a claim handed messages back for want of room
        self.slot_freed = asyncio.Event()

    @property
    def undecided(self) -> int:
        """Messages claimed or sending: what CONCURRENCY bounds."""
        return len(self.held) - self.unwritten

    @property
    def full(self) -> bool:
        return self.undecided >= self.concurrency or self.bytes_refused

    def room(self) -> Room | None:
        """Attachment bytes the next claim may add (None: no bound)."""
        if self.max_bytes is None:
            return None
        return Room(self.max_bytes - self.bytes_held, holding_nothing=self.undecided == 0)

    @property
    def backlogged(self) -> bool:
        return self.unwritten >= BACKLOG_FACTOR * self.concurrency

    def free_slots(self) -> int:
        """How many messages the next claim may take."""
        if self.backlogged or self.bytes_refused:
            return 0
        return self.concurrency - self.undecided

    def claimed(self, token: uuid.UUID, messages: Iterable[Message]) -> None:
        for message in messages:
            self.held[message.id] = Held(token, message)
            self.bytes_held += carried_bytes(message)

    def sending(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.held[message.id].stage = Stage.SENDING

    def decided(self, message: Message, decision: Decision) -> Decided:
        """Record the decision; the slot is free from now on. Returns what is to be written."""
        held = self.held[message.id]
        if held.stage is not Stage.DECIDED:
            self.bytes_held -= carried_bytes(message)
            self.bytes_refused = False  # room was made: claims may try again
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
