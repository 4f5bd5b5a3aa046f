"""Shared steps of the verification tests: ask, deliver, read the token out of an email."""

from __future__ import annotations

import re
from typing import Any

from api_helpers import settings_for
from mailbag.domain.verification import Tokens
from mailbag.providers.base import Provider
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig

from conftest import TestDB
from helpers import run_worker_until, status_counts
from memory_provider import MemoryProvider

TOKEN_LINE = re.compile(r"Your confirmation code: (\S+)")


def request(
    api: Any, email: str = "new.user@example.com", key: str = "signup-1", **body: Any
) -> Any:
    return api.post(
        "/v1/email-verifications", json={"email": email, **body}, headers={"Idempotency-Key": key}
    )


def resend(api: Any, verification_id: str, key: str) -> Any:
    return api.post(
        f"/v1/email-verifications/{verification_id}/resend", headers={"Idempotency-Key": key}
    )


def tokens(db: TestDB) -> Tokens:
    """What the API and the worker derive tokens with (the tests' shared secret key)."""
    return settings_for(db).verification_tokens


async def deliver(db: TestDB, async_engine: Any, provider: Provider | None = None) -> Any:
    """Run a worker (with the deployment key) until the outbox has nothing left to claim."""
    provider = provider or MemoryProvider()
    worker = Worker(
        engine=async_engine,
        provider=provider,
        catalog=builtin(),
        config=WorkerConfig(worker_id="w", poll_interval=0.02, tokens=tokens(db)),
    )

    def settled() -> bool:
        counts = status_counts(db)
        return not counts.get("pending") and not counts.get("processing") and not worker.ledger.held

    await run_worker_until(worker, settled)
    return provider


def token_in(email: Any) -> str:
    """The code in a sent email (an OutgoingEmail, or the text of one)."""
    match = TOKEN_LINE.search(email if isinstance(email, str) else email.text)
    assert match, email
    return match.group(1)
