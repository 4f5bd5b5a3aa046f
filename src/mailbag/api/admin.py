"""`/v1/admin/...`: the console's actions for scripts, with `Authorization: Bearer <ADMIN_TOKEN>`.

Off (404) unless ADMIN_TOKEN is set. Actions are recorded with the actor `operator:api`.
Every `tenant_id` (query, path or body) takes a tenant's id or its name; one that names no
tenant is a 404 and changes nothing (services/tenants.py resolves it).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field

from mailbag import log
from mailbag.api.deps import NowDep, ServicesDep, bearer
from mailbag.api.problems import COMMON, documented, not_found, too_many_attempts, unauthorized
from mailbag.api.schemas import Strict  # no unknown fields, nothing a database refuses
from mailbag.domain.erasure import State
from mailbag.domain.message import TENANT_ID_MAX, Filter, InvalidMessage
from mailbag.domain.states import Status
from mailbag.keys import secret_matches
from mailbag.services import maintenance
from mailbag.services.container import Services
from mailbag.services.erasure import Erasures, describe, erasure_key
from mailbag.services.messages import (
    MessageNotFound,
    decode_cursor,
    encode_cursor,
    public,
)
from mailbag.services.operations import NotAllowed
from mailbag.services.pauses import REASON_MAX, Pauses, age_seconds
from mailbag.services.reconciliation import Reconciler
from mailbag.services.sender_domains import SenderDomains
from mailbag.services.tenant_accounts import TenantAccounts
from mailbag.services.tenants import Senders, resolve_async
from mailbag.store.fleet_state import Pause, Scope
from mailbag.store.senders import SenderIdentity
from mailbag.web import client_address

ACTOR = "operator:api"


async def admin(
    request: Request,
    svc: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    token = svc.settings.admin_token
    if token is None:
        raise not_found("the admin API is not enabled")
    client = client_address(request)
    wait = svc.admin_token_failures.retry_after(client)
    if wait is not None:
        raise too_many_attempts(wait)
    offered = credentials.credentials if credentials else None
    if not secret_matches(offered, token):
        if offered:  # a guess; a request without any token guesses nothing
            svc.admin_token_failures.failed(client)
            log.get("mailbag.api").warning("admin_token_rejected", client=client)
        raise unauthorized("send the admin token", 'Bearer realm="mailbag admin"')


router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(admin)])
RESPONSES = documented(*COMMON, 404, 429)
ACTION_RESPONSES = documented(*COMMON, 404, 409, 429)
TENANT = "A tenant's id or its name (404 if it names none)."


async def tenant_query(
    svc: ServicesDep,
    tenant_id: Annotated[
        str | None, Query(max_length=TENANT_ID_MAX, description=f"Only this tenant's. {TENANT}")
    ] = None,
) -> str | None:
    """The id of the tenant a query names; every tenant's when none is named."""
    return await resolve_async(svc.engine, tenant_id)


TenantQuery = Annotated[str | None, Depends(tenant_query)]
TenantName = Annotated[str, Path(max_length=TENANT_ID_MAX, description=TENANT)]
DomainName = Annotated[str, Path(max_length=253, description="A sender domain.")]


class Resolution(Strict):
    sent: bool = Field(description="True: the provider accepted it; false: it did not.")
    evidence: str = Field(min_length=1, max_length=2000, description="What shows it.")
    provider_message_id: str | None = Field(None, max_length=255)


class BulkRequeue(Strict):
    status: Status = Status.UNKNOWN
    tenant_id: str | None = Field(None, max_length=TENANT_ID_MAX, description=TENANT)
    to: str | None = Field(None, max_length=255)
    template: str | None = Field(None, max_length=100)
    created_from: datetime | None = None
    created_to: datetime | None = None


class SuppressionIn(Strict):
    tenant_id: str = Field(min_length=1, max_length=TENANT_ID_MAX, description=TENANT)
    email: str = Field(max_length=255)
    detail: str | None = Field(None, max_length=2000)


def _single(changed: Any) -> dict[str, Any]:
    return public(changed.message)


@router.get("/stats", responses=RESPONSES)
async def stats(svc: ServicesDep, now: NowDep) -> dict[str, Any]:
    """Counts by state, the oldest due message's age, sends per 5 minutes, error rate."""
    return (await svc.operations.health(now)).as_dict()


@router.get("/messages", responses=RESPONSES)
async def messages(
    svc: ServicesDep,
    tenant_id: TenantQuery,
    status: Status | None = None,
    to: Annotated[str | None, Query(max_length=255)] = None,
    template: Annotated[str | None, Query(max_length=100)] = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(max_length=100)] = None,
) -> dict[str, Any]:
    """Messages of every tenant, newest first, filtered."""
    where = Filter(status, tenant_id, to, template, created_from, created_to)
    before = decode_cursor(cursor) if cursor else None
    found, more = await svc.operations.messages(where, limit=limit, before=before)
    return {
        "items": [public(m) for m in found],
        "next_cursor": encode_cursor(found[-1].id) if more and found else None,
    }


@router.get("/messages/{message_id}", responses=RESPONSES)
async def message(message_id: uuid.UUID, svc: ServicesDep) -> dict[str, Any]:
    """A message with its transitions and the provider events matched to it."""
    found = await svc.operations.message(message_id)
    if found is None:
        raise MessageNotFound
    row, history, provider_events = found
    body = public(row, history)
    body["tenant_id"] = row.tenant_id
    body["provider_events"] = [
        {
            "provider": e.provider,
            "kind": e.kind,
            "bounce_type": e.bounce_type,
            "occurred_at": e.occurred_at.isoformat(),
            "detail": e.detail,
            "provider_message_id": e.provider_message_id,
        }
        for e in provider_events
    ]
    return body


@router.post("/messages/{message_id}/requeue", responses=ACTION_RESPONSES)
async def requeue(message_id: uuid.UUID, svc: ServicesDep, now: NowDep) -> dict[str, Any]:
    """Send an unknown or dead message again."""
    changed = await svc.operations.requeue(message_ids=[message_id], now=now, actor=ACTOR)
    if not changed:
        raise NotAllowed("only unknown or dead messages can be requeued")
    return _single(changed[0])


@router.post("/messages/{message_id}/cancel", responses=ACTION_RESPONSES)
async def cancel(message_id: uuid.UUID, svc: ServicesDep, now: NowDep) -> dict[str, Any]:
    return _single(await svc.operations.cancel(message_id=message_id, now=now, actor=ACTOR))


@router.post("/messages/{message_id}/resolve", responses=ACTION_RESPONSES)
async def resolve(
    message_id: uuid.UUID, body: Resolution, svc: ServicesDep, now: NowDep
) -> dict[str, Any]:
    """Mark an unknown message as sent or failed, from evidence."""
    return _single(
        await svc.operations.resolve(
            message_id=message_id,
            sent=body.sent,
            evidence=body.evidence,
            now=now,
            actor=ACTOR,
            provider_message_id=body.provider_message_id,
        )
    )


@router.post("/requeue", responses=RESPONSES)
async def bulk_requeue(body: BulkRequeue, svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """Requeue every unknown (or dead) message a filter matches."""
    if body.status not in (Status.UNKNOWN, Status.DEAD):
        raise InvalidMessage({"status": "only unknown or dead messages can be requeued"})
    tenant_id = await resolve_async(svc.engine, body.tenant_id)
    where = Filter(
        body.status, tenant_id, body.to, body.template, body.created_from, body.created_to
    )
    changed = await svc.operations.requeue(where=where, now=now, actor=ACTOR)
    return {"requeued": len(changed)}


@router.post("/reconcile", responses=RESPONSES)
async def reconcile(svc: ServicesDep, now: NowDep) -> dict[str, int]:
    """Look for evidence about every unknown message now (the worker does this regularly)."""
    reconciler = Reconciler(svc.engine)
    return dict(await reconciler.run_once(now))


@router.get("/suppressions", responses=RESPONSES)
async def suppressions(
    svc: ServicesDep,
    tenant_id: TenantQuery,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> list[dict[str, Any]]:
    found = await svc.operations.suppressions(tenant_id=tenant_id, limit=limit, offset=offset)
    return [
        {
            "tenant_id": s.tenant_id,
            "email": s.email,
            "reason": s.reason,
            "detail": s.detail,
            "created_at": s.created_at.isoformat(),
        }
        for s in found
    ]


@router.post("/suppressions", status_code=201, responses=RESPONSES)
async def add_suppression(body: SuppressionIn, svc: ServicesDep, now: NowDep) -> dict[str, bool]:
    tenant_id = await resolve_async(svc.engine, body.tenant_id)
    try:
        added = await svc.operations.suppress(
            tenant_id=tenant_id, email=body.email, now=now, detail=body.detail
        )
    except ValueError as exc:
        raise InvalidMessage({"email": str(exc)}) from None
    return {"added": added}


@router.delete("/suppressions/{tenant_id}/{email}", responses=RESPONSES)
async def remove_suppression(
    tenant_id: TenantName,
    email: str,
    svc: ServicesDep,
) -> dict[str, bool]:
    owner = await resolve_async(svc.engine, tenant_id)
    if not await svc.operations.unsuppress(tenant_id=owner, email=email):
        raise not_found("no such suppression")
    return {"removed": True}


# --- a tenant's own provider account (services/tenant_accounts.py) ----------------------

AccountValue = str | int | float | bool
ACCOUNT_RESPONSES = documented(*COMMON, 404, 409, 429)


class AccountIn(Strict):
    kind: str = Field(
        min_length=1,
        max_length=100,
        description="A provider's name: postmark, sendgrid, mailgun, resend, brevo, ses, smtp...",
        examples=["postmark"],
    )
    settings: dict[Annotated[str, Field(max_length=64)], AccountValue] = Field(
        default_factory=dict,
        max_length=50,
        description="That provider's settings without MAILBAG_<KIND>_, as a [providers.NAME] "
        "table has them (`api_key` for POSTMARK_API_KEY). Stored sealed, never shown again.",
        examples=[{"api_key": "server-token", "message_stream": "outbound"}],
    )


class AccountOut(BaseModel):
    tenant_id: str
    kind: str
    keys: list[str] = Field(description="Every setting the account sets.")
    secret_keys: list[str] = Field(description="Those of them whose values are never shown.")
    settings: dict[str, AccountValue] = Field(description="The values of the others.")
    created_at: datetime
    updated_at: datetime
    updated_by: str = Field(description="Who set it last: operator:api, operator:cli, ...")


@router.get("/tenants/{tenant_id}/account", response_model=AccountOut, responses=ACCOUNT_RESPONSES)
async def account(tenant_id: TenantName, svc: ServicesDep) -> dict[str, Any]:
    """A tenant's own provider account: its kind and which settings it sets (the values of
    secrets never). 404 if it has none."""
    return (await TenantAccounts(svc.engine, svc.settings).show(tenant_id)).as_dict()


@router.put(
    "/tenants/{tenant_id}/account",
    response_model=AccountOut,
    responses={
        201: {"model": AccountOut, "description": "The tenant had no own account."},
        **ACCOUNT_RESPONSES,
    },
)
async def set_account(
    tenant_id: TenantName, body: AccountIn, response: Response, svc: ServicesDep, now: NowDep
) -> dict[str, Any]:
    """Give a tenant its own provider account, or replace the one it has with exactly this
    one: routes that name `tenant` send its mail through it. 201 when it had none. A kind
    or setting the provider has not, or a value it refuses, is a 422 naming the key."""
    accounts = TenantAccounts(svc.engine, svc.settings)
    shown, created = await accounts.put(tenant_id, body.kind, body.settings, now=now, actor=ACTOR)
    if created:
        response.status_code = 201
    return shown.as_dict()


@router.delete("/tenants/{tenant_id}/account", responses=ACCOUNT_RESPONSES)
async def remove_account(tenant_id: TenantName, svc: ServicesDep) -> dict[str, bool]:
    """Take a tenant's own account away (404 if it has none)."""
    await TenantAccounts(svc.engine, svc.settings).remove(tenant_id)
    return {"removed": True}


# --- sender domains and their DKIM keys (services/sender_domains.py) --------------------

DOMAIN_RESPONSES = documented(*COMMON, 404, 409, 422, 429)
PEM_MAX = 16_384


class DomainIn(Strict):
    domain: str = Field(min_length=1, max_length=253, examples=["acme.example"])
    selector: str | None = Field(
        None, max_length=63, description="One DNS label; default mbYYYYMMDD.", examples=["s1"]
    )
    algorithm: str = Field("rsa", max_length=20, description="rsa (2048 bits) or ed25519.")
    private_key: str | None = Field(
        None,
        max_length=PEM_MAX,
        description="A PEM private key to use instead of a new one; stored sealed, never shown.",
    )


class RotationIn(Strict):
    selector: str | None = Field(None, max_length=63, description="The next key's selector.")
    algorithm: str | None = Field(None, max_length=20, description="Default: the signing key's.")
    private_key: str | None = Field(None, max_length=PEM_MAX, description="As when adding.")


class DnsRecord(BaseModel):
    type: str
    name: str
    value: str


class DomainOut(BaseModel):
    tenant_id: str
    domain: str
    state: str = Field(description="ready, not ready, or unchecked (never checked).")
    ready: bool | None
    checked_at: datetime | None
    ready_since: datetime | None = Field(description="Since when it has been as it is.")
    keys: list[dict[str, str]] = Field(description="selector, algorithm, state of each key.")
    records: list[DnsRecord] = Field(description="What to publish in DNS.")
    findings: list[dict[str, Any]] = Field(description="What the last check found, by record.")
    created_at: datetime


def _domains(svc: Services) -> SenderDomains:
    return SenderDomains(svc.engine, svc.settings)


def _pem(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


@router.get(
    "/tenants/{tenant_id}/domains", response_model=list[DomainOut], responses=DOMAIN_RESPONSES
)
async def domains(tenant_id: TenantName, svc: ServicesDep) -> list[dict[str, Any]]:
    """A tenant's sender domains, with the records to publish and the last check."""
    return [d.as_dict() for d in await _domains(svc).listing(tenant_id)]


@router.post(
    "/tenants/{tenant_id}/domains",
    status_code=201,
    response_model=DomainOut,
    responses=DOMAIN_RESPONSES,
)
async def add_domain(
    tenant_id: TenantName, body: DomainIn, svc: ServicesDep, now: NowDep
) -> dict[str, Any]:
    """Add a sender domain with a new DKIM key (or `private_key`); its mail is signed from
    now. The answer's `records` are what to publish; then POST .../check."""
    shown = await _domains(svc).add(
        tenant_id,
        body.domain,
        now=now,
        actor=ACTOR,
        selector=body.selector,
        algorithm=body.algorithm,
        key_file=_pem(body.private_key),
    )
    return shown.as_dict()


@router.get(
    "/tenants/{tenant_id}/domains/{domain}", response_model=DomainOut, responses=DOMAIN_RESPONSES
)
async def domain(tenant_id: TenantName, domain: DomainName, svc: ServicesDep) -> dict[str, Any]:
    return (await _domains(svc).show(tenant_id, domain)).as_dict()


@router.post(
    "/tenants/{tenant_id}/domains/{domain}/check",
    response_model=DomainOut,
    responses=DOMAIN_RESPONSES,
)
async def check_domain(
    tenant_id: TenantName, domain: DomainName, svc: ServicesDep, now: NowDep
) -> dict[str, Any]:
    """Ask DNS now for every record and keep what it found (200 whether ready or not:
    `ready` says)."""
    return (await _domains(svc).check(tenant_id, domain, now=now)).as_dict()


@router.post(
    "/tenants/{tenant_id}/domains/{domain}/rotate",
    response_model=DomainOut,
    responses=DOMAIN_RESPONSES,
)
async def rotate_domain(
    tenant_id: TenantName, domain: DomainName, body: RotationIn, svc: ServicesDep, now: NowDep
) -> dict[str, Any]:
    """A rotation's first step: a next key to publish beside the signing one."""
    shown = await _domains(svc).rotate(
        tenant_id,
        domain,
        now=now,
        selector=body.selector,
        algorithm=body.algorithm,
        key_file=_pem(body.private_key),
    )
    return shown.as_dict()


@router.post(
    "/tenants/{tenant_id}/domains/{domain}/rotate/finish",
    response_model=DomainOut,
    responses=DOMAIN_RESPONSES,
)
async def finish_rotation(
    tenant_id: TenantName, domain: DomainName, svc: ServicesDep, now: NowDep
) -> dict[str, Any]:
    """A rotation's last step, once DNS publishes the next key (409 until it does): it
    signs from now, the old one is retired."""
    return (await _domains(svc).finish_rotation(tenant_id, domain, now=now)).as_dict()


@router.delete("/tenants/{tenant_id}/domains/{domain}", responses=DOMAIN_RESPONSES)
async def remove_domain(
    tenant_id: TenantName,
    domain: DomainName,
    svc: ServicesDep,
    selector: Annotated[str | None, Query(max_length=63)] = None,
) -> dict[str, bool]:
    """Remove a sender domain and its keys, or with `selector` one key that does not sign."""
    await _domains(svc).remove(tenant_id, domain, selector=selector)
    return {"removed": True}


class SenderIn(Strict):
    address: str = Field(
        max_length=255, description="A From address.", examples=["billing@acme.example"]
    )
    name: str | None = Field(
        None, max_length=255, description="Its display name.", examples=["Acme Billing"]
    )


def _sender(s: SenderIdentity) -> dict[str, Any]:
    return {"address": s.address, "name": s.name, "created_at": s.created_at.isoformat()}


@router.get("/tenants/{tenant_id}/senders", responses=RESPONSES)
async def senders(tenant_id: TenantName, svc: ServicesDep) -> list[dict[str, Any]]:
    """The addresses a tenant (by id or name) may send from, besides FROM_EMAIL."""
    return [_sender(s) for s in await Senders(svc.engine).listing(tenant_id)]


@router.post("/tenants/{tenant_id}/senders", status_code=201, responses=RESPONSES)
async def add_sender(
    tenant_id: TenantName, body: SenderIn, svc: ServicesDep, now: NowDep
) -> dict[str, Any]:
    """Let a tenant send from an address (`from` in its messages). `added` is false when it
    already could."""
    found, added = await Senders(svc.engine).add(tenant_id, body.address, body.name, now)
    return {"tenant_id": found, "added": added}


@router.delete("/tenants/{tenant_id}/senders/{address}", responses=RESPONSES)
async def remove_sender(tenant_id: TenantName, address: str, svc: ServicesDep) -> dict[str, bool]:
    """Stop a tenant sending from an address; messages already enqueued keep it."""
    if not await Senders(svc.engine).remove(tenant_id, address):
        raise not_found(f"{address} is not a sender identity of {tenant_id}")
    return {"removed": True}


# --- pauses: the fleet, a provider or a tenant (services/pauses.py) ---------------------------


class PauseIn(Strict):
    scope: Scope = Field(description="What to pause: the whole fleet, a provider or a tenant.")
    target: str | None = Field(
        None,
        max_length=200,
        description="The provider's name or the tenant's id or name; none for the fleet.",
        examples=["brevo"],
    )
    reason: str | None = Field(
        None, max_length=REASON_MAX, description="Why, for the other operators."
    )


class PauseOut(BaseModel):
    scope: Scope
    target: str = Field(description="The provider's name or the tenant's id; '' for the fleet.")
    paused_at: datetime
    paused_by: str = Field(description="Who paused it: operator:api, operator:cli, ...")
    reason: str | None
    age_seconds: float = Field(description="How long it has lasted.")


def _pause(p: Pause, now: datetime) -> PauseOut:
    return PauseOut(
        scope=p.scope,
        target=p.target,
        paused_at=p.paused_at,
        paused_by=p.paused_by,
        reason=p.reason,
        age_seconds=age_seconds(p, now),
    )


@router.get("/pauses", response_model=list[PauseOut], responses=RESPONSES)
async def pauses(svc: ServicesDep, now: NowDep) -> list[PauseOut]:
    """What is paused, oldest first. Workers see each pause within a poll interval."""
    return [_pause(p, now) for p in await Pauses(svc.engine).listing()]


@router.post(
    "/pauses",
    status_code=201,
    response_model=PauseOut,
    responses={
        200: {"model": PauseOut, "description": "Paused already: the pause in force, as it was."},
        **documented(*COMMON, 404, 429),
    },
)
async def pause(body: PauseIn, response: Response, svc: ServicesDep, now: NowDep) -> PauseOut:
    """Pause sending, fleet-wide or for one provider or tenant: its mail waits, no attempt
    spent, until it is resumed. 201 for a new pause; 200 with the pause in force when it was
    paused already."""
    done = await Pauses(svc.engine).pause(
        body.scope, body.target, now=now, actor=ACTOR, reason=body.reason
    )
    if not done.new:
        response.status_code = 200
    return _pause(done.pause, now)


async def _resume(svc: ServicesDep, now: datetime, scope: Scope, target: str) -> PauseOut:
    return _pause(await Pauses(svc.engine).resume(scope, target), now)


@router.delete("/pauses/fleet", response_model=PauseOut, responses=RESPONSES)
async def resume_fleet(svc: ServicesDep, now: NowDep) -> PauseOut:
    """Resume the whole fleet: the pause that was lifted (404 if it was not paused)."""
    return await _resume(svc, now, Scope.FLEET, "")


@router.delete("/pauses/{scope}/{target}", response_model=PauseOut, responses=RESPONSES)
async def resume(
    scope: Scope,
    target: Annotated[str, Path(max_length=200, description="A provider's name or a tenant's.")],
    svc: ServicesDep,
    now: NowDep,
) -> PauseOut:
    """Resume a provider or a tenant: the pause that was lifted (404 if it was not paused)."""
    return await _resume(svc, now, scope, target)


# --- erasure of one person's data, and tenants' retention (services/erasure.py) --------


class ErasureIn(Strict):
    address: str = Field(min_length=1, max_length=320, description="The person's address.")
    tenant_id: str | None = Field(
        None, min_length=1, max_length=TENANT_ID_MAX, description=f"Only this tenant's. {TENANT}"
    )


ERASURE_RESPONSES = documented(*COMMON, 404, 409, 429)


@router.post("/erasures", status_code=201, responses=ERASURE_RESPONSES)
async def erase(body: ErasureIn, response: Response, svc: ServicesDep) -> dict[str, Any]:
    """Erase one person's data (every tenant's, or one tenant's): 201 when done; 202 when
    only messages a worker is sending right now remain: POST the same again once their lease
    ends, and the erasure resumes. The address stays suppressed by its keyed hash."""
    erasures = Erasures(svc.engine, erasure_key(svc.settings))
    outcome = await erasures.run(body.address, tenant=body.tenant_id, actor=ACTOR)
    if outcome.erasure.state != State.DONE:
        response.status_code = 202
    return describe(outcome.erasure, held=outcome.held)


@router.get("/erasures", responses=RESPONSES)
async def erasures(
    svc: ServicesDep, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> list[dict[str, Any]]:
    """Erasures, newest first (their scope and counts; never the address)."""
    found = await Erasures(svc.engine, None).listing(limit=limit)
    return [describe(e) for e in found]


@router.get("/erasures/{erasure_id}", responses=RESPONSES)
async def erasure(erasure_id: uuid.UUID, svc: ServicesDep) -> dict[str, Any]:
    found = await Erasures(svc.engine, None).get(erasure_id)
    if found is None:
        raise not_found("no such erasure")
    return describe(found)


class RetentionIn(Strict):
    purge_after_days: float | None = Field(
        description="Days a finished message of this tenant is kept (0: never purged); "
        "null: the PURGE_AFTER_DAYS setting's."
    )


@router.put("/tenants/{tenant_id}/retention", responses=RESPONSES)
async def set_retention(
    tenant_id: TenantName, body: RetentionIn, svc: ServicesDep, now: NowDep
) -> dict[str, Any]:
    """A tenant's own PURGE_AFTER_DAYS (null: back to the setting's)."""
    owner = await maintenance.set_retention(svc.engine, tenant_id, body.purge_after_days, now=now)
    return {"tenant_id": owner, "purge_after_days": body.purge_after_days}


@router.get("/retention", responses=RESPONSES)
async def retention(svc: ServicesDep) -> dict[str, Any]:
    """The setting's PURGE_AFTER_DAYS and each tenant's own."""
    return {
        "purge_after_days": svc.settings.purge_after_days,
        "tenants": await maintenance.retention(svc.engine),
    }
