"""Event hooks' core: Standard Webhooks signing, the rules of endpoints, the delivery state
machine, the fan-out in the transaction of a message's change (three databases), the
deliveries' outbox (claim races, finalize, sweep, replay) and the deliverer's POSTs to a
real receiver."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from api_helpers import TEST_SECRET_KEY
from hook_helpers import BlockingHooks
from mailbag.domain import hooks as rules
from mailbag.domain.delivery import Decision
from mailbag.domain.events import BounceType, EventKind, ProviderEvent
from mailbag.domain.hooks import (
    DAction,
    DState,
    HookEvent,
    InvalidHook,
    InvalidSignature,
    MessageFacts,
    SecretBox,
    WrongHooksKey,
)
from mailbag.domain.hooks.urls import Policy
from mailbag.domain.states import Action, Status
from mailbag.services.hooks import (
    DeliveryFilter,
    HooksOff,
    NotReplayable,
    UnknownDelivery,
    UnknownEndpoint,
)
from mailbag.services.tenants import UnknownTenant
from mailbag.settings import Settings
from mailbag.store import events as event_store
from mailbag.store import hooks as store
from mailbag.store import suppressions
from mailbag.store.plan import run
from mailbag.store.schema import hook_deliveries, hook_delivery_events, hook_endpoints
from mailbag.worker.hooks import HookConfig, HookDeliverer

from conftest import TestDB
from helpers import T0, claim, enqueue, finalize, race_claims
from hook_receiver import HookReceiver

HOOKS_KEY = "hooks-key-for-tests-only-0123456789abcdef"

# Standard Webhooks' own test vector (libraries/python/tests/test_webhooks.py, test_sign_function).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def settings_for(db: TestDB, **overrides: Any) -> Settings:
    values = {
        "database_url": db.url,
        "secret_key": TEST_SECRET_KEY,
        "hooks_key": HOOKS_KEY,
        "hook_allow_http_localhost": True,
        **overrides,
    }
    return Settings(**values)


@pytest.fixture(autouse=True)
def fan_out_on(request: pytest.FixtureRequest) -> Iterator[None]:
    """The tests' own writes fan out as a worker with HOOK_MAX_ATTEMPTS=3 would."""
    if "db" not in request.fixturenames:
        yield
        return
    with request.getfixturevalue("db").fanning_out(store.FanOut(max_attempts=3)):
        yield


def deliveries(db: TestDB) -> list[Any]:
    with db.engine.connect() as conn:
        return list(conn.execute(select(hook_deliveries).order_by(hook_deliveries.c.id)).all())


def history(db: TestDB, delivery_id: uuid.UUID) -> list[tuple[str | None, str, int]]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            select(hook_delivery_events)
            .where(hook_delivery_events.c.delivery_id == delivery_id)
            .order_by(hook_delivery_events.c.id)
        ).all()
    return [(r.from_status, r.to_status, r.attempt) for r in rows]


def sent(db: TestDB, n: int = 1, **fields: Any) -> list[Any]:
    """n messages taken through claim and MARK_SENT: the worker's own finalize."""
    messages = enqueue(db, n, **fields)
    token = claim(db).token
    finalize(
        db,
        token,
        *((m.id, Decision(Action.MARK_SENT, provider_message_id="<p>")) for m in messages),
    )
    return messages


# --- Signing -----------------------------------------------------------------------------


def test_signing_matches_the_standard_webhooks_test_vector():
    key = rules.parse_secret(SPEC_SECRET)
    assert rules.sign(key, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE
    headers = {
        "webhook-id": SPEC_ID,
        "webhook-timestamp": str(SPEC_TIMESTAMP),
        "webhook-signature": SPEC_SIGNATURE,
    }
    assert rules.verify(SPEC_SECRET, headers, SPEC_BODY, now=SPEC_TIMESTAMP) == SPEC_ID
    # The prefix is optional, as in the spec's libraries.
    assert rules.verify(SPEC_SECRET.removeprefix("whsec_"), headers, SPEC_BODY, now=SPEC_TIMESTAMP)


def spec_headers(**changes: str) -> dict[str, str]:
    headers = {
        "Webhook-Id": SPEC_ID,
        "Webhook-Timestamp": str(SPEC_TIMESTAMP),
        "Webhook-Signature": SPEC_SIGNATURE,
    }
    headers.update(changes)
    return headers


def test_verify_accepts_any_matching_signature_among_several_and_any_header_case():
    several = f"v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,abc {SPEC_SIGNATURE}"
    headers = spec_headers(**{"Webhook-Signature": several})
    assert rules.verify(SPEC_SECRET, headers, SPEC_BODY, now=SPEC_TIMESTAMP) == SPEC_ID


@pytest.mark.parametrize(
    "headers, body, now",
    [
        (spec_headers(), SPEC_BODY + b" ", SPEC_TIMESTAMP),  # body changed
        (spec_headers(**{"Webhook-Id": "msg_other"}), SPEC_BODY, SPEC_TIMESTAMP),
        (spec_headers(), SPEC_BODY, SPEC_TIMESTAMP + 301),  # too old
        (spec_headers(), SPEC_BODY, SPEC_TIMESTAMP - 301),  # from the future
        (spec_headers(**{"Webhook-Timestamp": "hello"}), SPEC_BODY, SPEC_TIMESTAMP),
        (
            spec_headers(
                **{"Webhook-Signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="}
            ),
            SPEC_BODY,
            SPEC_TIMESTAMP,
        ),
        (
            spec_headers(**{"Webhook-Signature": SPEC_SIGNATURE.replace("v1,", "v2,")}),
            SPEC_BODY,
            SPEC_TIMESTAMP,
        ),
        (
            {"webhook-id": SPEC_ID, "webhook-timestamp": str(SPEC_TIMESTAMP)},
            SPEC_BODY,
            SPEC_TIMESTAMP,
        ),
    ],
)
def test_verify_refuses_what_the_secret_holder_did_not_send_now(headers, body, now):
    with pytest.raises(InvalidSignature):
        rules.verify(SPEC_SECRET, headers, body, now=now)


def test_a_new_secret_is_whsec_and_32_random_bytes():
    first, second = rules.new_secret(), rules.new_secret()
    assert first.startswith("whsec_") and first != second
    assert len(rules.parse_secret(first)) == 32
    with pytest.raises(ValueError):
        rules.parse_secret("whsec_not base64!")


def test_secrets_at_rest_are_sealed_and_open_only_with_the_same_hooks_key():
    secret = rules.new_secret()
    sealed = SecretBox(HOOKS_KEY).seal(secret)
    assert secret not in sealed and secret.removeprefix("whsec_") not in sealed
    assert SecretBox(HOOKS_KEY).open(sealed) == secret
    with pytest.raises(WrongHooksKey):
        SecretBox(HOOKS_KEY + "-other").open(sealed)


# --- Endpoint rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, allow, ok",
    [
        ("https://hooks.example.com/mailbag?x=1", False, True),
        ("http://hooks.example.com/", False, False),
        ("http://127.0.0.1:9000/hooks", False, False),
        ("http://127.0.0.1:9000/hooks", True, True),
        ("http://localhost/hooks", True, True),
        ("http://[::1]:8080/", True, True),
        ("http://hooks.example.com/", True, False),  # the allowance is for localhost only
        ("https://user:pw@hooks.example.com/", False, False),
        ("ftp://hooks.example.com/", False, False),
        ("https:///no-host", False, False),
        ("https://hooks.example.com/a b", False, False),
        ("https://hooks.example.com/#frag", False, False),
        ("https://hooks.example.com:99999/", False, False),
        ("https://e.com/" + "a" * 2000, False, False),
    ],
)
def test_only_https_urls_are_endpoints_unless_localhost_is_allowed(url, allow, ok):
    policy = Policy(allow_loopback=allow)
    if ok:
        assert rules.check_url(url, policy) == url
    else:
        with pytest.raises(InvalidHook) as refused:
            rules.check_url(url, policy)
        assert "url" in refused.value.errors


def test_events_are_named_short_or_long_and_star_means_all():
    assert rules.parse_events(["sent", "message.bounced", " Clicked "]) == {
        HookEvent.SENT,
        HookEvent.BOUNCED,
        HookEvent.CLICKED,
    }
    assert rules.parse_events(["*"]) == rules.ALL_EVENTS
    with pytest.raises(InvalidHook, match="unknown event"):
        rules.parse_events(["sent", "shipped"])
    with pytest.raises(InvalidHook, match="at least one"):
        rules.parse_events([])
    stored = rules.events_column({HookEvent.SENT, HookEvent.DELIVERED})
    assert stored == ",delivered,sent,"
    assert rules.events_from_column(stored) == {HookEvent.SENT, HookEvent.DELIVERED}


# --- The delivery state machine ----------------------------------------------------------


def test_the_delivery_machine_claims_pending_and_retrying_and_replays_only_finished_ones():
    machine = rules.DELIVERIES
    assert {DState.PENDING, DState.RETRYING} == rules.CLAIMABLE_DELIVERIES
    assert {DState.DELIVERED, DState.DEAD} == rules.REPLAYABLE
    assert machine.target(DAction.DELIVER) is DState.DELIVERED
    assert machine.sources(DAction.DELIVER) == {DState.PROCESSING}
    # A lease that ran out is retried (at least once) while attempts are left, and its
    # attempt counts: the last one the budget allows ends dead, never delivered.
    assert machine.targets(DAction.EXPIRE) == {DState.RETRYING, DState.DEAD}
    expired = {"attempts": 1, "max_attempts": 3}
    assert machine.target_for(DAction.EXPIRE, expired) is DState.RETRYING
    assert machine.target_for(DAction.EXPIRE, expired | {"attempts": 2}) is DState.DEAD
    assert machine.target_for(DAction.RELEASE, {"attempts": 0}) is DState.PENDING
    assert machine.target_for(DAction.RELEASE, {"attempts": 2}) is DState.RETRYING
    assert not machine.can_move(DState.DELIVERED, DState.PROCESSING)
    assert not machine.can_move(DState.PENDING, DState.DELIVERED)
    # Every state is reachable from creation.
    reached, frontier = {DState.PENDING}, [DState.PENDING]
    while frontier:
        state = frontier.pop()
        for t in machine.transitions:
            if t.source is state and t.target not in reached:
                reached.add(t.target)
                frontier.append(t.target)
    assert reached == set(DState)


def test_a_payload_says_what_happened_and_nothing_the_message_said():
    facts = MessageFacts(
        message_id=uuid.UUID(int=7),
        tenant_id="t1",
        status="bounced",
        to="ada@example.com",
        template="welcome",
        recipient="ada@example.com",
        bounce_type="hard",
        detail="550 no such user",
        metadata={"order": "42"},
    )
    body = json.loads(rules.payload(HookEvent.BOUNCED, facts, T0))
    assert body == {
        "type": "message.bounced",
        "timestamp": "2026-01-01T12:00:00Z",
        "data": {
            "message_id": str(uuid.UUID(int=7)),
            "tenant_id": "t1",
            "status": "bounced",
            "to": "ada@example.com",
            "template": "welcome",
            "recipient": "ada@example.com",
            "bounce_type": "hard",
            "detail": "550 no such user",
            "metadata": {"order": "42"},
        },
    }


# --- Services and the fan-out, on each database ------------------------------------------


def test_hooks_are_off_without_hooks_key(db):
    hooks = BlockingHooks(db, settings_for(db, hooks_key=""))
    assert not hooks.enabled
    with pytest.raises(HooksOff):
        hooks.create_endpoint("default", "https://example.com/h", ["sent"])
    with pytest.raises(HooksOff):
        hooks.list_endpoints()


def test_an_endpoint_is_created_with_a_secret_shown_once_and_stored_sealed(db):
    hooks = BlockingHooks(db, settings_for(db))
    created = hooks.create_endpoint("default", "https://example.com/h", ["sent", "bounced"], "CRM")
    assert created.secret.startswith("whsec_")
    with db.engine.connect() as conn:
        stored = conn.execute(select(hook_endpoints.c.secret)).scalar_one()
    assert created.secret not in stored
    assert SecretBox(HOOKS_KEY).open(stored) == created.secret
    assert hooks.get_endpoint(created.endpoint.id) == created.endpoint
    assert hooks.list_endpoints("default") == [created.endpoint]
    with pytest.raises(UnknownTenant):
        hooks.list_endpoints("nobody-here")

    rotated = hooks.rotate_secret(created.endpoint.id)
    assert rotated.secret != created.secret
    with db.engine.connect() as conn:
        assert (
            SecretBox(HOOKS_KEY).open(conn.execute(select(hook_endpoints.c.secret)).scalar_one())
            == rotated.secret
        )

    changed = hooks.update_endpoint(
        created.endpoint.id, events=["*"], enabled=False, description=""
    )
    assert (
        changed.events == rules.ALL_EVENTS and not changed.enabled and changed.description is None
    )
    with pytest.raises(InvalidHook):
        hooks.update_endpoint(created.endpoint.id, url="http://example.com/")
    hooks.delete_endpoint(created.endpoint.id)
    with pytest.raises(UnknownEndpoint):
        hooks.get_endpoint(created.endpoint.id)
    with pytest.raises(UnknownEndpoint):
        hooks.delete_endpoint(created.endpoint.id)


def test_a_sent_message_writes_one_delivery_per_subscribed_endpoint_with_one_webhook_id(db):
    hooks = BlockingHooks(db, settings_for(db))
    first = hooks.create_endpoint("default", "https://one.example.com/h", ["sent"]).endpoint
    second = hooks.create_endpoint("default", "https://two.example.com/h", ["*"]).endpoint
    hooks.create_endpoint("default", "https://three.example.com/h", ["bounced"])  # not this one
    off = hooks.create_endpoint("default", "https://four.example.com/h", ["sent"]).endpoint
    hooks.update_endpoint(off.id, enabled=False)

    (message,) = sent(db, 1)

    rows = deliveries(db)
    assert {r.endpoint_id for r in rows} == {first.id, second.id}
    assert len({r.webhook_id for r in rows}) == 1  # the same event, the same webhook-id
    row = rows[0]
    assert (row.event, row.status, row.attempts, row.max_attempts) == (
        "message.sent",
        "pending",
        0,
        3,
    )
    body = json.loads(row.payload)
    assert body["type"] == "message.sent"
    assert body["data"]["message_id"] == str(message.id)
    assert body["data"]["status"] == "sent"
    assert body["data"]["to"] == message.to_address
    assert body["data"]["provider_message_id"] == "<p>"
    assert body["data"]["provider"] == "test"
    assert "template_data" not in row.payload and "User 0" not in row.payload  # no content


def test_no_endpoint_no_delivery_and_other_tenants_endpoints_do_not_count(db):
    hooks = BlockingHooks(db, settings_for(db))
    hooks.create_endpoint("default", "https://one.example.com/h", ["failed"])
    sent(db, 3)  # default's messages: sent is not subscribed
    other = enqueue(db, 2, tenant_id="t_other")
    finalize(db, claim(db).token, *((m.id, Decision(Action.MARK_SENT)) for m in other))
    assert deliveries(db) == []


def test_a_rolled_back_change_writes_no_delivery(db):
    hooks = BlockingHooks(db, settings_for(db))
    hooks.create_endpoint("default", "https://one.example.com/h", ["sent"])
    (message,) = enqueue(db, 1)
    token = claim(db).token
    from mailbag.store import dispatch

    with db.engine.connect() as conn:
        transaction = conn.begin()
        finalized = run(
            conn,
            dispatch.finalize(
                token=token,
                decisions={message.id: Decision(Action.MARK_SENT)},
                now=T0,
                actor="w1",
                provider="test",
            ),
        )
        assert finalized.changed  # the change and its delivery were written ...
        assert conn.execute(select(func.count()).select_from(hook_deliveries)).scalar_one() == 1
        transaction.rollback()  # ... and go together
    assert deliveries(db) == []
    # Committed, the same change delivers.
    finalize(db, token, (message.id, Decision(Action.MARK_SENT)))
    assert len(deliveries(db)) == 1


def test_with_the_fan_out_switched_off_nothing_is_written(db):
    BlockingHooks(db, settings_for(db)).create_endpoint("default", "https://e.com/h", ["*"])
    with db.fanning_out(store.FanOut(enabled=False)):
        sent(db, 2)
    assert deliveries(db) == []


def test_retries_fire_nothing_and_dead_and_failed_fire_their_events(db):
    BlockingHooks(db, settings_for(db)).create_endpoint("default", "https://e.com/h", ["*"])
    messages = enqueue(db, 3)
    token = claim(db).token
    finalize(
        db,
        token,
        (messages[0].id, Decision(Action.RETRY, error="421", next_attempt_at=T0)),
        (messages[1].id, Decision(Action.FAIL, error="550 no such user")),
        (messages[2].id, Decision(Action.BURY, error="421 again")),
    )
    events = {json.loads(r.payload)["data"]["message_id"]: r.event for r in deliveries(db)}
    assert events == {str(messages[1].id): "message.failed", str(messages[2].id): "message.dead"}
    failed = next(r for r in deliveries(db) if r.event == "message.failed")
    assert json.loads(failed.payload)["data"]["error"] == "550 no such user"


def test_a_message_born_failed_because_every_recipient_is_suppressed_fires_failed(db):
    BlockingHooks(db, settings_for(db)).create_endpoint("default", "https://e.com/h", ["failed"])
    with db.engine.begin() as conn:
        run(
            conn,
            suppressions.add(
                tenant_id="default", email="gone@example.com", reason="hard_bounce", now=T0
            ),
        )
    (gone,) = enqueue(db, 1, to="gone@example.com")
    enqueue(db, 1, to="here@example.com")  # an ordinary pending message fires nothing
    assert gone.status == Status.FAILED
    ((event, payload),) = [(r.event, json.loads(r.payload)) for r in deliveries(db)]
    assert event == "message.failed"
    assert payload["data"]["message_id"] == str(gone.id)


def test_a_provider_event_about_our_message_fires_its_hook_in_the_same_transaction(db):
    BlockingHooks(db, settings_for(db)).create_endpoint(
        "default", "https://e.com/h", ["bounced", "opened"]
    )
    (message,) = sent(db, 1)
    event = ProviderEvent(
        provider="brevo",
        kind=EventKind.BOUNCED,
        provider_event="hard_bounce",
        occurred_at=T0 + timedelta(minutes=3),
        provider_message_id="<p>",
        message_id=message.id,
        recipient=message.to_address,
        dedup_key="brevo:bounce-1",
        detail="550 5.1.1 unknown",
        raw={},
        bounce_type=BounceType.HARD,
    )
    with db.engine.begin() as conn:
        assert run(conn, event_store.store(event, message=message, now=T0)) is not None
        # Stored twice (a provider's resend): no second hook.
        assert run(conn, event_store.store(event, message=message, now=T0)) is None
    (row,) = deliveries(db)
    body = json.loads(row.payload)
    assert body["type"] == "message.bounced"
    assert body["timestamp"] == "2026-01-01T12:03:00Z"  # when it happened, not when we heard
    assert body["data"]["bounce_type"] == "hard"
    assert body["data"]["detail"] == "550 5.1.1 unknown"
    assert body["data"]["provider"] == "brevo"
    # Unmatched to a message: nothing.
    with db.engine.begin() as conn:
        unmatched = ProviderEvent(**{**event.__dict__, "dedup_key": "brevo:2"})
        run(conn, event_store.store(unmatched, message=None, now=T0))
    assert len(deliveries(db)) == 1


# --- The deliveries' outbox ---------------------------------------------------------------


def claim_hooks(db: TestDB, now: Any = T0, limit: int = 10, worker: str = "w1") -> store.HookClaim:
    with db.engine.begin() as conn:
        return run(
            conn, store.claim(worker_id=worker, now=now, lease=timedelta(seconds=60), limit=limit)
        )


def finish(db: TestDB, token: uuid.UUID, *results: store.Attempted, now: Any = T0) -> list[Any]:
    with db.engine.begin() as conn:
        return run(conn, store.finalize(token=token, results=list(results), now=now, actor="w1"))


def test_a_delivery_is_claimed_with_its_endpoint_then_retried_delivered_and_replayed(db):
    hooks = BlockingHooks(db, settings_for(db))
    created = hooks.create_endpoint("default", "https://e.com/h", ["sent"])
    sent(db, 1)
    first = claim_hooks(db)
    (claimed,) = first.deliveries
    assert claimed.url == "https://e.com/h"
    assert SecretBox(HOOKS_KEY).open(claimed.sealed_secret) == created.secret
    assert claimed.delivery.status is DState.PROCESSING
    assert claim_hooks(db).deliveries == []  # held

    later = T0 + timedelta(seconds=30)
    (retried,) = finish(
        db,
        first.token,
        store.Attempted(claimed.delivery.id, DAction.RETRY, 503, "HTTP 503", later),
    )
    assert (retried.status, retried.attempts, retried.last_status_code) == (DState.RETRYING, 1, 503)
    assert claim_hooks(db).deliveries == []  # not due yet
    second = claim_hooks(db, now=later)
    (delivered,) = finish(
        db, second.token, store.Attempted(claimed.delivery.id, DAction.DELIVER, 204), now=later
    )
    assert delivered.status is DState.DELIVERED and delivered.delivered_at == later
    # A finalize under the old token changes nothing.
    assert finish(db, first.token, store.Attempted(claimed.delivery.id, DAction.BURY)) == []

    detail = hooks.get_delivery(claimed.delivery.id)
    assert [(e.from_status, e.to_status, e.attempt, e.status_code) for e in detail.history] == [
        ("pending", "processing", 1, None),
        ("processing", "retrying", 1, 503),
        ("retrying", "processing", 2, 503),
        ("processing", "delivered", 2, 204),
    ]

    replayed = hooks.replay(claimed.delivery.id, actor="ops@example.com")
    assert replayed.status is DState.PENDING
    assert replayed.webhook_id == claimed.delivery.webhook_id
    assert replayed.max_attempts == 2 + settings_for(db).hook_max_attempts
    with pytest.raises(NotReplayable):
        hooks.replay(claimed.delivery.id, actor="ops@example.com")
    with pytest.raises(UnknownDelivery):
        hooks.replay(uuid.uuid4(), actor="ops@example.com")
    assert hooks.get_delivery(claimed.delivery.id).history[-1].actor == "ops@example.com"


def test_an_expired_lease_is_swept_back_to_retrying_with_the_attempt_counted(db):
    BlockingHooks(db, settings_for(db)).create_endpoint("default", "https://e.com/h", ["sent"])
    sent(db, 2)
    held = claim_hooks(db)
    assert len(held.deliveries) == 2
    with db.engine.begin() as conn:
        assert run(conn, store.sweep(now=T0 + timedelta(seconds=59), actor="s")) == []
        swept = run(conn, store.sweep(now=T0 + timedelta(seconds=61), actor="s"))
    assert {(d.status, d.attempts) for d in swept} == {(DState.RETRYING, 1)}
    # The late worker's finalize is refused: its claim is gone.
    assert (
        finish(
            db,
            held.token,
            *(store.Attempted(c.delivery.id, DAction.DELIVER, 200) for c in held.deliveries),
        )
        == []
    )
    assert len(claim_hooks(db, now=T0 + timedelta(seconds=61)).deliveries) == 2


def test_a_disabled_or_deleted_endpoints_deliveries_are_not_claimed(db):
    hooks = BlockingHooks(db, settings_for(db))
    endpoint = hooks.create_endpoint("default", "https://e.com/h", ["sent"]).endpoint
    sent(db, 1)
    hooks.update_endpoint(endpoint.id, enabled=False)
    assert claim_hooks(db).deliveries == []
    hooks.update_endpoint(endpoint.id, enabled=True)  # they wait, and go when enabled again
    assert len(claim_hooks(db).deliveries) == 1
    hooks.delete_endpoint(endpoint.id)
    assert deliveries(db) == []


def test_deliveries_are_listed_newest_first_page_by_page(db):
    hooks = BlockingHooks(db, settings_for(db))
    endpoint = hooks.create_endpoint("default", "https://e.com/h", ["sent"]).endpoint
    sent(db, 5)
    seen: list[uuid.UUID] = []
    cursor = None
    while True:
        page = hooks.list_deliveries(
            DeliveryFilter(endpoint_id=endpoint.id), cursor=cursor, limit=2
        )
        seen += [d.id for d in page.deliveries]
        assert all(d.url == "https://e.com/h" for d in page.deliveries)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted((r.id for r in deliveries(db)), reverse=True)
    assert (
        hooks.list_deliveries(DeliveryFilter(tenant_id="default", status=DState.DEAD)).deliveries
        == []
    )
    with pytest.raises(ValueError):
        hooks.list_deliveries(DeliveryFilter(), cursor="not-a-cursor")
    with pytest.raises(ValueError):
        hooks.list_deliveries(DeliveryFilter(), limit=0)


@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_concurrent_claimers_never_take_the_same_delivery(db):
    BlockingHooks(db, settings_for(db)).create_endpoint("default", "https://e.com/h", ["sent"])
    sent(db, 60)

    def take(worker_id: str, limit: int) -> Any:
        claimed = yield from store.claim(
            worker_id=worker_id,
            now=T0,
            lease=timedelta(seconds=60),
            limit=limit,
            fairness=store.Fairness(in_flight=1000),  # one endpoint: no cap in the way
        )
        return [c.delivery.id for c in claimed.deliveries]

    taken = race_claims(db, 4, 7, take=take)
    every = [d for ids in taken for d in ids]
    assert len(every) == len(set(every)) == 60


# --- The deliverer against a real receiver -----------------------------------------------


LOCAL_RECEIVERS = Policy(allow_loopback=True)  # the test receivers listen on 127.0.0.1


def deliverer(db: TestDB, engine: Any, **config: Any) -> HookDeliverer:
    # The clock stands still (the deliveries are due at T0): a retry's full jitter may be
    # milliseconds, and one due again within the same round would make counts luck.
    return HookDeliverer(
        engine,
        SecretBox(HOOKS_KEY),
        HookConfig(
            worker_id="w1",
            timeout=config.pop("timeout", 5.0),
            destinations=LOCAL_RECEIVERS,
            **config,
        ),
        clock=lambda: T0,
    )


async def test_the_deliverer_posts_signed_bodies_the_receiver_verifies(db, async_engine):
    hooks = BlockingHooks(db, settings_for(db))
    with HookReceiver() as receiver:
        created = hooks.create_endpoint("default", receiver.url, ["sent"])
        receiver.secret = created.secret
        messages = sent(db, 3)
        deliverer_ = deliverer(db, async_engine)
        try:
            outcome = await deliverer_.run_once()
        finally:
            await deliverer_.aclose()
        assert outcome == {"hooks_delivered": 3}
        assert receiver.rejected == 0
        bodies = receiver.delivered()
        assert {b.body["data"]["message_id"] for b in bodies} == {str(m.id) for m in messages}
        assert {b.webhook_id for b in bodies} == {r.webhook_id for r in deliveries(db)}
    assert {r.status for r in deliveries(db)} == {"delivered"}


async def test_a_failing_receiver_is_retried_with_backoff_then_dead(db, async_engine):
    from mailbag.domain.policy import RetryPolicy

    hooks = BlockingHooks(db, settings_for(db))
    with HookReceiver(fail_first=10, fail_status=500) as receiver:
        receiver.secret = hooks.create_endpoint("default", receiver.url, ["sent"]).secret
        sent(db, 1)  # max_attempts 3 (the fan_out_on fixture)
        now = [T0]
        deliverer_ = HookDeliverer(
            async_engine,
            SecretBox(HOOKS_KEY),
            HookConfig(
                worker_id="w1",
                timeout=5.0,
                policy=RetryPolicy(3, timedelta(seconds=10)),
                destinations=LOCAL_RECEIVERS,
            ),
            clock=lambda: now[0],
        )
        try:
            assert await deliverer_.run_once() == {"hooks_retrying": 1}
            (row,) = deliveries(db)
            assert T0 <= row.next_attempt_at <= T0 + timedelta(seconds=10)  # full jitter
            assert row.last_error == "http-5xx: HTTP 500"  # the reason; never the body
            assert await deliverer_.run_once() == {}  # not due yet
            now[0] = T0 + timedelta(minutes=1)
            assert await deliverer_.run_once() == {"hooks_retrying": 1}
            now[0] = T0 + timedelta(minutes=5)
            assert await deliverer_.run_once() == {"hooks_dead": 1}
        finally:
            await deliverer_.aclose()
        assert len(receiver.received) == 3 and len(receiver.ids()) == 0
        assert len(set(r.webhook_id for r in receiver.received)) == 1  # the same id each time
    (row,) = deliveries(db)
    assert (row.status, row.attempts, row.last_status_code) == ("dead", 3, 500)


async def test_a_redirect_is_not_followed_and_counts_as_a_failure(db, async_engine):
    from starlette.applications import Starlette
    from starlette.responses import RedirectResponse
    from starlette.routing import Route

    from servers import uvicorn_thread

    async def moved(request: Any) -> Any:
        return RedirectResponse("https://elsewhere.example.com/", status_code=307)

    async def healthz(request: Any) -> Any:
        from starlette.responses import PlainTextResponse

        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/hooks", moved, methods=["POST"]), Route("/healthz", healthz)])
    hooks = BlockingHooks(db, settings_for(db))
    with uvicorn_thread(app) as base:
        hooks.create_endpoint("default", f"{base}/hooks", ["sent"])
        sent(db, 1)
        deliverer_ = deliverer(db, async_engine)
        try:
            assert await deliverer_.run_once() == {"hooks_retrying": 1}
        finally:
            await deliverer_.aclose()
    (row,) = deliveries(db)
    assert row.last_status_code == 307


async def test_an_unreachable_endpoint_is_retried_with_the_error_recorded(db, async_engine):
    from servers import free_port

    hooks = BlockingHooks(db, settings_for(db))
    hooks.create_endpoint("default", f"http://127.0.0.1:{free_port()}/hooks", ["sent"])
    sent(db, 1)
    deliverer_ = deliverer(db, async_engine, timeout=2.0)
    try:
        assert await deliverer_.run_once() == {"hooks_retrying": 1}
    finally:
        await deliverer_.aclose()
    (row,) = deliveries(db)
    assert row.last_status_code is None and row.last_error == "refused: connection refused"


def test_hooks_key_must_be_long_enough_and_empty_means_off(db):
    assert not settings_for(db, hooks_key="").hooks_enabled
    with pytest.raises(ValueError, match=r"(?i)hooks_key"):
        settings_for(db, hooks_key="short")


async def test_a_stopping_deliverer_hands_its_batch_back_without_spending_an_attempt(
    db, async_engine
):
    import asyncio

    hooks = BlockingHooks(db, settings_for(db))
    with HookReceiver(delay=2.0) as receiver:
        receiver.secret = hooks.create_endpoint("default", receiver.url, ["sent"]).secret
        sent(db, 2)
        deliverer_ = deliverer(db, async_engine)
        try:
            running = asyncio.ensure_future(deliverer_.run_once())
            while not receiver.in_flight:
                await asyncio.sleep(0.02)
            running.cancel()  # as SideTasks.stop does when the worker stops
            with pytest.raises(asyncio.CancelledError):
                await running
        finally:
            await deliverer_.aclose()
    rows = deliveries(db)
    assert {(r.status, r.attempts, r.claim_token) for r in rows} == {("pending", 0, None)}
    assert history(db, rows[0].id)[-1] == ("processing", "pending", 1)


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_the_worker_runs_the_deliverer_and_fans_out_only_with_hooks_key(db, tmp_path):
    from mailbag import runtime

    for key, expected_jobs in (("", ["scheduler"]), (HOOKS_KEY, ["scheduler", "hooks"])):
        settings = settings_for(
            db, hooks_key=key, hook_max_attempts=4, provider="file", file_dir=tmp_path
        )
        engine = runtime.worker_engine(settings)
        try:
            worker = runtime.build_worker(settings, engine)
            assert [job.name for job in worker.jobs] == expected_jobs
            fan_out = engine.sync_engine.get_execution_options()[store.FAN_OUT_OPTION]
            assert fan_out == store.FanOut(enabled=bool(key), max_attempts=4)
            for job in worker.jobs:
                if job.close is not None:
                    await job.close()
            await worker.provider.aclose()
        finally:
            await engine.dispose()


def test_every_move_the_store_records_is_one_the_delivery_machine_allows(db):
    hooks = BlockingHooks(db, settings_for(db))
    hooks.create_endpoint("default", "https://e.com/h", ["sent"])
    sent(db, 4)
    at = T0
    for step in range(4):  # claim, then each delivery ends its own way, again and again
        claimed = claim_hooks(db, now=at)
        ways = [
            store.Attempted(c.delivery.id, action, 500, "boom", at)
            for c, action in zip(
                claimed.deliveries,
                [DAction.RETRY, DAction.BURY, DAction.RELEASE, DAction.DELIVER][step:]
                + [DAction.RETRY] * step,
                strict=False,
            )
        ]
        finish(db, claimed.token, *ways[1:], now=at)  # the first one's lease runs out
        at += timedelta(minutes=2)
        with db.engine.begin() as conn:
            run(conn, store.sweep(now=at, actor="sweeper"))
        for delivery in deliveries(db):
            if delivery.status in ("delivered", "dead"):
                hooks.replay(delivery.id, actor="ops")
    with db.engine.connect() as conn:
        moves = conn.execute(
            select(hook_delivery_events.c.from_status, hook_delivery_events.c.to_status)
        ).all()
    assert len(moves) >= 20
    for source, target in moves:
        assert rules.DELIVERIES.can_move(DState(source) if source else None, DState(target)), (
            source,
            target,
        )
    kinds = {(source, target) for source, target in moves}
    assert {("processing", "retrying"), ("processing", "dead"), ("processing", "pending")} <= kinds
    assert {("dead", "pending"), ("delivered", "pending"), ("processing", "delivered")} <= kinds


async def test_the_async_service_keeps_each_tenant_to_its_own_endpoints_and_deliveries(
    db, async_engine
):
    from api_helpers import new_tenant
    from mailbag.services.hooks import Hooks

    other, _ = new_tenant(db, "other")  # a tenant with nothing of its own
    hooks = Hooks(async_engine, settings_for(db))
    mine = await hooks.create_endpoint("default", "https://e.com/h", ["sent"], "mine")
    with pytest.raises(InvalidHook):
        await hooks.create_endpoint("default", "http://e.com/h", ["sent"])
    sent(db, 1)
    (delivery,) = (await hooks.list_deliveries(DeliveryFilter(tenant_id="default"))).deliveries
    assert (await hooks.list_deliveries(DeliveryFilter(tenant_id=other))).deliveries == []

    endpoint_id = mine.endpoint.id
    assert (await hooks.get_endpoint(endpoint_id, "default")).description == "mine"
    for call in (
        hooks.get_endpoint(endpoint_id, other),
        hooks.update_endpoint(endpoint_id, tenant_id=other, enabled=False),
        hooks.rotate_secret(endpoint_id, other),
        hooks.delete_endpoint(endpoint_id, other),
    ):
        with pytest.raises(UnknownEndpoint):
            await call
    with pytest.raises(UnknownDelivery):
        await hooks.get_delivery(delivery.id, other)
    with pytest.raises(UnknownDelivery):
        await hooks.replay(delivery.id, actor="ops", tenant_id=other)
    with pytest.raises(NotReplayable):  # pending: on its way already
        await hooks.replay(delivery.id, actor="ops", tenant_id="default")
    assert await hooks.list_endpoints(other) == []
    with pytest.raises(UnknownTenant):  # one nobody has is refused, never an empty view
        await hooks.list_endpoints("t_nobody")
    assert [e.id for e in await hooks.list_endpoints()] == [endpoint_id]
    off = Hooks(async_engine, settings_for(db, hooks_key=None))
    with pytest.raises(HooksOff):
        await off.list_endpoints()
