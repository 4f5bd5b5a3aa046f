"""A breaker: when something that keeps failing is left alone for a while, so that it costs
the rest nothing and the work waiting on it no attempts. Used for hook endpoints
(store/hooks.py) and for providers (store/fleet_state.py). Pure: no I/O.

After `failures` failures in a row the breaker opens for `base`, doubling with each
further failure up to `cap`. Past that, one unit of work at a time goes (a probe); a
success closes it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class Breaker:
    failures: int = 5
    base: timedelta = timedelta(seconds=30)
    cap: timedelta = timedelta(hours=1)

    def pause(self, failures_in_row: int) -> timedelta | None:
        """How long to wait after this many failures in a row (None: do not wait)."""
        if failures_in_row < self.failures:
            return None
        doublings = min(failures_in_row - self.failures, 30)
        return min(self.cap, timedelta(seconds=self.base.total_seconds() * 2.0**doublings))

    def is_open(self, failures_in_row: int) -> bool:
        """Whether this many failures in a row hold the breaker open (a probe at a time)."""
        return failures_in_row >= self.failures
