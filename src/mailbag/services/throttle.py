"""Failed credential attempts (console logins, admin tokens), limited per client and overall.

A sliding window: each failure is remembered for `window` seconds. A client with
`per_client` failures in the window, or everyone once `overall` failures happened in it, is
answered 429 with Retry-After until the oldest of those failures leaves the window. A
refused attempt is never checked and never counted, so a client hammering away keeps only
itself locked out, and the overall budget is spent only by checked guesses.

The counts live in this process: N API processes allow N times the numbers. That bounds an
online guesser well enough (the secrets are long), without a database write per failure.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

MAX_CLIENTS = 10_000  # memory bound: beyond it, the longest-known clients are forgotten


class FailureThrottle:
    def __init__(
        self,
        *,
        per_client: int,
        overall: int,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_client, self.overall, self.window, self.clock = per_client, overall, window, clock
        self._clients: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()

    def retry_after(self, client: str) -> int | None:
        """Seconds this client must wait before its next attempt is checked; None: go on."""
        now = self.clock()
        waits = []
        windows = ((self._clients.get(client), self.per_client), (self._all, self.overall))
        for failures, limit in windows:
            if failures is None:
                continue
            self._forget_old(failures, now)
            if len(failures) >= limit:
                # The attempt becomes possible when enough failures have left the window.
                waits.append(failures[len(failures) - limit] + self.window - now)
        if not waits:
            return None
        return max(1, math.ceil(max(waits)))

    def failed(self, client: str) -> None:
        now = self.clock()
        failures = self._clients.pop(client, None) or deque()
        self._forget_old(failures, now)
        failures.append(now)
        self._clients[client] = failures  # re-inserted: the dict stays ordered by last failure
        self._all.append(now)
        self._forget_old(self._all, now)
        while len(self._clients) > MAX_CLIENTS:
            del self._clients[next(iter(self._clients))]

    def _forget_old(self, failures: deque[float], now: float) -> None:
        while failures and failures[0] <= now - self.window:
            failures.popleft()
