"""`domain.delivery.decide`, case by case: every outcome a provider can report, under each
thing the worker knows about the attempt (its number, earlier ambiguous tries under the
same key, the provider's idempotency window), and the transition it leads to. One row a
case, so that a change of the rule shows as a changed row."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from mailbag.domain.delivery import (
    MIN_KEYED_RETRY_ROOM,
    Accepted,
    Ambiguous,
    Attempt,
    Deferred,
    Disabled,
    Rejected,
    SendOutcome,
    Throttled,
    decide,
)
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Action

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CLAIMED = NOW - timedelta(seconds=5)
POLICY = RetryPolicy(max_attempts=3, base=timedelta(minutes=5))
DAY = timedelta(hours=24)
LONG_AGO = NOW - timedelta(days=2)  # an earlier keyed try the provider has forgotten
RECENT = NOW - timedelta(minutes=10)  # an earlier keyed try it still remembers


@dataclass(frozen=True)
class Case:
    outcome: SendOutcome
    action: Action
    number: int = 1  # this attempt's number, of POLICY's 3
    keyed_since: datetime | None = None  # earlier ambiguous tries under this key
    window: timedelta | None = None  # the provider's idempotency window
    keep_attempt: bool = False  # a retry under the same key is the same attempt
    ambiguous_since: datetime | None = None
    due: str | None = None  # when a retry is due: "backoff", "retry-after", "in the window"
    error: str | None = None  # the decision's error, when it is not the outcome's own
    created_at: datetime = NOW - timedelta(hours=1)  # when the message was enqueued


CASES = {
    "accepted": Case(Accepted("p-1"), Action.MARK_SENT),
    "accepted for some recipients": Case(
        Accepted("p-1", detail="550 one refused"), Action.MARK_SENT, error="550 one refused"
    ),
    "rejected": Case(Rejected("550 no such user"), Action.FAIL),
    "disabled": Case(Disabled("no credentials"), Action.RELEASE),
    "throttled": Case(Throttled("429"), Action.RELEASE),
    "throttled, keyed, remembered": Case(
        Throttled("429"), Action.RELEASE, keyed_since=RECENT, window=DAY
    ),
    "throttled, keyed, forgotten": Case(
        Throttled("429"),
        Action.MARK_UNKNOWN,
        keyed_since=LONG_AGO,
        window=DAY,
        error="429 (the provider's idempotency window has run out)",
    ),
    "ambiguous, no key window": Case(Ambiguous("timeout after DATA"), Action.MARK_UNKNOWN),
    "ambiguous, a batch (not keyed)": Case(
        Ambiguous("timeout", keyed=False), Action.MARK_UNKNOWN, window=DAY
    ),
    "ambiguous, keyed": Case(
        Ambiguous("timeout"),
        Action.RETRY,
        window=DAY,
        keep_attempt=True,
        ambiguous_since=CLAIMED,
        due="in the window",
    ),
    "ambiguous, keyed, window too short": Case(
        Ambiguous("timeout"),
        Action.MARK_UNKNOWN,
        window=MIN_KEYED_RETRY_ROOM,
        error="timeout (the provider's idempotency window has run out)",
    ),
    "ambiguous, keyed again, remembered": Case(
        Ambiguous("timeout"),
        Action.RETRY,
        keyed_since=RECENT,
        window=DAY,
        keep_attempt=True,
        ambiguous_since=RECENT,
        due="in the window",
    ),
    "deferred, first attempt": Case(Deferred("451 later"), Action.RETRY, due="backoff"),
    "deferred, last attempt": Case(Deferred("451 later"), Action.BURY, number=3),
    "deferred, the provider's own fault": Case(
        Deferred("connection refused", provider_fault=True), Action.RELEASE, due="backoff"
    ),
    "deferred, the provider's own fault, last attempt": Case(
        Deferred("connection refused", provider_fault=True),
        Action.RELEASE,  # no attempt is spent on an outage: the budget is not what ends it
        number=3,
        due="backoff",
    ),
    "deferred, the provider's own fault, queue lifetime over": Case(
        Deferred("connection refused", provider_fault=True),
        Action.BURY,
        created_at=NOW - timedelta(days=6),
        error="connection refused (in the queue longer than QUEUE_LIFETIME, 120 h)",
    ),
    "deferred, with the provider's retry-after": Case(
        Deferred("503", retry_after=timedelta(hours=1)), Action.RETRY, due="retry-after"
    ),
    "deferred after a keyed try, remembered": Case(
        Deferred("451 later"),
        Action.RETRY,
        keyed_since=RECENT,
        window=DAY,
        keep_attempt=True,
        ambiguous_since=RECENT,
        due="in the window",
    ),
    "deferred after a keyed try, last attempt, remembered": Case(
        Deferred("451 later"),
        Action.RETRY,  # the same attempt again: the budget is not what ends it
        number=3,
        keyed_since=RECENT,
        window=DAY,
        keep_attempt=True,
        ambiguous_since=RECENT,
        due="in the window",
    ),
    "deferred after a keyed try, forgotten": Case(
        Deferred("451 later"),
        Action.MARK_UNKNOWN,
        keyed_since=LONG_AGO,
        window=DAY,
        error="451 later (the provider's idempotency window has run out)",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_outcome_leads_to_its_transition(case: Case, seed: int) -> None:
    attempt = Attempt(
        case.number, POLICY.max_attempts, CLAIMED, case.keyed_since, created_at=case.created_at
    )
    decision = decide(
        case.outcome,
        attempt,
        now=NOW,
        policy=POLICY,
        key_window=case.window,
        rng=random.Random(seed),
        queue_lifetime=timedelta(days=5),
    )
    assert decision.action is case.action
    own_error = getattr(case.outcome, "error", None) or getattr(case.outcome, "reason", None)
    assert decision.error == (case.error if case.error is not None else own_error)
    assert decision.keep_attempt is case.keep_attempt
    assert decision.ambiguous_since == case.ambiguous_since
    if isinstance(case.outcome, Accepted | Ambiguous):
        assert decision.provider_message_id == case.outcome.provider_message_id
    if case.due is None:
        assert decision.next_attempt_at is None
        return
    assert decision.next_attempt_at is not None
    delay = decision.next_attempt_at - NOW
    if case.due == "backoff":  # full jitter: anywhere up to the attempt's step
        assert timedelta(0) <= delay <= POLICY.base * POLICY.multiplier ** (case.number - 1)
    elif case.due == "retry-after":  # never sooner than the provider asked
        assert delay == timedelta(hours=1)
    else:  # at most half of what is left of the key's window (0.8 of it, for clocks)
        room = (case.ambiguous_since or CLAIMED) + 0.8 * DAY - NOW
        assert timedelta(0) <= delay <= room / 2


def test_every_outcome_class_has_a_row() -> None:
    import typing

    covered = {type(case.outcome) for case in CASES.values()}
    assert covered == set(typing.get_args(SendOutcome))
