"""`/v1/email-verifications`: request, read, confirm, resend."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Response

from mailbag.api.deps import KeyedCallDep, NowDep, ServicesDep, TenantDep
from mailbag.api.problems import COMMON, documented
from mailbag.api.replay import replayed
from mailbag.api.schemas import VerificationConfirm, VerificationCreate, VerificationOut
from mailbag.domain.message import InvalidMessage, normalize_address
from mailbag.domain.templates import locale_problem, normal_locale, template_name_problem
from mailbag.services import intake
from mailbag.services.verification import VerificationRequest, public

router = APIRouter(prefix="/v1/email-verifications", tags=["email verification"])


@router.post(
    "", status_code=201, response_model=VerificationOut, responses=documented(*COMMON, 409, 429)
)
async def request_verification(
    body: VerificationCreate, call: KeyedCallDep, response: Response
) -> Any:
    """Send a verification email. Needs an Idempotency-Key: a retry with the same key and
    body replays the first answer (no second email); a different body is a 409.

    If the address already has an active verification (created, send_pending or sent),
    a request under another key is a 409 whose `active_verification_id` names it: resend
    that one instead of starting a second."""
    svc = call.svc
    try:
        email = normalize_address(body.email, intake.address_rules(svc.settings))
    except ValueError as exc:
        raise InvalidMessage({"email": f"is not a valid email address: {exc}"}) from None
    if (problem := template_name_problem(body.template)) is not None:
        raise InvalidMessage({"template": problem})  # known or not: its email's pin says
    if body.locale is not None and (problem := locale_problem(body.locale)) is not None:
        raise InvalidMessage({"locale": problem})
    request = VerificationRequest(
        email=email,
        template=body.template,
        redirect_url=str(body.redirect_url) if body.redirect_url else None,
        data=body.data,
        locale=normal_locale(body.locale) if body.locale is not None else None,
    )
    result = await svc.verifications.request(
        tenant_id=call.tenant.id, key=call.key, request=request, now=call.now
    )
    return replayed(result, response, "POST /v1/email-verifications")


@router.get(
    "/{verification_id}", response_model=VerificationOut, responses=documented(*COMMON, 404)
)
async def get_verification(
    verification_id: uuid.UUID, svc: ServicesDep, tenant: TenantDep, now: NowDep
) -> Any:
    return public(
        await svc.verifications.get(tenant_id=tenant.id, verification_id=verification_id, now=now)
    )


@router.post(
    "/{verification_id}/confirm",
    response_model=VerificationOut,
    responses=documented(*COMMON, 404, 410, 423),
)
async def confirm_verification(
    verification_id: uuid.UUID,
    body: VerificationConfirm,
    svc: ServicesDep,
    tenant: TenantDep,
    now: NowDep,
) -> Any:
    """Confirm with the token from the email: 200 `verified` (again 200 if already
    verified); a wrong token is 400 and counts (after 5 the verification is locked: 423);
    an expired one is 410."""
    return public(
        await svc.verifications.confirm(
            tenant_id=tenant.id, verification_id=verification_id, token=body.token, now=now
        )
    )


@router.post(
    "/{verification_id}/resend",
    response_model=VerificationOut,
    responses=documented(*COMMON, 404, 409, 410, 429),
)
async def resend_verification(
    verification_id: uuid.UUID, call: KeyedCallDep, response: Response
) -> Any:
    """Rotate the token (the old one stops working) and send a new email; rate limited."""
    result = await call.svc.verifications.resend(
        tenant_id=call.tenant.id, key=call.key, verification_id=verification_id, now=call.now
    )
    return replayed(result, response, "POST /v1/email-verifications/{id}/resend")
