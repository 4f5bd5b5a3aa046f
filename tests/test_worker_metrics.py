"""The worker's own metrics port (`mailbag worker --metrics-port N`) follows METRICS_TOKEN
like the API's /metrics: with a token set, only `Authorization: Bearer <token>` gets in.

Over real HTTP, against `runtime.run_worker` as `mailbag worker` runs it, on a free port.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from api_helpers import TEST_SECRET_KEY
from mailbag import runtime
from mailbag.settings import Settings
from mailbag.store import migrate
from mailbag.store.database import make_engine
from servers import free_port

TOKEN = "scrape-token-0123456789abcdef"
START_TIMEOUT = 30  # a bound on a loaded machine, not a speed requirement


def worker_settings(folder: Path, **overrides: Any) -> Settings:
    url = f"sqlite:///{folder / 'mailbag.db'}"
    engine = make_engine(url, null_pool=True)
    migrate.upgrade(engine)
    engine.dispose()
    return Settings.model_validate(
        {
            "database_url": url,
            "secret_key": TEST_SECRET_KEY,
            "file_dir": str(folder / "mail"),
            "log_level": "WARNING",
            "api_host": "127.0.0.1",
            "metrics_port": free_port(),
            **overrides,
        }
    )


@asynccontextmanager
async def running_worker(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A worker with its metrics port listening; stopped (drained) afterwards."""
    stop = asyncio.Event()
    worker = asyncio.create_task(runtime.run_worker(settings, stop))
    url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
    async with httpx.AsyncClient(timeout=10) as client:
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while True:
                    if worker.done():
                        worker.result()  # raises why it could not start
                    try:
                        await client.get(url)
                        break
                    except httpx.ConnectError:
                        await asyncio.sleep(0.05)
            yield client, url
        finally:
            stop.set()
            await worker


async def test_worker_metrics_want_the_token_when_one_is_set(tmp_path):
    # The worker's port served every metric to anyone, METRICS_TOKEN or not.
    async with running_worker(worker_settings(tmp_path, metrics_token=TOKEN)) as (client, url):
        missing = await client.get(url)
        wrong = await client.get(url, headers={"Authorization": f"Bearer {TOKEN}x"})
        not_bearer = await client.get(url, headers={"Authorization": f"Basic {TOKEN}"})
        other_path = await client.get(url.replace("/metrics", "/"))
        right = await client.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
    for refused in (missing, wrong, not_bearer, other_path):
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["detail"] == "send `Authorization: Bearer <METRICS_TOKEN>`"
        assert "mailbag_" not in refused.text
    assert right.status_code == 200
    assert "mailbag_claim_seconds" in right.text


async def test_worker_metrics_are_open_without_a_token(tmp_path):
    async with running_worker(worker_settings(tmp_path)) as (client, url):
        response = await client.get(url)
    assert response.status_code == 200
    assert "mailbag_claim_seconds" in response.text
    assert "# TYPE mailbag_messages_expired_total counter" in response.text


async def test_the_worker_stops_serving_metrics_when_it_stops(tmp_path):
    settings = worker_settings(tmp_path)
    async with running_worker(settings) as (client, url):
        assert (await client.get(url)).status_code == 200
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(url)
