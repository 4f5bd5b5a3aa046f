"""Client.messages.send_batch against a real `mailbag api` process (POST /v1/messages/batch)."""

from __future__ import annotations

import pytest

from mailbag.client import Client, IdempotencyKeyReused, draft
from test_client_api import ADA, count, serving

pytestmark = pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)


def test_a_batch_writes_its_valid_items_and_answers_each_one(db):
    drafts = [
        draft("ada@example.com", template="welcome", data=ADA, idempotency_key="welcome-ada"),
        draft("not an address", template="welcome", data=ADA),
        draft("bob@example.com", subject="Hi", text="Hello Bob"),
    ]
    with serving(db) as api, Client(api.url, api.key) as client:
        first = client.messages.send_batch(drafts, idempotency_key="batch-1")
        again = client.messages.send_batch(drafts, idempotency_key="batch-1")
        later = client.messages.send_batch([drafts[0]])
        with pytest.raises(IdempotencyKeyReused):
            client.messages.send_batch(drafts[:1], idempotency_key="batch-1")
    assert [r.result for r in first.results] == ["created", "invalid", "created"]
    assert (first.created, first.existing, first.invalid) == (2, 0, 1) and not first.replayed
    invalid = first.results[1].error
    assert invalid is not None and invalid.status == 422
    assert "to" in [e.field for e in invalid.errors]
    assert again.replayed and again.results == first.results
    ada = first.results[0].message
    assert later.results[0].result == "existing" and later.results[0].message is not None
    assert ada is not None and later.results[0].message.id == ada.id
    assert count(db) == 2
