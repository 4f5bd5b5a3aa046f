"""`/v1/templates` and what messages show of their template, over the real app: publish,
read, roll back, and every bad input a clear 4xx that writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from api_helpers import api_client, new_tenant
from mailbag.store.schema import template_versions

from conftest import TestDB

WELCOME = {
    "subject": "Bienvenue, {{ name }}",
    "html": "<p>Bonjour {{ name }}</p>",
    "text": "Bonjour {{ name }}",
    "sample_data": {"name": "Ada"},
}


def versions_written(db: TestDB) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(template_versions)).scalar_one())


def problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"].endswith(slug), body
    return dict(body)


async def test_put_publishes_versions_and_get_reads_each(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as client:
        first = await client.put("/v1/templates/welcome/fr-ca", json=WELCOME)
        assert first.status_code == 201, first.text
        assert (first.json()["version"], first.json()["locale"]) == (1, "fr-CA")
        again = await client.put("/v1/templates/welcome/fr-CA", json=WELCOME)
        assert (again.status_code, again.json()["version"]) == (200, 1)  # nothing new
        second = await client.put(
            "/v1/templates/welcome/fr-CA", json={**WELCOME, "subject": "Salut {{ name }}"}
        )
        assert (second.status_code, second.json()["version"]) == (201, 2)
        listed = (await client.get("/v1/templates/welcome/fr-CA")).json()
        assert [(v["version"], v["current"]) for v in listed["versions"]] == [(1, False), (2, True)]
        one = (await client.get("/v1/templates/welcome/fr-CA/1")).json()
        assert one["subject"] == WELCOME["subject"] and one["current"] is False
        rolled = await client.post("/v1/templates/welcome/fr-CA/rollback", json={"version": 1})
        assert rolled.status_code == 200 and rolled.json()["version"] == 1
        index = (await client.get("/v1/templates")).json()["templates"]
        assert index[0]["name"] == "welcome" and index[0]["default_locale"] == "fr-CA"
        assert index[0]["locales"][0]["current_version"] == 1
        # A message names the version and locale it got.
        sent = await client.post(
            "/v1/messages",
            json={"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}},
        )
        assert sent.status_code == 201, sent.text
        body = sent.json()
        assert (body["template_version"], body["template_locale"], body["locale"]) == (
            1,
            "fr-CA",
            None,
        )
        read = (await client.get(f"/v1/messages/{body['id']}")).json()
        assert read["template_version"] == 1


async def test_a_template_that_does_not_compile_is_a_422_with_its_line(db):
    _, key = new_tenant(db)
    broken = {**WELCOME, "html": "<p>one</p>\n<p>two</p>\n{% if %}"}
    async with api_client(db, key) as client:
        r = await client.put("/v1/templates/welcome/en", json=broken)
    body = problem(r, 422, "template-problems")
    assert body["problems"][0]["part"] == "html" and body["problems"][0]["line"] == 3
    assert versions_written(db) == 0


async def test_a_template_that_does_not_render_with_its_sample_data_is_refused(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as client:
        r = await client.put(
            "/v1/templates/welcome/en", json={**WELCOME, "sample_data": {"nom": "Ada"}}
        )
    body = problem(r, 422, "template-problems")
    assert "name" in body["detail"]
    assert versions_written(db) == 0


@pytest.mark.parametrize(
    ("path", "body", "status", "slug"),
    [
        ("/v1/templates/Welcome!/en", WELCOME, 422, "invalid-template"),
        ("/v1/templates/welcome/fr_CA", WELCOME, 422, "invalid-template"),
        ("/v1/templates/welcome/en", {**WELCOME, "html": "x" * (600 * 1024)}, 413, ""),
        ("/v1/templates/welcome/en", {**WELCOME, "subject": ""}, 422, "invalid-template"),
        ("/v1/templates/welcome/en", {**WELCOME, "format": "handlebars"}, 422, "validation-error"),
        ("/v1/templates/welcome/en", {**WELCOME, "extra": 1}, 422, "validation-error"),
        (
            "/v1/templates/welcome/en",
            {**WELCOME, "html": "{{ ''.__class__.__mro__ }}"},
            422,
            "template-problems",
        ),
        (
            "/v1/templates/welcome/en",
            {
                **WELCOME,
                "html": "{% for a in range(99999) %}{% for b in range(99999) %}"
                "{% endfor %}{% endfor %}",
            },
            422,
            "template-problems",
        ),
    ],
)
async def test_bad_input_is_a_clear_4xx_that_writes_nothing(db, path, body, status, slug):
    _, key = new_tenant(db)
    async with api_client(db, key) as client:
        r = await client.put(path, json=body)
    assert r.status_code == status, r.text
    if slug:
        problem(r, status, slug)
    assert "<class" not in r.text
    assert versions_written(db) == 0


async def test_unknown_templates_and_versions_are_404(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as client:
        assert (await client.get("/v1/templates/nothing/en")).status_code == 404
        await client.put("/v1/templates/welcome/en", json=WELCOME)
        problem(await client.get("/v1/templates/welcome/en/7"), 404, "not-found")
        problem(await client.get("/v1/templates/welcome/de"), 404, "not-found")
        r = await client.post("/v1/templates/welcome/en/rollback", json={"version": 7})
        problem(r, 404, "not-found")


async def test_a_tenant_sees_only_its_own_templates(db):
    _, mine = new_tenant(db, "acme")
    _, theirs = new_tenant(db, "globex")
    async with api_client(db, mine) as client:
        assert (await client.put("/v1/templates/welcome/en", json=WELCOME)).status_code == 201
    async with api_client(db, theirs) as client:
        assert (await client.get("/v1/templates")).json() == {"templates": []}
        assert (await client.get("/v1/templates/welcome/en")).status_code == 404
        sent = await client.post(
            "/v1/messages",
            json={"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}},
        )
        assert sent.json()["template_version"] is None  # the deployment's file template


async def test_a_verification_email_takes_the_locale_asked_for(db):
    _, key = new_tenant(db)
    verify = {
        "subject": "Confirmez {{ email }}",
        "html": '<a href="{{ link }}">{{ token }}</a>',
        "text": "{{ link }}",
        "sample_data": {"email": "a@example.com", "link": "https://x.test/", "token": "t"},
    }
    async with api_client(db, key) as client:
        assert (await client.put("/v1/templates/verify-email/fr", json=verify)).status_code == 201
        r = await client.post(
            "/v1/email-verifications",
            json={"email": "ada@example.com", "locale": "fr-CA"},
            headers={"Idempotency-Key": "v-1"},
        )
        assert r.status_code == 201, r.text
        assert r.json()["locale"] == "fr-CA"
        message = (await client.get(f"/v1/messages/{r.json()['message_id']}")).json()
        assert (message["template_locale"], message["template_version"]) == ("fr", 1)
        bad = await client.post(
            "/v1/email-verifications",
            json={"email": "bob@example.com", "locale": "français"},
            headers={"Idempotency-Key": "v-2"},
        )
        problem(bad, 422, "invalid-message")
