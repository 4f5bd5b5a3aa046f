"""The sender domains' DKIM keys a worker signs with (services/sender_domains.py), read
with the fleet's state (worker/fleet.py): at most every RECHECK_SECONDS, and at the next
exchange when a change is announced (PostgreSQL), so a new or rotated key signs within
half a minute everywhere, at once where LISTEN works."""

from __future__ import annotations

import time
from collections.abc import Mapping

from mailbag.domain.dkim import SigningKey
from mailbag.domain.hooks import SecretBox
from mailbag.settings import Settings
from mailbag.store.plan import Plan

RECHECK_SECONDS = 30.0


class Signing:
    def __init__(self, box: SecretBox) -> None:
        self.box = box
        self.keys: Mapping[tuple[str, str], SigningKey] = {}
        self.read_at = -float("inf")  # monotonic
        self.stale = True  # a change was announced, or the keys were never read

    @classmethod
    def of(cls, settings: Settings) -> Signing | None:
        """None without a secret key: no key can have been sealed, nothing is signed."""
        from mailbag.services.sender_domains import NoDomainKey, domain_box

        try:
            return cls(domain_box(settings))
        except NoDomainKey:
            return None

    def due(self) -> bool:
        return self.stale or time.monotonic() - self.read_at >= RECHECK_SECONDS

    def plan(self) -> Plan[dict[tuple[str, str], SigningKey]]:
        from mailbag.services.sender_domains import opened_keys

        return opened_keys(self.box)

    def update(self, found: Mapping[tuple[str, str], SigningKey]) -> None:
        self.keys, self.read_at, self.stale = found, time.monotonic(), False
