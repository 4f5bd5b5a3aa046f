"""What a send attempt can end in, and what the outbox does about each outcome.

Providers translate their protocol's answers into one of six outcomes (each provider keeps
its mapping in one table); `decide` turns an outcome into the next transition. The one rule
that matters most: an outcome the provider may have accepted is never retried blindly. It
becomes `unknown`, unless the provider deduplicates by an idempotency key and the retry
lands while the provider still remembers that key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Action


@dataclass(frozen=True)
class Accepted:
    """The provider took the message (SMTP 250 after DATA, HTTP 2xx with an id)."""

    provider_message_id: str
    # Set when it took the message for some recipients only (SMTP refused the others at
    # RCPT TO): which ones, and why. Kept as the sent message's last_error and event detail.
    detail: str | None = None


@dataclass(frozen=True)
class Rejected:
    """A permanent refusal: retrying cannot help (SMTP 5xx on the recipient, HTTP 400/401/403/422,
    an invalid address, a template that does not render)."""

    error: str


@dataclass(frozen=True)
class Deferred:
    """A failure known to precede acceptance (connection refused, DNS, SMTP 4xx, HTTP 5xx).
    Safe to retry; `retry_after` is the provider's own hint, if it gave one.

    `provider_fault`: the failure is the provider's, not the message's (it could not be
    reached, or answered an error about itself: 5xx, SMTP 421): the message waits for it,
    or goes to the route's next provider, without spending an attempt, for as long as
    QUEUE_LIFETIME. Otherwise (an SMTP 4xx about a recipient: greylisting, a full
    mailbox) the message's own attempts are spent, as the retry policy says.

    `domain_deferral`: the recipient's domain deferred it (SMTP 421/451/4.7.x in answer to
    RCPT TO or the content): DOMAIN_SHAPING slows that domain down (domain.domain_shaping)."""

    error: str
    retry_after: timedelta | None = None
    provider_fault: bool = False
    domain_deferral: bool = False


@dataclass(frozen=True)
class Ambiguous:
    """The request left and no verdict came back (timeout or connection lost after DATA or
    after the HTTP request was sent): the provider may have accepted it."""

    error: str
    provider_message_id: str | None = None
    # True when the request carried this email's own idempotency key (and nothing else's),
    # so sending the same email with the same key again is deduplicated by the provider. A
    # batch request is not keyed per email: its ambiguous outcomes are never retried.
    keyed: bool = True


@dataclass(frozen=True)
class Disabled:
    """The provider cannot send at all right now (no credentials, switched off). Not the
    message's fault: hand it back without spending an attempt."""

    reason: str


@dataclass(frozen=True)
class Throttled:
    """The provider refused for its own rate limit before taking anything (HTTP 429, SES
    `Throttling`): not the message's fault, so no attempt is spent. The worker hands it
    back and slows the whole fleet down (domain.rate); `retry_after` is the provider's own
    hint, if it gave one."""

    error: str
    retry_after: timedelta | None = None


SendOutcome = Accepted | Rejected | Deferred | Ambiguous | Disabled | Throttled

# Keep a margin inside the provider's key window: clocks differ and requests take time.
KEY_WINDOW_MARGIN = 0.8
MIN_KEYED_RETRY_ROOM = timedelta(seconds=30)


@dataclass(frozen=True)
class Decision:
    action: Action
    error: str | None = None
    provider_message_id: str | None = None
    next_attempt_at: datetime | None = None
    keep_attempt: bool = False
    ambiguous_since: datetime | None = None
    provider: str | None = None  # the provider whose answer this is (one of a route's)


@dataclass(frozen=True)
class Attempt:
    """What the worker knows about the attempt it just made."""

    number: int  # 1 for the first attempt
    max_attempts: int
    claimed_at: datetime
    ambiguous_since: datetime | None  # set when earlier attempts under this key were ambiguous
    created_at: datetime | None = None  # when the message was enqueued (QUEUE_LIFETIME)


def decide(
    outcome: SendOutcome,
    attempt: Attempt,
    *,
    now: datetime,
    policy: RetryPolicy,
    key_window: timedelta | None,
    rng: random.Random | None = None,
    queue_lifetime: timedelta | None = None,
) -> Decision:
    """The next transition for a claimed message, given how its send attempt ended.

    `key_window` is how long the provider deduplicates by our idempotency key (None: it
    does not). Within it, an ambiguous send may be retried with the same key, which is the
    same attempt again; outside it, the message is `unknown` and waits for evidence.

    A provider's own failure (Deferred with `provider_fault`) spends no attempt: the
    message is handed back, due again after the policy's delay, until `queue_lifetime`
    after it was enqueued; past that it is dead.
    """
    if isinstance(outcome, Accepted):
        return Decision(
            Action.MARK_SENT, error=outcome.detail, provider_message_id=outcome.provider_message_id
        )
    if isinstance(outcome, Rejected):
        return Decision(Action.FAIL, error=outcome.error)
    if isinstance(outcome, Disabled):
        return Decision(Action.RELEASE, error=outcome.reason)

    keyed_since = attempt.ambiguous_since
    if isinstance(outcome, Throttled):
        # Released unsent, ambiguous_since kept: a keyed retry goes on under its key, but
        # only while the provider still remembers it (the same rule as for a retry below).
        if keyed_since is not None and key_window is not None:
            _, too_late = _key_room(keyed_since, key_window, now, outcome.error)
            if too_late is not None:
                return too_late
        return Decision(Action.RELEASE, error=outcome.error)
    if isinstance(outcome, Ambiguous):
        if key_window is None or not outcome.keyed:
            return Decision(
                Action.MARK_UNKNOWN,
                error=outcome.error,
                provider_message_id=outcome.provider_message_id,
            )
        keyed_since = keyed_since or attempt.claimed_at

    if keyed_since is not None and key_window is not None:
        # An earlier try under this key may have been accepted: only the same key is safe.
        room, too_late = _key_room(keyed_since, key_window, now, outcome.error)
        if too_late is not None:
            return too_late
        delay = min(policy.delay(attempt.number, rng), room / 2)
        if isinstance(outcome, Deferred) and outcome.retry_after:
            delay = min(max(delay, outcome.retry_after), room / 2)
        return Decision(
            Action.RETRY,
            error=outcome.error,
            next_attempt_at=now + delay,
            keep_attempt=True,
            ambiguous_since=keyed_since,
        )

    assert isinstance(outcome, Deferred)
    if outcome.provider_fault:
        return _wait_for_provider(outcome, attempt, now, policy, rng, queue_lifetime)
    action = policy.after_transient_failure(attempt.number, attempt.max_attempts)
    if action is Action.BURY:
        return Decision(Action.BURY, error=outcome.error)
    delay = policy.delay(attempt.number, rng)
    if outcome.retry_after is not None:
        delay = max(delay, outcome.retry_after)
    return Decision(Action.RETRY, error=outcome.error, next_attempt_at=now + delay)


def _wait_for_provider(
    outcome: Deferred,
    attempt: Attempt,
    now: datetime,
    policy: RetryPolicy,
    rng: random.Random | None,
    queue_lifetime: timedelta | None,
) -> Decision:
    """The provider failed, not the message: hand it back unsent, no attempt spent, due
    again after a delay (the provider's hint if it gave one), or dead once it has waited in
    the queue longer than `queue_lifetime`."""
    if (
        queue_lifetime is not None
        and attempt.created_at is not None
        and now - attempt.created_at >= queue_lifetime
    ):
        return Decision(
            Action.BURY,
            error=f"{outcome.error} (in the queue longer than QUEUE_LIFETIME, "
            f"{queue_lifetime.total_seconds() / 3600:g} h)",
        )
    delay = policy.delay(max(attempt.number, 1), rng)
    if outcome.retry_after is not None:
        delay = max(delay, outcome.retry_after)
    return Decision(Action.RELEASE, error=outcome.error, next_attempt_at=now + delay)


def _key_room(
    keyed_since: datetime, key_window: timedelta, now: datetime, error: str
) -> tuple[timedelta, Decision | None]:
    """How long the provider still remembers the key, and the `unknown` decision once that
    is too short for another try under it (None: there is room)."""
    room = keyed_since + key_window * KEY_WINDOW_MARGIN - now
    if room < MIN_KEYED_RETRY_ROOM:
        error = f"{error} (the provider's idempotency window has run out)"
        return room, Decision(Action.MARK_UNKNOWN, error=error)
    return room, None


def lapse(expires_at: datetime | None, now: datetime) -> Decision | None:
    """A claimed message whose expires_at has come is not sent any more (it would arrive
    too late): it becomes `expired`, without a provider call. None: it has not lapsed."""
    if expires_at is None or expires_at > now:
        return None
    return Decision(
        Action.LAPSE,
        error=f"expired before it could be sent (expires_at {expires_at.isoformat()})",
    )
