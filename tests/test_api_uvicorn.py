"""50 identical requests at once through a real uvicorn with several worker processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import func, select

from api_helpers import new_tenant, settings_for
from mailbag.api import create_app
from mailbag.store.schema import email_verifications, idempotency_records, outbox_messages
from servers import free_port, mailbag_env, start_mailbag, stop, uvicorn_thread, wait_until_up

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


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_chunked_body_over_the_limit_is_a_413_over_real_http(db):
    _, key = new_tenant(db)

    def chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
        for start in range(0, total, size):
            yield b" " * min(size, total - start)

    body = json.dumps({"to": "chunked@example.com", "template": "welcome", "data": {"name": "C"}})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with (
        # Messages of at most 1 KiB: their body allowance falls below the 300 KiB sent.
        uvicorn_thread(create_app(settings_for(db, max_message_bytes=1024))) as base,
        httpx.Client(base_url=base) as client,
    ):
        # A generator body has no length: httpx sends it with Transfer-Encoding: chunked.
        too_big = client.post("/v1/messages", content=chunks(300 * 1024), headers=headers)
        fine = client.post(
            "/v1/messages", content=iter([body[:7].encode(), body[7:].encode()]), headers=headers
        )
    assert "content-length" not in too_big.request.headers
    assert too_big.request.headers["transfer-encoding"] == "chunked"
    assert too_big.status_code == 413, too_big.text
    assert too_big.headers["content-type"] == "application/problem+json"
    assert too_big.json()["type"].endswith("/body-too-large")
    assert fine.status_code == 201, fine.text
