"""Tenants' own templates: their versions, written once and never updated, and which version
is current per locale (domain/templates.py has the rules, services/templates.py the uses).

A version's number is the next of its locale's: two publishes racing for one number meet
at the unique index, and the loser is a Conflict its caller tries again. Its id is a random
62-bit number, not a sequence: a process compiles each version once and keeps it by id
(templates/book.py), and a process may serve several databases (Django's, a test
suite's), whose sequences would each hand out 1, 2, 3.

Which version is current moves only forward on a publish (`latest_version < n`), so of two
racing publishes the later number is current, whichever commits last; a rollback moves it
back on purpose.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Row, and_, bindparam, func, select, tuple_, update

from mailbag.domain.templates import Draft, Locale, Template, Version
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import template_locales as tl
from mailbag.store.schema import template_versions as tv
from mailbag.store.schema import templates_table as tt
from mailbag.store.types import insert_into


def _version(row: Row[Any]) -> Version:
    return Version(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        locale=row.locale,
        version=row.version,
        format=row.format,
        subject=row.subject,
        html=row.html,
        text=row.text,
        compiled_html=row.compiled_html,
        sample_data=row.sample_data,
        dependencies=row.dependencies,
        changed_by=row.changed_by,
        created_at=row.created_at,
    )


def publish(
    *,
    tenant_id: str,
    name: str,
    locale: str,
    draft: Draft,
    compiled_html: str | None,
    dependencies: Mapping[str, int],
    changed_by: str,
    now: datetime,
) -> Plan[Version]:
    """Write the next version of (name, locale) and make it current; the first locale a
    template is published in becomes its default."""
    dialect = yield from current_dialect()
    owner = {"tenant_id": tenant_id, "name": name}
    template = insert_into(dialect, tt).values(**owner, default_locale=locale, created_at=now)
    if dialect == "mysql":
        yield Step(template.on_duplicate_key_update(name=tt.c.name))
    else:
        yield Step(template.on_conflict_do_nothing())
    same = and_(tv.c.tenant_id == tenant_id, tv.c.name == name, tv.c.locale == locale)
    number = yield Step(select(func.coalesce(func.max(tv.c.version), 0)).where(same))
    version = int(number.scalar_one()) + 1
    version_id = secrets.randbits(62) + 1
    values: dict[str, Any] = {
        "id": version_id,
        **owner,
        "locale": locale,
        "version": version,
        "format": draft.format,
        "subject": draft.subject,
        "html": draft.html,
        "text": draft.text,
        "compiled_html": compiled_html,
        "sample_data": dict(draft.sample_data),
        "dependencies": dict(dependencies),
        "changed_by": changed_by,
        "created_at": now,
    }
    yield Step(tv.insert().values(**values))
    current = {
        "current_version": version,
        "current_version_id": version_id,
        "latest_version": version,
        "updated_at": now,
    }
    made = insert_into(dialect, tl).values(**owner, locale=locale, **current)
    if dialect == "mysql":
        yield Step(made.on_duplicate_key_update(locale=tl.c.locale))
    else:
        yield Step(made.on_conflict_do_nothing())
    yield Step(
        update(tl)
        .where(_locale(tenant_id, name, locale), tl.c.latest_version < version)
        .values(current)
    )
    return Version(**values)


def _locale(tenant_id: str, name: str, locale: str) -> Any:
    return and_(tl.c.tenant_id == tenant_id, tl.c.name == name, tl.c.locale == locale)


def rollback(
    *, tenant_id: str, name: str, locale: str, version: int, now: datetime
) -> Plan[Version | None]:
    """Make an existing version current again (None: there is no such version)."""
    found = yield from version_of(tenant_id=tenant_id, name=name, locale=locale, version=version)
    if found is None:
        return None
    yield Step(
        update(tl)
        .where(_locale(tenant_id, name, locale))
        .values(current_version=version, current_version_id=found.id, updated_at=now)
    )
    return found


def version_of(*, tenant_id: str, name: str, locale: str, version: int) -> Plan[Version | None]:
    """One version of (name, locale) by its number (None: there is no such version)."""
    query = select(tv).where(
        tv.c.tenant_id == tenant_id,
        tv.c.name == name,
        tv.c.locale == locale,
        tv.c.version == version,
    )
    row = (yield Step(query)).first()
    return None if row is None else _version(row)


def versions(*, tenant_id: str, name: str, locale: str) -> Plan[list[Version]]:
    """Every version of (name, locale), oldest first."""
    query = (
        select(tv)
        .where(tv.c.tenant_id == tenant_id, tv.c.name == name, tv.c.locale == locale)
        .order_by(tv.c.version)
    )
    return [_version(row) for row in (yield Step(query)).all()]


def by_ids(ids: Collection[int]) -> Plan[dict[int, Version]]:
    """The versions with these ids (a worker's pinned messages and what they extend)."""
    if not ids:
        return {}
    rows = (yield Step(select(tv).where(tv.c.id.in_(sorted(ids))))).all()
    return {row.id: _version(row) for row in rows}


def listing(*, tenant_id: str, names: Collection[str] | None = None) -> Plan[list[Template]]:
    """The tenant's templates (only `names`, if given), by name, with their locales."""
    query = (
        select(tt.c.name, tt.c.default_locale, tl.c.locale, tl.c.current_version)
        .add_columns(tl.c.latest_version, tl.c.updated_at)
        .join(tl, and_(tl.c.tenant_id == tt.c.tenant_id, tl.c.name == tt.c.name))
        .where(tt.c.tenant_id == tenant_id)
        .order_by(tt.c.name, tl.c.locale)
    )
    if names is not None:
        if not names:
            return []
        query = query.where(tt.c.name.in_(sorted(names)))
    found: dict[str, Template] = {}
    for row in (yield Step(query)).all():
        locale = Locale(row.locale, row.current_version, row.latest_version, row.updated_at)
        held = found.get(row.name)
        locales = (*held.locales, locale) if held else (locale,)
        found[row.name] = Template(tenant_id, row.name, row.default_locale, locales)
    return list(found.values())


def current_ids(
    wanted: Collection[tuple[str, str]],
) -> Plan[dict[tuple[str, str], tuple[str, dict[str, tuple[int, int]]]]]:
    """For each (tenant, name) that is a template in the database: its default locale and,
    by locale, its current version's (number, id). One query for all of them."""
    if not wanted:
        return {}
    query = (
        select(tt.c.tenant_id, tt.c.name, tt.c.default_locale, tl.c.locale)
        .add_columns(tl.c.current_version, tl.c.current_version_id)
        .join(tl, and_(tl.c.tenant_id == tt.c.tenant_id, tl.c.name == tt.c.name))
        .where(
            tuple_(tt.c.tenant_id, tt.c.name).in_(
                bindparam("wanted", sorted(wanted), expanding=True)
            )
        )
    )
    found: dict[tuple[str, str], tuple[str, dict[str, tuple[int, int]]]] = {}
    for row in (yield Step(query)).all():
        _, locales = found.setdefault((row.tenant_id, row.name), (row.default_locale, {}))
        locales[row.locale] = (row.current_version, row.current_version_id)
    return found
