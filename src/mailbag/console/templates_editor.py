"""Tenants' templates in the console: each tenant's list, and a page per template and locale
with its editor (preview, publish) and its versions (diff, rollback).

    GET  /admin/templates                                    whose templates (a tenant picker)
    GET  /admin/tenants/{tenant}/templates                   a tenant's templates; a new one
    GET  /admin/tenants/{tenant}/templates/new?name=&locale= -> the page of that one
    GET  /admin/tenants/{tenant}/templates/{name}/{locale}   the editor and the versions
    POST .../preview   the draft rendered with its sample data, nothing written, form kept
    POST .../live      the same as JSON, for the page's one script (a preview as one types)
    POST .../publish   a new version, current at once; problems: the form kept (422)
    GET  .../diff?old=&new=  a unified diff of two versions
    POST .../rollback  (version; then confirm=yes) an older version current again
    GET  /admin/static/template-editor.js

Every POST carries the session's CSRF token (routes.py). A preview is shown as the message
page shows one: a `sandbox` srcdoc frame (no scripts, an opaque origin) under the console's
policy. The editor page alone also runs one script, from the console itself
(`script-src 'self'`); its frames stay without allow-scripts, and the page works without it.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import structlog
from starlette.responses import JSONResponse, Response

from mailbag.console import render
from mailbag.console.actions import confirm
from mailbag.console.context import ACTOR, Console, ConsoleError
from mailbag.console.tenants import path_tenant_id
from mailbag.console.views import NO_SUCH_TENANT, template_url
from mailbag.domain.message import TENANT_ID_MAX
from mailbag.domain.templates import (
    FORMATS,
    SAMPLE_DATA_MAX_BYTES,
    SUBJECT_SOURCE_MAX,
    InvalidTemplate,
    Locale,
    Template,
    TemplateTooLarge,
    Version,
    locale_problem,
    normal_locale,
    template_name_problem,
)
from mailbag.services.templates import Preview, Templates, UnknownTemplate
from mailbag.services.tenants import UnknownTenant
from mailbag.store.session import Conflict
from mailbag.templates import Rendered, TemplateError

log = structlog.get_logger("mailbag.console")

FIELDS = ("subject", "html", "text", "sample_data", "format")
VERSION_MAX = 2**31 - 1
SCRIPT_PATH = "/admin/static/template-editor.js"
SCRIPT = (Path(render.TEMPLATES) / "static" / "template-editor.js").read_bytes()
# The console's policy, and on the editor page its one script and what that script posts.
# The preview frames inherit it, and their sandbox (no allow-scripts) runs nothing anyway.
EDITOR_POLICY = f"{render.CONTENT_SECURITY_POLICY}; script-src 'self'; connect-src 'self'"
SCRIPT_HEADERS = {**render.SECURITY_HEADERS, "Cache-Control": "private, max-age=300"}


@dataclass(frozen=True)
class Shown:
    """A problem as the page lists it: the part (or the form's field), the line, what."""

    part: str
    line: int | None
    message: str


@dataclass(frozen=True)
class Where:
    """The template and locale of the page's path, its tenant resolved."""

    tenant_id: str
    name: str
    locale: str

    @property
    def url(self) -> str:
        return template_url(self.tenant_id, self.name, self.locale)


def templates_url(tenant_id: str) -> str:
    return f"/admin/tenants/{quote(tenant_id, safe='')}/templates"


def _service(c: Console) -> Templates:
    return c.services.templates


async def _where(c: Console) -> Where:
    """The page's template and locale: 404 for a name or locale no template can have."""
    tenant_id = await path_tenant_id(c)
    name, tag = c.request.path_params["name"], c.request.path_params["locale"]
    problem = template_name_problem(name)
    if problem is not None:
        raise ConsoleError(404, "No such template", f"A template's name {problem}.")
    problem = locale_problem(tag)
    if problem is not None:
        raise ConsoleError(404, "No such locale", f"The locale {problem}.")
    return Where(tenant_id, name, normal_locale(tag))


# --- the tenant picker and a tenant's templates -----------------------------------------


async def templates_tenants(c: Console) -> Response:
    """Whose templates: every tenant (and `default`), and the deployment's file templates."""
    typed = c.request.query_params.get("tenant", "").strip()
    error = ""
    if typed:
        try:
            owner = await c.tenant_id(typed[: TENANT_ID_MAX + 1])
        except UnknownTenant:
            error = NO_SUCH_TENANT
        else:
            return c.redirect(templates_url(owner))
    return c.page(
        "templates_tenants.html",
        status=400 if error else 200,
        typed=typed,
        error=error,
        files=sorted(c.services.catalog.names()),
    )


async def templates_index(c: Console) -> Response:
    tenant_id = await path_tenant_id(c)
    return await _index(c, tenant_id)


async def _index(
    c: Console,
    tenant_id: str,
    *,
    status: int = 200,
    errors: Mapping[str, str] | None = None,
    typed: Mapping[str, str] | None = None,
) -> Response:
    found = await _service(c).listing(tenant=tenant_id)
    return c.page(
        "templates.html",
        status=status,
        tenant_id=tenant_id,
        url=templates_url(tenant_id),
        templates=found,
        template_url=template_url,
        errors=errors or {},
        typed=typed or {"name": "", "locale": ""},
    )


async def template_new(c: Console) -> Response:
    """The index's form for a new template or locale: to that page (its editor, empty)."""
    tenant_id = await path_tenant_id(c)
    typed = {key: c.request.query_params.get(key, "").strip() for key in ("name", "locale")}
    errors = {
        key: problem
        for key, problem in (
            ("name", template_name_problem(typed["name"])),
            ("locale", locale_problem(typed["locale"])),
        )
        if problem is not None
    }
    if errors:
        return await _index(c, tenant_id, status=400, errors=errors, typed=typed)
    return c.redirect(template_url(tenant_id, typed["name"], normal_locale(typed["locale"])))


# --- the editor --------------------------------------------------------------------------


def _values_of(version: Version) -> dict[str, str]:
    return {
        "subject": version.subject,
        "html": version.html,
        "text": version.text,
        "sample_data": json.dumps(dict(version.sample_data), indent=2, ensure_ascii=False),
        "format": version.format,
    }


EMPTY = {"subject": "", "html": "", "text": "", "sample_data": "{}", "format": "jinja"}


def _typed(form: Mapping[str, str]) -> dict[str, str]:
    """The editor's fields as posted; a browser sends a textarea's lines with CRLF."""
    values = {key: form.get(key, "").replace("\r\n", "\n") for key in FIELDS}
    values["format"] = values["format"] or "jinja"
    return values


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _fields(values: Mapping[str, str]) -> dict[str, Any]:
    """What the service takes: the sample data read as JSON (InvalidTemplate if it is not)."""
    typed = values["sample_data"].strip()
    if len(typed.encode()) > 4 * SAMPLE_DATA_MAX_BYTES:  # far over, whatever its spacing
        raise TemplateTooLarge(
            {"sample_data": f"is larger than {SAMPLE_DATA_MAX_BYTES} bytes as JSON"}
        )
    data: Any = {}
    if typed:
        try:
            data = json.loads(typed, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise InvalidTemplate(
                {"sample_data": f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"}
            ) from None
        except (ValueError, RecursionError) as exc:  # NaN, an integer of 5,000 digits, depth
            why = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
            raise InvalidTemplate({"sample_data": f"not JSON mailbag takes: {why}"}) from None
        try:  # as the service will write it: no integer past 64 bits, no depth past 255
            orjson.dumps(data)
        except orjson.JSONEncodeError as exc:
            raise InvalidTemplate({"sample_data": f"not JSON mailbag takes: {exc}"}) from None
    return {**{key: values[key] for key in FIELDS if key != "sample_data"}, "sample_data": data}


def problems_of(exc: Exception) -> list[Shown]:
    """Each problem of a refused draft: a field the rules refuse, or a part's line."""
    if isinstance(exc, InvalidTemplate):
        return [Shown(name, None, problem) for name, problem in exc.errors.items()]
    found = getattr(exc, "problems", None)
    if found:
        return [Shown(str(p.part), p.line, str(p.message)) for p in found]
    return [Shown("template", None, str(exc))]


def _status_of(exc: Exception) -> int:
    return 413 if isinstance(exc, TemplateTooLarge) else 422


@dataclass(frozen=True)
class State:
    """What the service holds of the page's template: its locales and this locale's
    versions (oldest first); None: no such template yet."""

    template: Template | None
    held: Locale | None
    versions: Sequence[Version]

    @property
    def current(self) -> Version | None:
        if self.held is None:
            return None
        return next((v for v in self.versions if v.version == self.held.current), None)


async def _state(c: Console, where: Where) -> State:
    service = _service(c)
    try:
        template = await service.template(tenant=where.tenant_id, name=where.name)
    except UnknownTemplate:
        return State(None, None, ())
    held = next((h for h in template.locales if h.locale == where.locale), None)
    if held is None:
        return State(template, None, ())
    versions = await service.versions(tenant=where.tenant_id, name=where.name, locale=where.locale)
    return State(template, held, versions)


async def _preview(c: Console, where: Where, values: Mapping[str, str]) -> Preview:
    return await _service(c).preview(
        tenant=where.tenant_id, name=where.name, locale=where.locale, fields=_fields(values)
    )


async def _refused(
    c: Console, where: Where, values: Mapping[str, str], exc: Exception, title: str
) -> Response:
    """The editor again, the draft kept, with why it cannot be rendered or published."""
    return await _editor(
        c, where, values, status=_status_of(exc), problems=problems_of(exc), problems_title=title
    )


async def _editor(
    c: Console,
    where: Where,
    values: Mapping[str, str],
    *,
    state: State | None = None,
    status: int = 200,
    preview: Preview | None = None,
    problems: Sequence[Shown] = (),
    problems_title: str = "",
    notice: str = "",
) -> Response:
    state = state or await _state(c, where)
    current = state.held.current if state.held else None
    response = c.page(
        "template.html",
        status=status,
        where=where,
        url=where.url,
        index_url=templates_url(where.tenant_id),
        values=values,
        formats=FORMATS,
        subject_max=SUBJECT_SOURCE_MAX,
        stored=state.template,
        held=state.held,
        versions=list(reversed(state.versions)),  # newest first
        current=current,
        preview=preview.rendered if preview else None,
        uses=sorted(preview.dependencies) if preview else [],
        problems=problems,
        problems_title=problems_title,
        notice=notice,
        locale_url=lambda tag: template_url(where.tenant_id, where.name, tag),
        script=SCRIPT_PATH,
        form_max=c.services.settings.max_body_bytes,
    )
    response.headers["Content-Security-Policy"] = EDITOR_POLICY
    return response


async def template_page(c: Console) -> Response:
    """The editor, filled with the current version (a new locale: with the default
    locale's; a new template: empty), and that version's preview."""
    where = await _where(c)
    if where.locale != c.request.path_params["locale"]:  # `pt-br`: the page of `pt-BR`
        return c.redirect(where.url)
    state = await _state(c, where)
    source = state.current
    notice = ""
    if source is None and state.template is not None:
        default = state.template.default_locale
        try:
            source = await _service(c).version(
                tenant=where.tenant_id, name=where.name, locale=default
            )
        except UnknownTemplate:
            source = None
        else:
            notice = (
                f"A new locale of {where.name}: the form holds version {source.version} of "
                f"{default}, its default locale. Publishing makes version 1 in {where.locale}."
            )
    elif source is None:
        notice = (
            f"A new template: nothing is published yet. Publishing makes version 1 of "
            f"{where.name}, and {where.locale} its default locale."
        )
    if source is None:
        return await _editor(c, where, EMPTY, state=state, notice=notice)
    values = _values_of(source)
    try:
        preview = await _preview(c, where, values)
    except (InvalidTemplate, TemplateError) as exc:
        return await _editor(
            c,
            where,
            values,
            state=state,
            problems=problems_of(exc),
            problems_title="This version does not render now",
            notice=notice,
        )
    return await _editor(c, where, values, state=state, preview=preview, notice=notice)


async def template_preview(c: Console) -> Response:
    """The draft as posted, rendered with its sample data; nothing is written."""
    where = await _where(c)
    values = _typed(c.form)
    try:
        done = await _preview(c, where, values)
    except (InvalidTemplate, TemplateError) as exc:
        return await _refused(c, where, values, exc, "The draft cannot be rendered")
    return await _editor(c, where, values, preview=done)


async def template_live(c: Console) -> Response:
    """`preview` for the editor's script: the rendered parts, or the problems, as JSON."""
    where = await _where(c)
    try:
        done = await _preview(c, where, _typed(c.form))
    except (InvalidTemplate, TemplateError) as exc:
        shown = [p.__dict__ for p in problems_of(exc)]
        return _json({"problems": shown}, status=_status_of(exc))
    return _json({**_rendered(done.rendered), "uses": sorted(done.dependencies)})


def _rendered(rendered: Rendered) -> dict[str, str]:
    return {"subject": rendered.subject, "html": rendered.html, "text": rendered.text}


def _json(body: Mapping[str, Any], *, status: int = 200) -> Response:
    return JSONResponse(dict(body), status_code=status, headers=render.SECURITY_HEADERS)


async def template_publish(c: Console) -> Response:
    """A new version from the form, current at once; the same fields as the current
    version publish nothing. Problems: the form again, with them, nothing published."""
    where = await _where(c)
    values = _typed(c.form)
    try:
        done = await _service(c).publish(
            tenant=where.tenant_id,
            name=where.name,
            locale=where.locale,
            fields=_fields(values),
            changed_by=ACTOR,
            now=c.now(),
        )
    except (InvalidTemplate, TemplateError) as exc:
        return await _refused(c, where, values, exc, "Not published: the draft has problems")
    except Conflict:
        raise ConsoleError(
            409, "Not possible now", "Others published this locale at the same time: try again."
        ) from None
    number = done.version.version
    if not done.created:
        return c.redirect(
            where.url, flash=f"Nothing published: the form is version {number}, the current one."
        )
    log.info(
        "console_template_published",
        tenant=where.tenant_id,
        template=where.name,
        locale=where.locale,
        version=number,
        actor=ACTOR,
    )
    return c.redirect(
        where.url,
        flash=f"Published version {number} of {where.name} ({where.locale}): it is current.",
    )


# --- versions: diff and rollback ---------------------------------------------------------


def _number(value: str, what: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if not 1 <= number <= VERSION_MAX:
        raise ConsoleError(400, "Bad request", f"{what}: not a version number.")
    return number


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def diff_lines(diff: str) -> list[tuple[str, str]]:
    """Each line of a unified diff with its kind (file, hunk, add, del, same): counted from
    the hunk headers, so a removed line that reads `--- x` is still a removed line."""
    lines: list[tuple[str, str]] = []
    old = new = 0
    for line in diff.removesuffix("\n").split("\n") if diff else ():
        if old > 0 or new > 0:
            if line.startswith("+") and new > 0:
                kind, new = "add", new - 1
            elif line.startswith("-") and old > 0:
                kind, old = "del", old - 1
            else:
                kind, old, new = "same", old - 1, new - 1
        elif (match := _HUNK.match(line)) is not None:
            kind = "hunk"
            old = int(match[1]) if match[1] is not None else 1
            new = int(match[2]) if match[2] is not None else 1
        else:
            kind = "file"
        lines.append((kind, line))
    return lines


def _data_diff(before: Version, after: Version) -> str:
    def lines(version: Version) -> list[str]:
        return render.as_json(dict(version.sample_data)).splitlines(keepends=True)

    changed = difflib.unified_diff(
        lines(before),
        lines(after),
        fromfile=f"{before.name}/{before.locale}@{before.version}/sample_data",
        tofile=f"{after.name}/{after.locale}@{after.version}/sample_data",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in changed)


async def template_diff(c: Console) -> Response:
    """The service's unified diff of two versions (and of their sample data)."""
    where = await _where(c)
    state = await _state(c, where)
    if state.held is None:
        raise ConsoleError(404, "Not found", f"{where.name} has no versions in {where.locale}.")
    params = c.request.query_params
    new = _number(params["new"], "new") if params.get("new") else state.held.current
    default_old = max(1, new - 1)
    old = _number(params["old"], "old") if params.get("old") else default_old
    by_number = {v.version: v for v in state.versions}
    for number in (old, new):
        if number not in by_number:
            raise ConsoleError(
                404, "Not found", f"{where.name} has no version {number} in {where.locale}."
            )
    text = await _service(c).diff(
        tenant=where.tenant_id, name=where.name, locale=where.locale, old=old, new=new
    )
    text += _data_diff(by_number[old], by_number[new])
    return c.page(
        "template_diff.html",
        where=where,
        url=where.url,
        index_url=templates_url(where.tenant_id),
        old=by_number[old],
        new=by_number[new],
        current=state.held.current,
        versions=list(reversed(state.versions)),
        lines=diff_lines(text),
    )


async def template_rollback(c: Console) -> Response:
    """Make an older version current again, after a confirmation."""
    where = await _where(c)
    number = _number(c.form.get("version", ""), "version")
    state = await _state(c, where)
    chosen = next((v for v in state.versions if v.version == number), None)
    if state.held is None or chosen is None:
        raise ConsoleError(
            404, "Not found", f"{where.name} has no version {number} in {where.locale}."
        )
    if number == state.held.current:
        raise ConsoleError(409, "Not possible now", f"Version {number} is the current one already.")
    if not c.confirmed:
        return confirm(
            c,
            title=f"Roll back to version {number}?",
            question="It becomes the current version: messages enqueued from now on render "
            "with it; those already enqueued keep their version. No version is deleted: "
            "the newer ones stay and can be made current again.",
            action=f"{where.url}/rollback",
            fields={"version": str(number)},
            details=[
                ("Tenant", c.tenant_label(where.tenant_id)),
                ("Template", where.name),
                ("Locale", where.locale),
                ("Version", f"{number}, by {chosen.changed_by}, {render.utc(chosen.created_at)}"),
                ("Current now", str(state.held.current)),
            ],
            back=where.url,
        )
    try:
        await _service(c).rollback(
            tenant=where.tenant_id,
            name=where.name,
            locale=where.locale,
            version=number,
            now=c.now(),
        )
    except UnknownTemplate as exc:
        raise ConsoleError(404, "Not found", f"Nothing was changed: {exc}.") from None
    log.info(
        "console_template_rolled_back",
        tenant=where.tenant_id,
        template=where.name,
        locale=where.locale,
        version=number,
        actor=ACTOR,
    )
    return c.redirect(where.url, flash=f"Rolled back: version {number} is current again.")


async def template_script(c: Console) -> Response:
    """The editor's one script (live preview); the page works without it."""
    return Response(SCRIPT, media_type="text/javascript; charset=utf-8", headers=SCRIPT_HEADERS)
