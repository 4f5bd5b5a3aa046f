"""Services: what one API process (its routes, the console, the admin API) works with.

Built once when the app starts (api/app.py) and kept on `app.state`; `mailbag.web` hands it
to a request. Besides the use cases it holds the process's own memory: recently seen API
keys and the failed-credential throttles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag.clock import Clock
from mailbag.services.hooks import Hooks
from mailbag.services.messages import Messages
from mailbag.services.operations import Operations
from mailbag.services.templates import Templates
from mailbag.services.throttle import FailureThrottle
from mailbag.services.verification import Verifications
from mailbag.settings import Settings
from mailbag.store.tenants import Tenant
from mailbag.templates import Catalog
from mailbag.templates.book import book_of


class KeyCache:
    """Tenants of recently seen API keys, for a short while: a busy client's requests need
    not each look its key up. Keys are never revoked in place (a tenant gets a new one),
    so the cost of the cache is at most TTL seconds of a deleted tenant's key working."""

    TTL = 30.0
    SIZE = 10_000

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, Tenant]] = {}

    def get(self, key: str) -> Tenant | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key: str, tenant: Tenant) -> None:
        if len(self._entries) >= self.SIZE:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + self.TTL, tenant)


@dataclass
class Services:
    settings: Settings
    engine: AsyncEngine
    clock: Clock
    messages: Messages
    verifications: Verifications
    operations: Operations
    hooks: Hooks  # every method raises HooksOff while HOOKS_KEY is unset
    catalog: Catalog
    known_keys: KeyCache = field(default_factory=lambda: KeyCache())
    # Tenants' templates, over `catalog`'s (the one Book of the process for it).
    templates: Templates = field(init=False)
    # Wrong console passwords and wrong admin tokens, each limited on its own.
    login_failures: FailureThrottle = field(init=False)
    admin_token_failures: FailureThrottle = field(init=False)

    def __post_init__(self) -> None:
        self.templates = Templates(self.engine, book_of(self.catalog))
        self.login_failures = self._failure_throttle()
        self.admin_token_failures = self._failure_throttle()

    def _failure_throttle(self) -> FailureThrottle:
        return FailureThrottle(
            per_client=self.settings.auth_failures_per_client,
            overall=self.settings.auth_failures_overall,
        )
