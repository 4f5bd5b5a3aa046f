"""The retry policy: exponential backoff with full jitter, a cap, and an attempt budget."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from mailbag.domain.states import Action


@dataclass(frozen=True)
class RetryPolicy:
    """Defaults follow the seed design: 5 attempts, 5 minutes growing five-fold (5, 25, 125 ...).

    Full jitter (a uniform draw between zero and the exponential step) keeps a herd of
    messages that failed together from retrying together.
    """

    max_attempts: int = 5
    base: timedelta = timedelta(minutes=5)
    multiplier: float = 5.0
    cap: timedelta = timedelta(hours=6)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base <= timedelta(0) or self.cap < self.base:
            raise ValueError("backoff needs a positive base and a cap no smaller than it")
        if self.multiplier < 1:
            raise ValueError("multiplier must be at least 1")

    def ceiling(self, attempts_done: int) -> timedelta:
        """The largest delay after the given number of failed attempts (1 for the first)."""
        exponent = max(attempts_done - 1, 0)
        # Compare in floats first: multiplier ** exponent overflows timedelta long before the cap.
        seconds = self.base.total_seconds() * self.multiplier**exponent
        return min(self.cap, timedelta(seconds=min(seconds, self.cap.total_seconds())))

    def delay(self, attempts_done: int, rng: random.Random | None = None) -> timedelta:
        draw = (rng or random).random()
        return self.ceiling(attempts_done) * draw

    def after_transient_failure(
        self, attempts_done: int, max_attempts: int | None = None
    ) -> Action:
        """RETRY while budget is left; BURY (dead letter) once the last attempt failed."""
        budget = self.max_attempts if max_attempts is None else max_attempts
        return Action.BURY if attempts_done >= budget else Action.RETRY

    def next_attempt_at(
        self, now: datetime, attempts_done: int, rng: random.Random | None = None
    ) -> datetime:
        return now + self.delay(attempts_done, rng)
