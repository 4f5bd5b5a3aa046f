"""Credentials over HTTP, on each database: empty secrets switch features off, console
sessions are server-side and unforgeable, wrong passwords and tokens are throttled, and
/metrics keeps its token and its tenants to itself."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from itsdangerous import URLSafeTimedSerializer
from sqlalchemy import select

from api_helpers import TEST_SECRET_KEY, new_tenant, settings_for
from mailbag import keys
from mailbag.api import create_app
from mailbag.console import auth
from mailbag.services.throttle import MAX_CLIENTS, FailureThrottle
from mailbag.settings import Settings
from mailbag.store.schema import console_sessions
from test_console import PASSWORD, csrf_in, login, token

EMPTY_SECRETS = (
    "MAILBAG_ADMIN_TOKEN",
    "MAILBAG_ADMIN_PASSWORD",
    "MAILBAG_BREVO_WEBHOOK_SECRET",
    "MAILBAG_SES_WEBHOOK_SECRET",
    "MAILBAG_METRICS_TOKEN",
)
DELIVERED = {"event": "delivered", "email": "a@example.com", "ts_epoch": 1_700_000_000_000}


@asynccontextmanager
async def running(
    app_or_settings: FastAPI | Settings,
) -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """The app, running; `client(ip)` gives a client that connects from that address."""
    app = app_or_settings if isinstance(app_or_settings, FastAPI) else create_app(app_or_settings)
    clients: list[httpx.AsyncClient] = []

    def client(ip: str = "192.0.2.1") -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, client=(ip, 40000))
        made = httpx.AsyncClient(transport=transport, base_url="http://mailbag.test")
        clients.append(made)
        return made

    async with app.router.lifespan_context(app):
        try:
            yield client
        finally:
            for made in clients:
                await made.aclose()


def session_serializer(key: bytes) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(key, salt="mailbag.console.session")


# --- empty secrets ------------------------------------------------------------------------


async def test_empty_secrets_in_the_environment_switch_their_features_off(db, monkeypatch):
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    monkeypatch.setenv("MAILBAG_SECRET_KEY", TEST_SECRET_KEY)
    for name in EMPTY_SECRETS:
        monkeypatch.setenv(name, "")
    async with running(Settings()) as client:
        api = client()
        for auth_header in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer x"}):
            assert (await api.get("/v1/admin/stats", headers=auth_header)).status_code == 404
        assert (await api.get("/admin/login")).status_code == 404
        assert (await api.post("/admin/login", data={"password": ""})).status_code == 404
        for provider in ("brevo", "ses"):
            for params in ({}, {"secret": ""}):
                r = await api.post(f"/v1/webhooks/{provider}", json=DELIVERED, params=params)
                assert r.status_code == 404, (provider, params)
        assert (await api.get("/metrics")).status_code == 200  # no token: open, as documented


async def test_an_empty_credential_never_matches_a_configured_one(db):
    settings = settings_for(
        db,
        admin_token="admin-token-0123456789",
        admin_password=PASSWORD,
        brevo_webhook_secret="brevo-secret",
        ses_webhook_secret="ses-secret",
    )
    async with running(settings) as client:
        api = client()
        for auth_header in ({}, {"Authorization": "Bearer "}, {"Authorization": "Basic Og=="}):
            assert (await api.get("/v1/admin/stats", headers=auth_header)).status_code == 401
        for provider in ("brevo", "ses"):
            for how in (
                {"params": {"secret": ""}},
                {"headers": {"X-Mailbag-Webhook-Secret": ""}},
                {"headers": {"Authorization": "Bearer "}},
                {"auth": (provider, "")},
            ):
                r = await api.post(f"/v1/webhooks/{provider}", json=DELIVERED, **how)
                assert r.status_code == 401, (provider, how)
        assert (await login(api, "")).status_code == 401
        assert (await api.get("/admin")).status_code == 303


# --- console sessions ------------------------------------------------------------------------


async def test_what_a_visitor_gets_says_nothing_about_the_password(db):
    """The login form's cookie is signed with a subkey of the deployment key: two consoles
    with different passwords accept each other's, so nothing in it depends on the password,
    and a cookie forged with a key derived from the password is worth nothing."""
    async with running(settings_for(db, admin_password=PASSWORD)) as first:
        form = await first().get("/admin/login")
    visitor_cookie = form.cookies[auth.SESSION_COOKIE]
    subkey = keys.derive(TEST_SECRET_KEY.encode(), "console-session")
    assert session_serializer(subkey).loads(visitor_cookie) == {"csrf": csrf_in(form), "sid": None}

    async with running(settings_for(db, admin_password="another long password")) as second:
        other = second()
        other.cookies.set(auth.SESSION_COOKIE, visitor_cookie, domain="mailbag.test", path="/admin")
        r = await other.post(
            "/admin/login", data={"csrf": csrf_in(form), "password": "another long password"}
        )
        assert r.status_code == 303  # the form token was accepted: it is not the password's

        # The old scheme: a key derived from the password alone signs an "admin" session.
        old_key = hmac.new(PASSWORD.encode(), b"mailbag console session key v1", "sha256").digest()
        for key in (old_key, subkey):
            forged = session_serializer(key).dumps({"csrf": "x", "auth": True, "sid": "guess"})
            intruder = second()
            intruder.cookies.set(auth.SESSION_COOKIE, forged, domain="mailbag.test", path="/admin")
            assert (await intruder.get("/admin")).status_code == 303


async def test_logout_ends_the_session_on_every_replica(db):
    settings = settings_for(db, admin_password=PASSWORD)
    async with running(settings) as on_a, running(settings) as on_b:
        a = on_a()
        assert (await login(a)).status_code == 303
        kept = a.cookies[auth.SESSION_COOKIE]
        b = on_b()
        b.cookies.set(auth.SESSION_COOKIE, kept, domain="mailbag.test", path="/admin")
        assert (await b.get("/admin")).status_code == 200  # one session, any replica

        with db.engine.connect() as conn:
            (row,) = conn.execute(select(console_sessions)).all()
        secret = session_serializer(keys.derive(TEST_SECRET_KEY.encode(), "console-session"))
        sid = secret.loads(kept)["sid"]
        assert row.id_digest == hashlib.sha256(sid.encode()).hexdigest() != sid
        assert PASSWORD not in row.password_fingerprint
        assert row.password_fingerprint != hashlib.sha256(PASSWORD.encode()).hexdigest()

        out = await b.post("/admin/logout", data={"csrf": await token(b)})
        assert out.status_code == 303
        # The cookie a thief copied before the logout no longer opens anything, anywhere.
        for replica in (on_a(), on_b()):
            replica.cookies.set(auth.SESSION_COOKIE, kept, domain="mailbag.test", path="/admin")
            assert (await replica.get("/admin")).status_code == 303
    with db.engine.connect() as conn:
        assert conn.execute(select(console_sessions)).all() == []


async def test_a_new_admin_password_ends_every_session(db):
    async with running(settings_for(db, admin_password=PASSWORD)) as client:
        browser = client()
        await login(browser)
        kept = browser.cookies[auth.SESSION_COOKIE]
    # Same deployment key, new password: the cookie's signature is still good, the session not.
    async with running(settings_for(db, admin_password="a brand new password")) as client:
        browser = client()
        browser.cookies.set(auth.SESSION_COOKIE, kept, domain="mailbag.test", path="/admin")
        assert (await browser.get("/admin")).status_code == 303
    async with running(settings_for(db, admin_password=PASSWORD)) as client:
        browser = client()
        browser.cookies.set(auth.SESSION_COOKIE, kept, domain="mailbag.test", path="/admin")
        assert (await browser.get("/admin")).status_code == 200  # the old password: still on


# --- throttling -----------------------------------------------------------------------------


async def test_wrong_passwords_are_throttled_per_client(db):
    async with running(settings_for(db, admin_password=PASSWORD)) as client:
        attacker = client("198.51.100.7")
        form = csrf_in(await attacker.get("/admin/login"))
        answers = []
        for i in range(200):
            r = await attacker.post("/admin/login", data={"csrf": form, "password": f"guess {i}"})
            answers.append(r.status_code)
            if r.status_code == 429:
                assert 1 <= int(r.headers["Retry-After"]) <= 60
                assert "Too many failed logins" in r.text
        assert answers[:5] == [401] * 5 and set(answers[5:]) == {429}
        # Even the right password is not checked for that client now: no guess gets an answer.
        assert (await login(attacker)).status_code == 429
        # The operator, elsewhere, logs in: only checked guesses count towards the overall limit.
        operator = client("203.0.113.9")
        assert (await login(operator)).status_code == 303
        assert (await operator.get("/admin")).status_code == 200


async def test_wrong_passwords_from_many_clients_close_the_login_for_everyone(db):
    """The overall limit: guesses spread over many addresses lock the login for a minute
    (the operator can still use the CLI); set AUTH_FAILURES_OVERALL to tune it."""
    settings = settings_for(db, admin_password=PASSWORD, auth_failures_overall=6)
    async with running(settings) as client:
        for n in range(3):
            bot = client(f"198.51.100.{n}")
            for _ in range(2):
                assert (await login(bot, "wrong password")).status_code == 401
        refused = await login(client("203.0.113.9"))
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1


async def test_wrong_admin_tokens_are_throttled_per_client(db):
    settings = settings_for(db, admin_token="admin-token-0123456789")
    async with running(settings) as client:
        attacker = client("198.51.100.7")
        codes = [
            (
                await attacker.get("/v1/admin/stats", headers={"Authorization": f"Bearer g{i}"})
            ).status_code
            for i in range(200)
        ]
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}
        limited = await attacker.get("/v1/admin/stats", headers={"Authorization": "Bearer g"})
        assert limited.headers["content-type"] == "application/problem+json"
        assert 1 <= int(limited.headers["Retry-After"]) <= 60
        script = client("203.0.113.9")
        for _ in range(20):  # no token at all guesses nothing, and is not counted
            assert (await script.get("/v1/admin/stats")).status_code == 401
        right = await script.get(
            "/v1/admin/stats", headers={"Authorization": "Bearer admin-token-0123456789"}
        )
        assert right.status_code == 200


def test_the_throttle_forgets_failures_after_its_window():
    now = [1000.0]
    throttle = FailureThrottle(per_client=2, overall=5, window=60, clock=lambda: now[0])
    throttle.failed("a")
    now[0] += 10
    throttle.failed("a")
    assert throttle.retry_after("a") == 50  # when the first failure leaves the window
    assert throttle.retry_after("b") is None
    now[0] += 50
    assert throttle.retry_after("a") is None
    for client in "bcde":
        throttle.failed(client)
    assert throttle.retry_after("f") == 10  # overall: 5 failures in the last minute
    now[0] += 60
    assert throttle.retry_after("f") is None


def test_the_throttle_remembers_a_bounded_number_of_clients():
    throttle = FailureThrottle(per_client=1, overall=10**9, clock=lambda: 0.0)
    for n in range(MAX_CLIENTS + 100):
        throttle.failed(f"client-{n}")
    assert len(throttle._clients) == MAX_CLIENTS
    assert throttle.retry_after(f"client-{MAX_CLIENTS + 99}") is not None


# --- /metrics ---------------------------------------------------------------------------------


async def test_metrics_want_their_token_when_one_is_set(db):
    async with running(settings_for(db, metrics_token="scrape-token")) as client:
        scraper = client()
        assert (await scraper.get("/metrics")).status_code == 401
        wrong = await scraper.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = await scraper.get("/metrics", headers={"Authorization": "Bearer scrape-token"})
        assert right.status_code == 200 and "mailbag_messages" in right.text


@pytest.mark.parametrize("tenant_labels", [False, True])
async def test_metrics_name_tenants_only_when_asked(db, tenant_labels):
    tenant_id, key = new_tenant(db, f"metrics-{tenant_labels}")
    body: dict[str, Any] = {"to": "ada@example.com", "template": "welcome", "data": {"name": "A"}}
    settings = settings_for(db, metrics_tenant_labels=tenant_labels)
    async with running(settings) as client:
        api = client()
        api.headers["Authorization"] = f"Bearer {key}"
        idem = {"Idempotency-Key": "same-key"}
        assert (await api.post("/v1/messages", json=body, headers=idem)).status_code == 201
        other = {**body, "data": {"name": "B"}}
        assert (await api.post("/v1/messages", json=other, headers=idem)).status_code == 409
        text = (await api.get("/metrics")).text
    assert (tenant_id in text) is tenant_labels
    if not tenant_labels:
        assert 'mailbag_idempotency_conflicts_total{tenant="all"}' in text


def test_empty_fleet_settings_mean_unset_and_bad_ones_are_refused(monkeypatch):
    import pydantic

    monkeypatch.setenv("MAILBAG_DATABASE_URL", "postgresql://u@db/mailbag")
    for name in ("LISTEN_URL", "MIGRATE_URL", "PROVIDER_RATE"):
        monkeypatch.setenv(f"MAILBAG_{name}", " ")
    settings = Settings()
    assert (settings.listen_url, settings.migrate_url, settings.provider_rate) == (None, None, None)
    assert settings.session_url == settings.schema_url == "postgresql://u@db/mailbag"
    for name, value in (
        ("LISTEN_URL", "redis://cache/0"),
        ("PROVIDER_RATE", "-1"),
        ("PROVIDER_RATE", "fast"),
        ("PURGE_AFTER_DAYS", "-1"),
    ):
        with monkeypatch.context() as env:
            env.setenv(f"MAILBAG_{name}", value)
            with pytest.raises(pydantic.ValidationError, match=name.lower()):
                Settings()
