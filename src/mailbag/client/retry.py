"""When a call is tried again, and after how long: pure, no I/O.

Rules:
- Retried: no answer at all (connection refused or reset, timed out, the server went away
  mid-answer), 429, and 502/503/504 (the server, or a proxy before it, is briefly unable).
  Every POST the client sends carries an Idempotency-Key, the same on each attempt, and
  the server replays a committed answer for it, so trying again never makes a second
  message or email. GETs are safe anyway; cancel and confirm are safe by their meaning.
- Never retried: any other 4xx (the request itself is wrong: sending it again gives the
  same answer) and 500 (a bug, logged on the server under the answer's request id).
- The wait: the answer's Retry-After when it gives one (plus up to a tenth more, so that
  clients told the same number do not come back together). A Retry-After beyond
  `max_retry_after` is not waited for: the error is raised at once, carrying
  `retry_after`, for the caller to decide (a verification rate limit may ask for an
  hour). Otherwise exponential backoff with jitter: half of min(max_backoff,
  backoff * 2^(n-1)) fixed and the other half random.
- Stop after `max_attempts` attempts, or when the next wait would end more than
  `max_elapsed` seconds after the call began.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from mailbag.client.errors import retry_after

# No answer came: the request may or may not have been processed. LocalProtocolError and
# UnsupportedProtocol are left out: they are this side's mistakes and would recur.
UNANSWERED: tuple[type[httpx.TransportError], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    httpx.ProxyError,
)
RETRY_STATUSES = frozenset({429, 502, 503, 504})

Outcome = httpx.Response | httpx.TransportError


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    max_elapsed: float = 60.0
    backoff: float = 0.5
    max_backoff: float = 10.0
    max_retry_after: float = 60.0
    statuses: frozenset[int] = RETRY_STATUSES

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if min(self.max_elapsed, self.backoff, self.max_backoff, self.max_retry_after) < 0:
            raise ValueError("retry times cannot be negative")

    def wait(
        self, attempt: int, outcome: Outcome, elapsed: float, rng: Callable[[], float]
    ) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None to give up with `outcome`.
        `elapsed`: seconds since the call began; `rng`: uniform in [0, 1)."""
        if attempt >= self.max_attempts:
            return None
        if isinstance(outcome, httpx.Response):
            if outcome.status_code not in self.statuses:
                return None
            asked = retry_after(outcome)
        elif isinstance(outcome, UNANSWERED):
            asked = None
        else:
            return None
        if asked is None:
            ceiling = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
            seconds = ceiling / 2 + rng() * ceiling / 2
        elif asked > self.max_retry_after:
            return None
        else:
            seconds = asked + rng() * asked / 10
        if elapsed + seconds > self.max_elapsed:
            return None
        return seconds


NO_RETRIES = RetryPolicy(max_attempts=1)
