"""What a worker is told: its settings (`WorkerConfig`) and the jobs it runs on the side
(`PeriodicJob`). Frozen: a running worker's configuration never changes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mailbag.domain.breaker import Breaker
from mailbag.domain.bulk import UnsubscribeLinks
from mailbag.domain.domain_shaping import Shaping
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.verification import Tokens
from mailbag.settings import Settings
from mailbag.store.database import DEFAULT_TIMEOUT


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    batch_size: int = 100
    concurrency: int = 32
    poll_interval: float = 1.0
    lease: timedelta = timedelta(seconds=120)
    shutdown_grace: float = 30.0
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    from_email: str = "mailbag@localhost"
    from_name: str | None = None
    message_id_domain: str = "localhost"
    sweep_every: float = 1.0
    db_backoff: tuple[float, float] = (1.0, 30.0)
    db_timeout: float = DEFAULT_TIMEOUT  # seconds one database round may take
    disabled_backoff: tuple[float, float] = (5.0, 300.0)
    # How long a message may wait for its providers before it is dead (QUEUE_LIFETIME).
    queue_lifetime: timedelta = timedelta(days=5)
    # When a provider that keeps failing is left alone (PROVIDER_BREAKER_*).
    provider_breaker: Breaker = field(default_factory=Breaker)
    # Derives verification tokens at render time; without it a verification email fails.
    tokens: Tokens | None = None
    # mailbag's own one-click unsubscribe links for bulk mail (PUBLIC_URL); None: none.
    unsubscribe: UnsubscribeLinks | None = None
    # DOMAIN_SHAPING's numbers (None: off): deferring recipient domains are slowed down.
    domain_shaping: Shaping | None = None
    # MAX_BYTES_IN_FLIGHT: the attachment bytes this worker holds at once (None: no bound).
    max_bytes_in_flight: int | None = 256 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> WorkerConfig:
        values: dict[str, Any] = {
            "worker_id": settings.worker_id,
            "batch_size": settings.batch_size,
            "concurrency": settings.concurrency,
            "poll_interval": settings.poll_interval,
            "lease": settings.lease,
            "shutdown_grace": settings.shutdown_grace,
            "policy": settings.retry_policy,
            "from_email": settings.from_email,
            "from_name": settings.from_name,
            "message_id_domain": settings.message_id_host,
            "db_timeout": settings.database_timeout_seconds,
            "queue_lifetime": settings.queue_lifetime,
            "provider_breaker": settings.provider_breaker,
            # Raises MissingSecretKey: a worker without the key refuses to start.
            "tokens": settings.verification_tokens,
            "unsubscribe": settings.unsubscribe_links,
            "domain_shaping": settings.shaping,
            "max_bytes_in_flight": settings.max_bytes_in_flight,
        }
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    every: float  # seconds
    run: Callable[[datetime], Awaitable[Mapping[str, int]]]
    close: Callable[[], Awaitable[None]] | None = None  # after the worker stopped
