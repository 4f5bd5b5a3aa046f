"""bench/hook_throughput.py at a tiny size (no timing is asserted): a real worker's every
delivery is counted exactly once, signed, beside a hanging endpoint; and a count that is off
fails the run instead of passing for a figure."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest

from bench import common
from bench import hook_throughput as bench
from mailbag.domain.hooks import new_secret, parse_secret, signed_headers

POSTGRES = os.environ.get("MAILBAG_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not POSTGRES, reason="the benchmark runs on PostgreSQL")


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[bench.Receiver]:
    monkeypatch.setattr(common, "PG_BASE", POSTGRES)
    with bench.receiver() as found:
        yield found


@pytest.mark.slow
def test_a_real_worker_delivers_each_event_once_beside_a_hanging_endpoint(receiver):
    run = bench.delivery_run(receiver, 40, 3, timeout=120)
    assert (run["arrivals"], run["duplicates"], run["statuses"]) == (40, 0, {"delivered": 40})
    assert 1 <= run["hanging_connections"] <= 3  # its cap is 4; it had 3 events
    assert run["per_second"] > 0
    ceiling = bench.yardstick("raw", receiver, 50, 4)
    assert ceiling["per_second"] > 0


def test_a_missing_a_repeated_or_a_forged_delivery_fails_the_count(receiver):
    secret = new_secret()
    receiver.reset(parse_secret(secret))

    def post(webhook_id: str, key: str = secret) -> None:
        body = b'{"type":"message.sent"}'
        headers = signed_headers(parse_secret(key), webhook_id, int(time.time()), body)
        assert httpx.post(receiver.url, content=body, headers=headers).status_code == 204

    post("msg_1")
    bench.check_counts(receiver.stats(), 1)  # all there: passes
    with pytest.raises(RuntimeError, match="1 of 2 webhook-ids arrived"):
        bench.check_counts(receiver.stats(), 2)
    post("msg_1")
    with pytest.raises(RuntimeError, match="1 arrived twice"):
        bench.check_counts(receiver.stats(), 1)
    receiver.reset(parse_secret(secret))
    post("msg_2", key=new_secret())
    with pytest.raises(RuntimeError, match="1 signatures did not verify"):
        bench.check_counts(receiver.stats(), 1)
