"""The test suite's own provider, added through the public registry like any plug-in.

It keeps what it was asked to send in memory and answers from a script, so worker tests
can make a send succeed, fail, hang or turn ambiguous on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from mailbag.compose import OutgoingEmail
from mailbag.domain.delivery import Accepted, SendOutcome
from mailbag.providers import register
from mailbag.providers.base import Capabilities

Script = Callable[[OutgoingEmail, int], SendOutcome]  # (email, nth call for this message)


def accept_all(email: OutgoingEmail, nth: int) -> SendOutcome:
    return Accepted(f"mem-{email.message_id}-{nth}")


class MemoryProvider:
    name = "memory"
    # Declared as nothing: a plug-in's defaults (no UTF-8 local parts, no limits of its own).
    capabilities = Capabilities()

    def __init__(
        self,
        script: Script = accept_all,
        *,
        delay: float = 0.0,
        max_batch_size: int = 1,
        idempotency_window: timedelta | None = None,
        name: str = "memory",
    ) -> None:
        self.name = name  # several in one fleet need names of their own
        self.script = script
        self.delay = delay
        self.max_batch_size = max_batch_size
        self.idempotency_window = idempotency_window
        self.sent: list[OutgoingEmail] = []
        self.batches: list[int] = []
        self.calls: dict[Any, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.gate: asyncio.Event | None = None  # when set up, sends wait for it to open

    async def send(self, email: OutgoingEmail) -> SendOutcome:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            nth = self.calls.get(email.message_id, 0) + 1
            self.calls[email.message_id] = nth
            self.sent.append(email)
            return self.script(email, nth)
        finally:
            self.in_flight -= 1

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendOutcome]:
        self.batches.append(len(emails))
        return list(await asyncio.gather(*(self.send(email) for email in emails)))

    async def aclose(self) -> None:
        return None


@register("memory")
def create(settings: Any) -> MemoryProvider:
    return MemoryProvider()
