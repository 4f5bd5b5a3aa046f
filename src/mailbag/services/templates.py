"""Templates operators own: publish, roll back, read, compare and check them
(`mailbag templates`, `PUT /v1/templates/{name}/{locale}`, the console), and pin the version
each new message renders with (`pinned`, run by every write of the outbox).

Publishing a version is refused, with nothing written, unless it compiles in the sandbox
and renders with its own sample data within the render budget; the templates it extends
or includes are its tenant's, at their current versions in its locale (else their
default), and which versions those were is kept with it.

Errors:
    InvalidTemplate   (domain.templates) a name, locale or field the rules refuse: 422,
                      exit 2
    TemplateProblems  (templates.sandbox) it does not compile or render: 422 with each
                      part's line and message, exit 2
    UnknownTemplate   no such template, locale or version: 404, exit 2
    UnknownTenant     (services.tenants) no tenant has that id or name: 404, exit 2
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mailbag.clock import utcnow
from mailbag.compose import check_renders
from mailbag.domain import templates as rules
from mailbag.domain.message import InvalidMessage, NewMessage
from mailbag.domain.templates import FILE_TEMPLATE, Draft, Pin, Template, Version
from mailbag.services.tenants import tenant_id_of
from mailbag.store import templates as store
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase, Conflict, Session
from mailbag.templates import Rendered, TemplateError, builtin
from mailbag.templates.book import Book, parts_of
from mailbag.templates.sandbox import Parts, Problem, TemplateProblems, referenced

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

PUBLISH_TRIES = 5  # racing publishes of one locale: each takes the next number in turn


class UnknownTemplate(Exception):
    """No such template, locale or version of the tenant's."""


# --- pinning: the version a new message renders with -----------------------------------


def pinned(
    messages: Sequence[NewMessage],
    book: Book,
    secrets: Sequence[Mapping[str, Any] | None] | None = None,
) -> Plan[list[NewMessage]]:
    """The messages with the version each renders with (`NewMessage.pin`), each rendered
    once with its data (and its `secrets`, fields never stored) so that what would fail at
    send time is refused now: InvalidMessage for the first that fails."""
    done, refused = yield from pin_each(messages, book, secrets)
    if refused:
        raise refused[min(refused)]
    return done


def pin_each(
    messages: Sequence[NewMessage],
    book: Book,
    secrets: Sequence[Mapping[str, Any] | None] | None = None,
) -> Plan[tuple[list[NewMessage], dict[int, InvalidMessage]]]:
    """`pinned` for each message on its own: the messages (pinned, or as they were), and
    the refused ones' errors by position. One query for the lot, one more per versions not
    yet loaded."""
    wanted = {(m.tenant_id, m.template_name) for m in messages if _unpinned(m)}
    current = yield from store.current_ids(wanted)  # type: ignore[arg-type]
    done: list[NewMessage] = []
    refused: dict[int, InvalidMessage] = {}
    fresh: list[int] = []  # the positions pinned here: each is rendered once, below
    for position, m in enumerate(messages):
        if not _unpinned(m):
            done.append(m)
            continue
        fresh.append(position)
        assert m.template_name is not None
        found = current.get((m.tenant_id, m.template_name))
        if found is not None:
            default, locales = found
            tag = rules.chosen(locales, m.locale, default)
            assert tag is not None  # the default locale is always there
            number, version_id = locales[tag]
            done.append(m.pinned_to(Pin(version_id, number, tag)))
        elif m.template_name in book.catalog:
            done.append(m.pinned_to(FILE_TEMPLATE))
        else:
            done.append(m)
            refused[position] = InvalidMessage(
                {"template": f"unknown template {m.template_name!r}"}
            )
    yield from book.load([m.pin.version_id for m in done if m.pin is not None])
    for position in fresh:
        m = done[position]
        if position in refused:
            continue
        extra = secrets[position] if secrets else None
        try:
            check_renders(m, book, {**m.template_data, **extra} if extra else m.template_data)
        except InvalidMessage as exc:
            refused[position] = exc
    return done, refused


def _unpinned(m: NewMessage) -> bool:
    return m.template_name is not None and m.pin is None


def pin_rows(
    conn: Connection, messages: Sequence[NewMessage], book: Book
) -> tuple[list[NewMessage], dict[int, InvalidMessage]]:
    """`pin_each` on a sync connection (send-bulk checks every row before writing)."""
    return Session(conn).run(pin_each(messages, book))


def is_template(conn: Connection, tenant_id: str, name: str, book: Book) -> bool:
    """Whether `name` is one of the tenant's templates or a file template."""
    if name in book.catalog:
        return True
    return bool(Session(conn).run(store.current_ids({(tenant_id, name)})))


# --- publishing --------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    version: Version
    created: bool  # False: the fields were the current version's; nothing was written


def _current(tenant_id: str, name: str, locale: str) -> Plan[Version | None]:
    found = yield from store.listing(tenant_id=tenant_id, names=[name])
    held = {loc.locale: loc.current for t in found for loc in t.locales}
    if locale not in held:
        return None
    return (
        yield from store.version_of(
            tenant_id=tenant_id, name=name, locale=locale, version=held[locale]
        )
    )


@dataclass(frozen=True)
class Preview:
    """A draft rendered with its sample data: what the console shows before publishing."""

    rendered: Rendered
    dependencies: Mapping[str, int]


def compiled_html(draft: Draft) -> str | None:
    """An MJML draft's html as HTML (with its Jinja): compiled once, when published."""
    if draft.format != "mjml":
        return None
    from mailbag.templates import mjml

    return mjml.to_html(draft.html)


def _library(
    tenant_id: str, name: str, locale: str, parts: Parts
) -> Plan[tuple[dict[str, Parts], dict[str, int]]]:
    """What `parts` extend or include, and what those do, at their current versions in
    `locale` (else their default): by name, the parts and the version ids."""
    library: dict[str, Parts] = {}
    dependencies: dict[str, int] = {}
    names = referenced(parts)
    while names - set(library):
        wanted = names - set(library)
        if name in wanted:
            raise TemplateProblems([Problem("html", None, f"{name!r} cannot use itself")])
        current = yield from store.current_ids({(tenant_id, n) for n in wanted})
        ids: dict[str, int] = {}
        for needed in sorted(wanted):
            found = current.get((tenant_id, needed))
            if found is None:
                message = f"uses {needed!r}, which is not a template of this tenant"
                raise TemplateProblems([Problem("html", None, message)])
            default, locales = found
            tag = rules.chosen(locales, locale, default)
            assert tag is not None
            ids[needed] = locales[tag][1]
        versions = yield from store.by_ids(set(ids.values()))
        for needed, version_id in ids.items():
            library[needed] = parts_of(versions[version_id])
            dependencies[needed] = version_id
            names |= referenced(library[needed])
    return library, dependencies


class Templates:
    """The use cases on an async engine (the API, the console and the CLI run these).
    `book`: the deployment's, whose file templates come after the tenants' (`hold`)."""

    def __init__(self, engine: AsyncEngine, book: Book | None = None) -> None:
        self.db = AsyncDatabase(engine)
        self.book = book or Book(builtin())
        self.sandbox = self.book.sandbox

    async def hold(self, ids: Sequence[int | None]) -> Book:
        """The book, holding the versions with these ids (a message's, to preview it)."""
        if self.book.missing(ids):
            async with self.db.connect(read_only=True) as tx:
                await tx.run(self.book.load(ids))
        return self.book

    async def publish(
        self,
        *,
        tenant: str,
        name: str,
        locale: str,
        fields: Mapping[str, Any],
        changed_by: str,
        now: datetime | None = None,
    ) -> Published:
        """Publish a new version from `fields` (subject, html, text, sample_data, format)
        and make it current; the same fields as the current version publish nothing (a
        retried request). `tenant`: an id or a name."""
        name, locale = rules.template_name(name), rules.locale(locale)
        draft = rules.draft_of(fields)
        async with self.db.connect(read_only=True) as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
        for attempt in range(PUBLISH_TRIES):
            # Compiled and rendered before the transaction, never inside it.
            preview, html = await self._tried(tenant_id, name, locale, draft)
            try:
                async with self.db.transaction() as tx:
                    current = await tx.run(_current(tenant_id, name, locale))
                    if current is not None and rules.same(current, draft):
                        return Published(current, created=False)
                    made = await tx.run(
                        store.publish(
                            tenant_id=tenant_id,
                            name=name,
                            locale=locale,
                            draft=draft,
                            compiled_html=html,
                            dependencies=preview.dependencies,
                            changed_by=changed_by,
                            now=now or utcnow(),
                        )
                    )
                    return Published(made, created=True)
            except Conflict:
                if attempt == PUBLISH_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    async def preview(
        self, *, tenant: str, name: str, locale: str, fields: Mapping[str, Any]
    ) -> Preview:
        """What publishing `fields` would send with their sample data; nothing is written."""
        name, locale = rules.template_name(name), rules.locale(locale)
        draft = rules.draft_of(fields)
        async with self.db.connect(read_only=True) as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
        preview, _ = await self._tried(tenant_id, name, locale, draft)
        return preview

    async def _tried(
        self, tenant_id: str, name: str, locale: str, draft: Draft
    ) -> tuple[Preview, str | None]:
        """`draft` compiled with the tenant's templates it uses and rendered with its sample
        data (TemplateProblems when it cannot be), and an MJML draft's compiled HTML. The
        compiling and rendering run in a thread: up to the render budget, never blocking
        the event loop that serves the API."""
        # The sandbox compiles an MJML draft itself (its problems carry the MJML's lines);
        # what is stored, and what workers render, is the HTML compiled here, once.
        html = await asyncio.to_thread(compiled_html, draft)
        parts = Parts(draft.subject, draft.html, draft.text, draft.format)
        async with self.db.connect(read_only=True) as tx:
            library, dependencies = await tx.run(_library(tenant_id, name, locale, parts))
        compiled = await asyncio.to_thread(self.sandbox.compile, parts, library)
        rendered = await asyncio.to_thread(compiled.check, draft.sample_data)
        return Preview(rendered, dependencies), html

    async def rollback(
        self, *, tenant: str, name: str, locale: str, version: int, now: datetime | None = None
    ) -> Version:
        """Make an older (or any existing) version current again."""
        name, locale = rules.template_name(name), rules.locale(locale)
        async with self.db.transaction() as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
            found = await tx.run(
                store.rollback(
                    tenant_id=tenant_id,
                    name=name,
                    locale=locale,
                    version=version,
                    now=now or utcnow(),
                )
            )
        if found is None:
            raise UnknownTemplate(f"template {name!r} has no version {version} in {locale}")
        return found

    async def listing(self, *, tenant: str) -> list[Template]:
        async with self.db.connect(read_only=True) as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
            return await tx.run(store.listing(tenant_id=tenant_id))

    async def template(self, *, tenant: str, name: str) -> Template:
        name = rules.template_name(name)
        async with self.db.connect(read_only=True) as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
            found = await tx.run(store.listing(tenant_id=tenant_id, names=[name]))
        if not found:
            raise UnknownTemplate(f"no template {name!r}")
        return found[0]

    async def versions(self, *, tenant: str, name: str, locale: str) -> list[Version]:
        """Every version of the template in `locale`, oldest first."""
        name, locale = rules.template_name(name), rules.locale(locale)
        async with self.db.connect(read_only=True) as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
            found = await tx.run(store.versions(tenant_id=tenant_id, name=name, locale=locale))
        if not found:
            raise UnknownTemplate(f"template {name!r} has no locale {locale}")
        return found

    async def version(
        self, *, tenant: str, name: str, locale: str, version: int | None = None
    ) -> Version:
        """One version (None: the current one)."""
        name, locale = rules.template_name(name), rules.locale(locale)
        async with self.db.connect(read_only=True) as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
            if version is None:
                got = await tx.run(_current(tenant_id, name, locale))
            else:
                got = await tx.run(
                    store.version_of(tenant_id=tenant_id, name=name, locale=locale, version=version)
                )
        if got is None:
            which = "current version" if version is None else f"version {version}"
            raise UnknownTemplate(f"template {name!r} has no {which} in {locale}")
        return got

    async def current_number(self, *, tenant: str, name: str, locale: str) -> int:
        """The number of the current version in `locale`."""
        return (await self.version(tenant=tenant, name=name, locale=locale)).version

    async def diff(
        self, *, tenant: str, name: str, locale: str, old: int, new: int | None = None
    ) -> str:
        """A unified diff of each part from version `old` to `new` (None: the current)."""
        before = await self.version(tenant=tenant, name=name, locale=locale, version=old)
        after = await self.version(tenant=tenant, name=name, locale=locale, version=new)
        return diff(before, after)

    async def check(self, *, tenant: str) -> dict[str, list[str]]:
        """Render every current version of the tenant's templates with its sample data:
        the problems, by `name/locale` (empty: all render)."""
        found: dict[str, list[str]] = {}
        for template in await self.listing(tenant=tenant):
            for held in template.locales:
                version = await self.version(
                    tenant=tenant, name=template.name, locale=held.locale, version=held.current
                )
                book = Book(builtin(), self.sandbox)  # renders by version alone
                async with self.db.connect(read_only=True) as tx:
                    await tx.run(book.load([version.id]))
                try:
                    book.compiled(version.id).check(version.sample_data)
                    problems: list[str] = []
                except TemplateError as exc:
                    problems = [str(exc)]
                found[f"{template.name}/{held.locale}"] = problems
        return found


def diff(before: Version, after: Version) -> str:
    """Each part's changes, as `diff -u` shows them."""
    lines: list[str] = []
    for part in ("subject", "html", "text"):
        lines += difflib.unified_diff(
            str(getattr(before, part)).splitlines(keepends=True),
            str(getattr(after, part)).splitlines(keepends=True),
            fromfile=f"{before.name}/{before.locale}@{before.version}/{part}",
            tofile=f"{after.name}/{after.locale}@{after.version}/{part}",
        )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
