"""The states of an outbox message and every transition between them, as one table of data.

The store derives the guard of each conditional UPDATE from this table, and the tests check
every row the store touches against it, so the rules live here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    RETRYING = "retrying"
    SENT = "sent"
    FAILED = "failed"
    DEAD = "dead"
    UNKNOWN = "unknown"
    CANCELLED = "cancelled"


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
    RESOLVE_SENT = "resolve_sent"  # evidence shows an unknown send was accepted
    RESOLVE_FAILED = "resolve_failed"  # evidence shows an unknown send was not accepted
    FLAG = "flag"  # no evidence came in time: an operator has to decide


@dataclass(frozen=True)
class Transition:
    source: Status | None  # None: the message is being created
    action: Action
    target: Status


S, A = Status, Action

TRANSITIONS: tuple[Transition, ...] = (
    Transition(None, A.ENQUEUE, S.PENDING),
    Transition(None, A.SUPPRESS, S.FAILED),
    Transition(S.PENDING, A.CLAIM, S.PROCESSING),
    Transition(S.RETRYING, A.CLAIM, S.PROCESSING),
    Transition(S.PROCESSING, A.MARK_SENT, S.SENT),
    Transition(S.PROCESSING, A.RETRY, S.RETRYING),
    Transition(S.PROCESSING, A.FAIL, S.FAILED),
    Transition(S.PROCESSING, A.BURY, S.DEAD),
    Transition(S.PROCESSING, A.MARK_UNKNOWN, S.UNKNOWN),
    Transition(S.PROCESSING, A.RELEASE, S.PENDING),
    Transition(S.PROCESSING, A.RELEASE, S.RETRYING),
    Transition(S.PROCESSING, A.EXPIRE, S.UNKNOWN),
    Transition(S.UNKNOWN, A.REQUEUE, S.PENDING),
    Transition(S.DEAD, A.REQUEUE, S.PENDING),
    Transition(S.PENDING, A.CANCEL, S.CANCELLED),
    Transition(S.UNKNOWN, A.RESOLVE_SENT, S.SENT),
    Transition(S.UNKNOWN, A.RESOLVE_FAILED, S.FAILED),
    Transition(S.UNKNOWN, A.FLAG, S.UNKNOWN),
)

CLAIMABLE: frozenset[Status] = frozenset({S.PENDING, S.RETRYING})
TERMINAL: frozenset[Status] = frozenset({S.SENT, S.FAILED, S.DEAD, S.CANCELLED})
NEEDS_DECISION: frozenset[Status] = frozenset({S.UNKNOWN})


def sources(action: Action) -> frozenset[Status]:
    """The states an action may start from: the guard of its conditional UPDATE."""
    return frozenset(t.source for t in TRANSITIONS if t.action is action and t.source is not None)


def targets(action: Action) -> frozenset[Status]:
    return frozenset(t.target for t in TRANSITIONS if t.action is action)


def target(action: Action) -> Status:
    """The single state an action leads to; RELEASE, whose target depends on history, has none."""
    (only,) = targets(action)
    return only


def is_allowed(source: Status | None, action: Action, target_: Status) -> bool:
    return Transition(source, action, target_) in TRANSITIONS


def can_move(source: Status | None, target_: Status) -> bool:
    """Whether any action moves a message from source to target."""
    return any(t.source == source and t.target == target_ for t in TRANSITIONS)


def release_target(attempts_done: int) -> Status:
    """A released message goes back to where it was claimed from, judged by its history."""
    return S.RETRYING if attempts_done > 0 else S.PENDING
