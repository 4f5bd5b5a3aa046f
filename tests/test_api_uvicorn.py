"""50 identical requests at once through a real uvicorn with several worker processes."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import func, select

from api_helpers import new_tenant
from mailbag.store.schema import email_verifications, idempotency_records, outbox_messages
from servers import free_port, mailbag_env, start_mailbag, stop, wait_until_up

CONCURRENT = 50


@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/email-verifications", {"email": "burst@example.com"}),
        (
            "/v1/messages",
            {"to": "burst@example.com", "template": "welcome", "data": {"name": "Burst"}},
        ),
    ],
)
async def test_fifty_identical_requests_make_one_resource(db, path, body):
    _, key = new_tenant(db)
    port = free_port()
    server = start_mailbag("api", "--port", str(port), "--workers", "4", env=mailbag_env(db.url))
    try:
        base = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(wait_until_up, f"{base}/healthz", 60, server)
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "fifty-at-once"}
        limits = httpx.Limits(max_connections=CONCURRENT)
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
            replies = await asyncio.gather(
                *(client.post(path, json=body, headers=headers) for _ in range(CONCURRENT))
            )
    finally:
        assert stop(server) == 0
    assert [r.status_code for r in replies] == [201] * CONCURRENT, replies[0].text
    assert len({r.content for r in replies}) == 1  # 50 identical answers
    replayed = sum(r.headers.get("Idempotent-Replayed") == "true" for r in replies)
    assert replayed == CONCURRENT - 1
    with db.engine.connect() as conn:
        count = lambda table: conn.execute(select(func.count()).select_from(table)).scalar_one()  # noqa: E731
        assert count(outbox_messages) == 1  # one email will be sent
        assert count(idempotency_records) == 1
        assert count(email_verifications) == (1 if "verifications" in path else 0)
