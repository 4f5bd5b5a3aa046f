"""`/v1/templates`: a tenant's own templates (`Authorization: Bearer <tenant API key>`).

    PUT  /v1/templates/{name}/{locale}                 publish a new version, current at once
    GET  /v1/templates                                  the tenant's templates and locales
    GET  /v1/templates/{name}/{locale}                  its versions, oldest first
    GET  /v1/templates/{name}/{locale}/{version}        one version, every field
    POST /v1/templates/{name}/{locale}/rollback         make an older version current again

A PUT whose fields are those of the current version publishes nothing and answers that
version (200): retrying a PUT is safe. Messages already enqueued keep the version they
were pinned to.

Errors, as problem+json:
    404 not-found          no such template, locale or version of this tenant's
    413 template-too-large a part or the sample data over its size limit
    422 invalid-template   a name, locale or field the rules refuse (`errors` by field)
    422 template-problems  it does not compile or render with its sample data (`problems`:
                           part, line, message each); nothing is published
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, Field

from mailbag.api.deps import ServicesDep, TenantDep
from mailbag.api.problems import COMMON, documented
from mailbag.api.schemas import Strict
from mailbag.domain.templates import FORMATS, LOCALE_MAX, TEMPLATE_NAME_MAX

router = APIRouter(prefix="/v1/templates", tags=["templates"])

NamePath = Annotated[str, Path(max_length=TEMPLATE_NAME_MAX, description="The template's name.")]
LocalePath = Annotated[
    str, Path(max_length=LOCALE_MAX, description="BCP 47 locale: `en`, `fr-CA`, ...")
]
VersionPath = Annotated[int, Path(ge=1, le=2**31 - 1, description="A version number.")]


class TemplateIn(Strict):
    subject: str = Field(description="Jinja: the subject line.", examples=["Welcome, {{ name }}"])
    html: str = Field("", description="Jinja (or MJML with `format`): the HTML part.")
    text: str = Field("", description="Jinja: the text part; empty: made from the HTML.")
    sample_data: dict[str, Any] = Field(
        default_factory=dict,
        description="Data it must render with to be published; the console previews with it.",
        examples=[{"name": "Ada"}],
    )
    format: Literal["jinja", "mjml"] = Field("jinja", description=f"One of {', '.join(FORMATS)}.")


class Rollback(Strict):
    version: int = Field(ge=1, le=2**31 - 1, description="The version to make current.")


class VersionOut(BaseModel):
    name: str
    locale: str
    version: int
    current: bool | None = Field(None, description="Whether it is the current version.")
    format: str
    subject: str
    html: str
    text: str
    sample_data: dict[str, Any]
    dependencies: dict[str, int] = Field(
        description="The templates it extends or includes, by name: the version id of each."
    )
    changed_by: str
    created_at: datetime


class VersionSummary(BaseModel):
    version: int
    current: bool
    changed_by: str
    created_at: datetime


class LocaleOut(BaseModel):
    locale: str
    current_version: int
    latest_version: int
    updated_at: datetime


class TemplateOut(BaseModel):
    name: str
    default_locale: str
    locales: list[LocaleOut]


class TemplateList(BaseModel):
    templates: list[TemplateOut]


class VersionList(BaseModel):
    name: str
    locale: str
    versions: list[VersionSummary]


def actor(tenant_id: str) -> str:
    return f"api:{tenant_id}"


@router.put(
    "/{name}/{locale}",
    status_code=201,
    response_model=VersionOut,
    responses=documented(*COMMON, 200, 404),
)
async def publish(
    name: NamePath,
    locale: LocalePath,
    body: TemplateIn,
    svc: ServicesDep,
    tenant: TenantDep,
    response: Response,
) -> Any:
    """Publish a new version of the template in this locale and make it current: 201 with
    its `version`. It must compile and render with its `sample_data` (else 422, with each
    problem's part and line, and nothing published). The same fields as the current
    version: 200 with that version, nothing published."""
    published = await svc.templates.publish(
        tenant=tenant.id,
        name=name,
        locale=locale,
        fields=body.model_dump(),
        changed_by=actor(tenant.id),
        now=svc.clock(),
    )
    if not published.created:
        response.status_code = 200
    return published.version.as_json(published.version.version)


@router.get("", response_model=TemplateList, responses=documented(*COMMON))
async def listing(svc: ServicesDep, tenant: TenantDep) -> Any:
    """The tenant's templates, each with its locales and their current versions."""
    return {"templates": [t.as_json() for t in await svc.templates.listing(tenant=tenant.id)]}


@router.get("/{name}/{locale}", response_model=VersionList, responses=documented(*COMMON, 404))
async def versions(name: NamePath, locale: LocalePath, svc: ServicesDep, tenant: TenantDep) -> Any:
    """Every version of the template in this locale, oldest first."""
    found = await svc.templates.versions(tenant=tenant.id, name=name, locale=locale)
    current = await svc.templates.current_number(tenant=tenant.id, name=name, locale=locale)
    return {
        "name": found[0].name,
        "locale": found[0].locale,
        "versions": [
            {
                "version": v.version,
                "current": v.version == current,
                "changed_by": v.changed_by,
                "created_at": v.created_at,
            }
            for v in found
        ],
    }


@router.get(
    "/{name}/{locale}/{version}", response_model=VersionOut, responses=documented(*COMMON, 404)
)
async def version(
    name: NamePath, locale: LocalePath, version: VersionPath, svc: ServicesDep, tenant: TenantDep
) -> Any:
    """One version, as it was published (versions never change)."""
    found = await svc.templates.version(tenant=tenant.id, name=name, locale=locale, version=version)
    current = await svc.templates.current_number(tenant=tenant.id, name=name, locale=locale)
    return found.as_json(current)


@router.post(
    "/{name}/{locale}/rollback", response_model=VersionOut, responses=documented(*COMMON, 404)
)
async def rollback(
    name: NamePath, locale: LocalePath, body: Rollback, svc: ServicesDep, tenant: TenantDep
) -> Any:
    """Make an existing version current again; messages enqueued from now on use it."""
    found = await svc.templates.rollback(
        tenant=tenant.id, name=name, locale=locale, version=body.version, now=svc.clock()
    )
    return found.as_json(found.version)
