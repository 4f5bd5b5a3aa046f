"""The states of an outbox message and every transition between them, as one table of data.

The store derives the guard of each conditional UPDATE and the state each change lands in
from this table (see machine.py), and the tests check every row the store touches against
it, so the rules live here and nowhere else.
"""

from __future__ import annotations

from enum import StrEnum

from mailbag.domain.machine import Counted, Machine, Transition, from_each


class Status(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    RETRYING = "retrying"
    SENT = "sent"
    FAILED = "failed"
    DEAD = "dead"
    UNKNOWN = "unknown"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # its expires_at passed before it could be sent


class Action(StrEnum):
    ENQUEUE = "enqueue"  # a new message enters the outbox
    SUPPRESS = "suppress"  # a new message to a suppressed address fails at once
    CLAIM = "claim"  # a worker takes it under a lease
    MARK_SENT = "mark_sent"  # the provider accepted it
    RETRY = "retry"  # a failure known to precede acceptance; budget left
    FAIL = "fail"  # a permanent rejection
    BURY = "bury"  # a transient failure with the attempt budget spent: dead letter
    MARK_UNKNOWN = "mark_unknown"  # the provider may or may not have accepted it
    RELEASE = "release"  # handed back unsent, no attempt spent (provider disabled, shutdown)
    EXPIRE = "expire"  # the lease ran out before any finalize: the sweep
    REQUEUE = "requeue"  # an operator sends it again
    CANCEL = "cancel"  # withdrawn before any attempt
    ERASE = "erase"  # withdrawn, tried or not, because its recipient's data was erased
    RESOLVE_SENT = "resolve_sent"  # evidence shows an unknown send was accepted
    RESOLVE_FAILED = "resolve_failed"  # evidence shows an unknown send was not accepted
    FLAG = "flag"  # no evidence came in time: an operator has to decide
    LAPSE = "lapse"  # claimed after its expires_at: finalized without a provider call


S, A = Status, Action
# A released message goes back to where it was claimed from, judged by its history.
NEVER_ATTEMPTED, ATTEMPTED = (
    Counted("attempt_count", positive=False),
    Counted("attempt_count", True),
)

TRANSITIONS: tuple[Transition[Status, Action], ...] = (
    Transition(None, A.ENQUEUE, S.PENDING),
    Transition(None, A.SUPPRESS, S.FAILED),
    *from_each((S.PENDING, S.RETRYING), A.CLAIM, S.PROCESSING),
    Transition(S.PROCESSING, A.MARK_SENT, S.SENT),
    Transition(S.PROCESSING, A.RETRY, S.RETRYING),
    Transition(S.PROCESSING, A.FAIL, S.FAILED),
    Transition(S.PROCESSING, A.BURY, S.DEAD),
    Transition(S.PROCESSING, A.MARK_UNKNOWN, S.UNKNOWN),
    Transition(S.PROCESSING, A.RELEASE, S.PENDING, when=NEVER_ATTEMPTED),
    Transition(S.PROCESSING, A.RELEASE, S.RETRYING, when=ATTEMPTED),
    Transition(S.PROCESSING, A.EXPIRE, S.UNKNOWN),
    Transition(S.PROCESSING, A.LAPSE, S.EXPIRED),
    *from_each((S.UNKNOWN, S.DEAD), A.REQUEUE, S.PENDING),
    Transition(S.PENDING, A.CANCEL, S.CANCELLED),
    *from_each((S.PENDING, S.RETRYING), A.ERASE, S.CANCELLED),
    Transition(S.UNKNOWN, A.RESOLVE_SENT, S.SENT),
    Transition(S.UNKNOWN, A.RESOLVE_FAILED, S.FAILED),
    Transition(S.UNKNOWN, A.FLAG, S.UNKNOWN),
)

MESSAGES: Machine[Status, Action] = Machine(TRANSITIONS)
sources, targets, target = MESSAGES.sources, MESSAGES.targets, MESSAGES.target
is_allowed, can_move = MESSAGES.is_allowed, MESSAGES.can_move

CLAIMABLE: frozenset[Status] = sources(A.CLAIM)
TERMINAL: frozenset[Status] = frozenset({S.SENT, S.FAILED, S.DEAD, S.CANCELLED, S.EXPIRED})
NEEDS_DECISION: frozenset[Status] = frozenset({S.UNKNOWN})
