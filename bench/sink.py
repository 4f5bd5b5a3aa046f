"""The benchmarks' provider: takes each email at once (or after a fixed delay) and notes
when it got it, so throughput, duplicates and latency can be counted afterwards.

mailbag workers load it as the provider named `sink`; the peer queues call `hand_off`
from their job functions. Each process appends "<message id> <unix time>" lines to
`$BENCH_SINK_DIR/<pid>.txt` when it exits (and on every flush).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from mailbag.compose import OutgoingEmail
from mailbag.domain.delivery import Accepted, SendOutcome
from mailbag.providers import register
from mailbag.providers.base import SendOneByOne

_received: list[tuple[str, float]] = []


def hand_off(message_id: str) -> None:
    """An email reached the provider: note which and when."""
    _received.append((message_id, time.time()))


def flush() -> None:
    folder = os.environ.get("BENCH_SINK_DIR")
    if not folder or not _received:
        return
    with (Path(folder) / f"{os.getpid()}.txt").open("a") as out:
        out.writelines(f"{message_id} {at:.6f}\n" for message_id, at in _received)
    _received.clear()


atexit.register(flush)


def read_all(folder: Path) -> list[tuple[str, float]]:
    """Every hand-off noted by every process."""
    found = []
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            message_id, at = line.rsplit(" ", 1)
            # The SMTP sink notes Message-IDs, <uuid@domain>; the in-process sink, bare ids.
            found.append((message_id.strip("<>").split("@")[0], float(at)))
    return found


class SinkProvider(SendOneByOne):
    name = "sink"
    max_batch_size = 1
    idempotency_window: timedelta | None = None

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    async def send(self, email: OutgoingEmail) -> SendOutcome:
        if self.delay:
            await asyncio.sleep(self.delay)
        hand_off(str(email.message_id))
        return Accepted(f"sink-{email.message_id}")

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendOutcome]:
        return [await self.send(email) for email in emails]


@register("sink")
def create(settings: object) -> SinkProvider:
    return SinkProvider(float(os.environ.get("BENCH_SINK_DELAY", "0")))
