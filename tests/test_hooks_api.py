"""The admin API of event hooks through the real app, on each database: the admin token,
hooks off, endpoints (the secret shown once and stored sealed), validation, deliveries
(filters, paging, detail) and the operator's replay."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from api_helpers import api_client, new_tenant
from hook_helpers import HOOKS_KEY, sent_and_failed, settle_all
from mailbag.domain.hooks import SecretBox, parse_secret
from mailbag.store.schema import hook_endpoints

from conftest import TestDB

ADMIN_TOKEN = "admin-token-for-hooks-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
URL = "https://hooks.acme.example/mailbag"


def admin_api(db: TestDB, **overrides: Any) -> Any:
    settings = {"admin_token": ADMIN_TOKEN, "hooks_key": HOOKS_KEY, **overrides}
    return api_client(db, **{k: v for k, v in settings.items() if v is not None})


def base(tenant: str) -> str:
    return f"/v1/admin/tenants/{tenant}/hooks"


def problem(answer: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = answer.json()
    assert body["type"].endswith(f"/{slug}"), body
    return body


async def create(api: httpx.AsyncClient, tenant: str, **fields: Any) -> dict[str, Any]:
    body = {"url": URL, "events": ["sent"], **fields}
    created = await api.post(f"{base(tenant)}/endpoints", json=body, headers=AUTH)
    assert created.status_code == 201, created.text
    result: dict[str, Any] = created.json()
    return result


# --- access ---------------------------------------------------------------------------


async def test_hook_routes_need_the_admin_token(db):
    tenant, _ = new_tenant(db)
    async with admin_api(db) as api:
        routes = [
            ("GET", f"{base(tenant)}/endpoints"),
            ("POST", f"{base(tenant)}/endpoints"),
            ("GET", f"{base(tenant)}/deliveries"),
            ("POST", f"{base(tenant)}/deliveries/{uuid.uuid4()}/replay"),
        ]
        for method, path in routes:
            bare = await api.request(method, path, json={"url": URL, "events": ["sent"]})
            problem(bare, 401, "unauthorized")
            wrong = await api.request(method, path, headers={"Authorization": "Bearer nope"})
            problem(wrong, 401, "unauthorized")
    async with admin_api(db, admin_token=None) as api:
        off = await api.get(f"{base(tenant)}/endpoints", headers=AUTH)
        assert problem(off, 404, "not-found")["detail"] == "the admin API is not enabled"


async def test_hooks_off_is_a_404_that_says_so_and_only_to_the_admin(db):
    tenant, _ = new_tenant(db)
    async with admin_api(db, hooks_key=None) as api:
        listed = await api.get(f"{base(tenant)}/endpoints", headers=AUTH)
        body = problem(listed, 404, "hooks-off")
        assert body["title"] == "Event hooks are off" and "HOOKS_KEY" in body["detail"]
        # Not a 422 for a body the feature would refuse, nor a tenant lookup: it is off.
        bad = await api.post(f"{base('nobody')}/endpoints", json={"url": 1}, headers=AUTH)
        problem(bad, 404, "hooks-off")
        replay = await api.post(f"{base(tenant)}/deliveries/{uuid.uuid4()}/replay", headers=AUTH)
        problem(replay, 404, "hooks-off")
        # A stranger learns nothing about it.
        problem(await api.get(f"{base(tenant)}/endpoints"), 401, "unauthorized")


# --- endpoints and their secrets ------------------------------------------------------


async def test_the_secret_is_shown_at_creation_and_rotation_only_and_stored_sealed(db, capsys):
    tenant, _ = new_tenant(db)
    async with admin_api(db) as api:
        created = await create(
            api, tenant, events=["sent", "message.bounced"], description="billing"
        )
        secret = created["secret"]
        assert secret.startswith("whsec_") and len(parse_secret(secret)) >= 24
        assert created["tenant_id"] == tenant and created["url"] == URL
        assert created["events"] == ["message.bounced", "message.sent"]
        assert created["enabled"] is True and created["description"] == "billing"
        one = f"{base(tenant)}/endpoints/{created['id']}"

        listed = await api.get(f"{base(tenant)}/endpoints", headers=AUTH)
        shown = await api.get(one, headers=AUTH)
        assert listed.status_code == 200 and shown.status_code == 200
        assert [e["id"] for e in listed.json()] == [created["id"]]
        for answer in (listed, shown):
            assert secret not in answer.text and "secret" not in answer.text
        assert shown.json() == {k: v for k, v in created.items() if k != "secret"}

        with db.engine.connect() as conn:
            stored = conn.execute(select(hook_endpoints.c.secret)).scalar_one()
        assert secret not in stored and secret.removeprefix("whsec_") not in stored
        assert SecretBox(HOOKS_KEY).open(stored) == secret  # sealed with HOOKS_KEY

        rotated = await api.post(f"{one}/rotate-secret", headers=AUTH)
        assert rotated.status_code == 200
        new_secret = rotated.json()["secret"]
        assert new_secret.startswith("whsec_") and new_secret != secret
        with db.engine.connect() as conn:
            stored = conn.execute(select(hook_endpoints.c.secret)).scalar_one()
        assert SecretBox(HOOKS_KEY).open(stored) == new_secret
        again = await api.get(f"{base(tenant)}/endpoints", headers=AUTH)
        assert new_secret not in again.text

    logged = capsys.readouterr()
    assert "hook_endpoint_created" in logged.err and "hook_secret_rotated" in logged.err
    for text in (logged.out, logged.err):
        assert secret not in text and new_secret not in text


async def test_a_tenant_is_named_by_id_or_name_and_sees_only_its_own_endpoints(db):
    acme, _ = new_tenant(db, "acme")
    other, _ = new_tenant(db, "globex")
    async with admin_api(db) as api:
        by_name = await create(api, "acme")
        assert by_name["tenant_id"] == acme
        theirs = await create(api, other)
        mine = await api.get(f"{base(acme)}/endpoints", headers=AUTH)
        assert [e["id"] for e in mine.json()] == [by_name["id"]]
        foreign = f"{base(acme)}/endpoints/{theirs['id']}"
        problem(await api.get(foreign, headers=AUTH), 404, "not-found")
        problem(await api.delete(foreign, headers=AUTH), 404, "not-found")
        problem(await api.post(f"{foreign}/rotate-secret", headers=AUTH), 404, "not-found")
        changed = await api.patch(foreign, json={"enabled": False}, headers=AUTH)
        problem(changed, 404, "not-found")
        still = await api.get(f"{base(other)}/endpoints/{theirs['id']}", headers=AUTH)
        assert still.json()["enabled"] is True
        nobody = await api.get(f"{base('t_nobody')}/endpoints", headers=AUTH)
        problem(nobody, 404, "not-found")
        unknown = await api.post(
            f"{base('t_nobody')}/endpoints", json={"url": URL, "events": ["sent"]}, headers=AUTH
        )
        problem(unknown, 404, "not-found")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "http://hooks.acme.example/x", "events": ["sent"]}, "url"),
        ({"url": "ftp://hooks.acme.example/x", "events": ["sent"]}, "url"),
        ({"url": "https://user:pw@hooks.acme.example/x", "events": ["sent"]}, "url"),
        ({"url": "not a url", "events": ["sent"]}, "url"),
        ({"url": URL, "events": ["sendt"]}, "events"),
        ({"url": URL, "events": [" "]}, "events"),
        ({"url": URL, "events": ["sent"], "description": "x" * 501}, None),
        ({"url": URL, "events": []}, None),
        ({"url": URL}, None),
        ({"url": URL, "events": ["sent"], "secret": "whsec_mine"}, None),
        ({"url": "https://h.example/" + "a" * 2000, "events": ["sent"]}, None),
    ],
)
async def test_an_endpoint_the_rules_refuse_is_a_422_and_nothing_is_written(db, body, field):
    tenant, _ = new_tenant(db)
    async with admin_api(db) as api:
        refused = await api.post(f"{base(tenant)}/endpoints", json=body, headers=AUTH)
        if field is None:  # the schema's
            problem(refused, 422, "validation-error")
        else:
            assert field in problem(refused, 422, "invalid-hook")["errors"]
        listed = await api.get(f"{base(tenant)}/endpoints", headers=AUTH)
        assert listed.json() == []


async def test_a_422_names_every_bad_field_at_once_and_an_internal_url_is_one(db):
    tenant, _ = new_tenant(db)
    body = {"url": "https://169.254.169.254/latest/", "events": ["sendt"]}
    async with admin_api(db) as api:
        refused = await api.post(f"{base(tenant)}/endpoints", json=body, headers=AUTH)
        errors = problem(refused, 422, "invalid-hook")["errors"]
        assert set(errors) == {"url", "events"}
        assert "cloud metadata" in errors["url"]
        assert (await api.get(f"{base(tenant)}/endpoints", headers=AUTH)).json() == []


async def test_http_to_localhost_only_when_the_setting_allows_it(db):
    tenant, _ = new_tenant(db)
    local = {"url": "http://127.0.0.1:9999/hook", "events": ["*"]}
    async with admin_api(db) as api:
        refused = await api.post(f"{base(tenant)}/endpoints", json=local, headers=AUTH)
        assert "url" in problem(refused, 422, "invalid-hook")["errors"]
    async with admin_api(db, hook_allow_http_localhost=True) as api:
        created = await create(api, tenant, **local)
        assert len(created["events"]) == 9
        remote = {"url": "http://hooks.acme.example/x", "events": ["sent"]}
        refused = await api.post(f"{base(tenant)}/endpoints", json=remote, headers=AUTH)
        problem(refused, 422, "invalid-hook")


async def test_update_disable_and_remove_an_endpoint(db):
    tenant, _ = new_tenant(db)
    async with admin_api(db) as api:
        created = await create(api, tenant)
        one = f"{base(tenant)}/endpoints/{created['id']}"
        changed = await api.patch(
            one,
            json={"url": "https://other.acme.example/h", "events": ["dead", "failed"]},
            headers=AUTH,
        )
        assert changed.status_code == 200, changed.text
        assert changed.json()["url"] == "https://other.acme.example/h"
        assert changed.json()["events"] == ["message.dead", "message.failed"]
        assert "secret" not in changed.json()
        off = await api.patch(one, json={"enabled": False}, headers=AUTH)
        assert off.json()["enabled"] is False
        assert off.json()["url"] == "https://other.acme.example/h"  # the rest stays
        assert off.json()["description"] is None
        noted = await api.patch(one, json={"description": "billing"}, headers=AUTH)
        assert noted.json()["description"] == "billing" and noted.json()["enabled"] is False
        cleared = await api.patch(one, json={"description": ""}, headers=AUTH)
        assert cleared.json()["description"] is None
        bad = await api.patch(one, json={"url": "http://x.example"}, headers=AUTH)
        assert "url" in problem(bad, 422, "invalid-hook")["errors"]
        bad = await api.patch(one, json={"events": ["nope"]}, headers=AUTH)
        problem(bad, 422, "invalid-hook")
        bad = await api.patch(one, json={"colour": "red"}, headers=AUTH)
        problem(bad, 422, "validation-error")
        assert (await api.get(one, headers=AUTH)).json()["enabled"] is False

        removed = await api.delete(one, headers=AUTH)
        assert removed.status_code == 200 and removed.json() == {"removed": True}
        problem(await api.get(one, headers=AUTH), 404, "not-found")
        problem(await api.delete(one, headers=AUTH), 404, "not-found")
        missing = f"{base(tenant)}/endpoints/{uuid.uuid4()}"
        problem(await api.patch(missing, json={"enabled": True}, headers=AUTH), 404, "not-found")
        problem(
            await api.get(f"{base(tenant)}/endpoints/not-a-uuid", headers=AUTH),
            422,
            "validation-error",
        )


# --- deliveries -----------------------------------------------------------------------


async def test_deliveries_are_listed_filtered_and_paged_newest_first(db):
    tenant, _ = new_tenant(db)
    async with admin_api(db) as api:
        sent_only = await create(api, tenant, events=["sent"])
        both = await create(api, tenant, events=["sent", "failed"])
        messages = sent_and_failed(db, tenant, n_sent=2, n_failed=1)
        listing = f"{base(tenant)}/deliveries"

        everything = await api.get(listing, headers=AUTH)
        assert everything.status_code == 200, everything.text
        items = everything.json()["items"]
        assert len(items) == 5 and everything.json()["next_cursor"] is None
        assert all(d["status"] == "pending" and d["attempts"] == 0 for d in items)
        assert all(d["next_attempt_at"] is not None for d in items)
        assert {d["message_id"] for d in items} == {str(m.id) for m in messages}
        assert "payload" not in items[0] and "secret" not in everything.text

        failed = await api.get(listing, params={"event": "failed"}, headers=AUTH)
        assert [d["endpoint_id"] for d in failed.json()["items"]] == [both["id"]]
        assert failed.json()["items"][0]["url"] == URL
        long_name = await api.get(listing, params={"event": "message.failed"}, headers=AUTH)
        assert long_name.json()["items"] == failed.json()["items"]
        of_one = await api.get(listing, params={"endpoint_id": sent_only["id"]}, headers=AUTH)
        assert {d["event"] for d in of_one.json()["items"]} == {"message.sent"}
        assert len(of_one.json()["items"]) == 2
        of_message = await api.get(
            listing, params={"message_id": str(messages[0].id)}, headers=AUTH
        )
        assert len(of_message.json()["items"]) == 2
        none_dead = await api.get(listing, params={"status": "dead"}, headers=AUTH)
        assert none_dead.json() == {"items": [], "next_cursor": None}

        seen: list[str] = []
        cursor = None
        while True:
            params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = (await api.get(listing, params=params, headers=AUTH)).json()
            seen += [d["id"] for d in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [d["id"] for d in items]  # the same order, each once

        problem(
            await api.get(listing, params={"cursor": "bogus!"}, headers=AUTH), 400, "invalid-cursor"
        )
        problem(
            await api.get(listing, params={"event": "sendt"}, headers=AUTH), 422, "invalid-hook"
        )
        problem(await api.get(listing, params={"event": "*"}, headers=AUTH), 422, "invalid-hook")
        problem(
            await api.get(listing, params={"status": "lost"}, headers=AUTH), 422, "validation-error"
        )
        problem(await api.get(listing, params={"limit": 0}, headers=AUTH), 422, "validation-error")

        other, _ = new_tenant(db, "globex")
        theirs = await api.get(f"{base(other)}/deliveries", headers=AUTH)
        assert theirs.json()["items"] == []


async def test_a_delivery_shows_its_body_and_history_and_an_operator_replays_a_dead_one(db):
    tenant, _ = new_tenant(db)
    async with admin_api(db) as api:
        await create(api, tenant, events=["sent"])
        (message,) = sent_and_failed(db, tenant, n_sent=1)
        listing = f"{base(tenant)}/deliveries"
        (pending,) = (await api.get(listing, headers=AUTH)).json()["items"]
        one = f"{listing}/{pending['id']}"

        early = await api.post(f"{one}/replay", headers=AUTH)
        assert "pending" in problem(early, 409, "not-replayable")["detail"]

        assert settle_all(db) == 1
        dead = (await api.get(one, headers=AUTH)).json()
        assert dead["status"] == "dead" and dead["attempts"] == 1
        assert dead["last_status_code"] == 410 and dead["last_error"] == "HTTP 410"
        assert dead["next_attempt_at"] is None
        assert dead["payload"]["type"] == "message.sent"
        assert dead["payload"]["data"]["message_id"] == str(message.id)
        moves = [(h["from_status"], h["to_status"]) for h in dead["history"]]
        assert moves[-2:] == [("pending", "processing"), ("processing", "dead")]
        assert dead["history"][-1]["status_code"] == 410

        replayed = await api.post(f"{one}/replay", headers=AUTH)
        assert replayed.status_code == 202, replayed.text
        again = replayed.json()
        assert again["status"] == "pending" and again["webhook_id"] == pending["webhook_id"]
        assert again["max_attempts"] > again["attempts"] == 1
        detail = (await api.get(one, headers=AUTH)).json()
        last = detail["history"][-1]
        assert (last["from_status"], last["to_status"], last["actor"]) == (
            "dead",
            "pending",
            "operator:api",
        )
        problem(await api.post(f"{one}/replay", headers=AUTH), 409, "not-replayable")

        missing = f"{listing}/{uuid.uuid4()}"
        problem(await api.get(missing, headers=AUTH), 404, "not-found")
        problem(await api.post(f"{missing}/replay", headers=AUTH), 404, "not-found")
        other, _ = new_tenant(db, "globex")
        foreign = f"{base(other)}/deliveries/{pending['id']}"
        problem(await api.get(foreign, headers=AUTH), 404, "not-found")
        problem(await api.post(f"{foreign}/replay", headers=AUTH), 404, "not-found")


async def test_the_hook_routes_are_documented_with_their_bodies(db):
    async with admin_api(db) as api:
        schema = (await api.get("/openapi.json")).json()
    paths = schema["paths"]
    created = paths["/v1/admin/tenants/{tenant}/hooks/endpoints"]["post"]["responses"]
    assert created["201"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/EndpointWithSecret"
    )
    assert {"401", "404", "422"} <= set(created)
    replay = paths["/v1/admin/tenants/{tenant}/hooks/deliveries/{delivery_id}/replay"]["post"]
    assert "202" in replay["responses"] and "409" in replay["responses"]
    components = schema["components"]["schemas"]
    assert "secret" in components["EndpointWithSecret"]["properties"]
    assert "secret" not in components["EndpointOut"]["properties"]
    assert components["EndpointIn"]["examples"][0]["url"].startswith("https://")
