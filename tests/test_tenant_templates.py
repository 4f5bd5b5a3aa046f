"""Templates operators own, on each database: versions that never change, the version a
message was enqueued with kept until it is sent, locale fallback, the sandbox and its
budget, and tenants kept apart. Messages go through the public doors (mailbag.enqueue,
the worker) and are read back as the store holds them."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

import mailbag
from mailbag.domain.delivery import Accepted, Deferred, SendOutcome
from mailbag.domain.message import InvalidMessage
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Status
from mailbag.domain.templates import InvalidTemplate, TemplateTooLarge
from mailbag.services.templates import Templates, UnknownTemplate
from mailbag.services.tenants import create_tenant
from mailbag.settings import Settings
from mailbag.store.schema import template_locales, template_versions
from mailbag.templates import TemplateError, builtin
from mailbag.templates.book import book_of
from mailbag.worker import Worker, WorkerConfig

from conftest import TestDB
from helpers import get, run_worker_until, status_counts
from memory_provider import MemoryProvider

LAYOUT = {
    "subject": "unused",
    "html": "<body>{% block body %}{% endblock %}<footer>{{ company }}</footer></body>",
    "text": "{% block body %}{% endblock %}\n-- {{ company }}",
    "sample_data": {"company": "Acme"},
}


def version_fields(subject: str, html: str = "<p>{{ name }}</p>", **extra: Any) -> dict[str, Any]:
    return {"subject": subject, "html": html, "text": "", "sample_data": {"name": "Ada"}, **extra}


@pytest.fixture
async def service(async_engine: Any) -> Templates:
    return Templates(async_engine, book_of(builtin()))


async def publish(
    service: Templates, name: str, locale: str, tenant: str = "default", **f: Any
) -> Any:
    fields = f.pop("fields", None) or version_fields(**f)
    done = await service.publish(
        tenant=tenant, name=name, locale=locale, fields=fields, changed_by="test"
    )
    return done.version


def enqueue(db: TestDB, **fields: Any) -> Any:
    with db.engine.begin() as conn:
        return mailbag.enqueue(conn, to="ada@example.com", settings=Settings(), **fields).message


def version_rows(db: TestDB) -> list[tuple[Any, ...]]:
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(template_versions).order_by("version"))]


def worker(async_engine: Any, provider: MemoryProvider) -> Worker:
    config = WorkerConfig(
        worker_id="templates-worker",
        from_email="app@acme.test",
        poll_interval=0.05,
        sweep_every=0.05,
        policy=RetryPolicy(max_attempts=3, base=timedelta(milliseconds=20)),
    )
    return Worker(engine=async_engine, provider=provider, catalog=builtin(), config=config)


# --- versions ----------------------------------------------------------------------------


async def test_versions_never_change_and_rollback_only_moves_the_current_one(db, service):
    first = await publish(service, "receipt", "en", subject="Receipt 1 for {{ name }}")
    second = await publish(service, "receipt", "en", subject="Receipt 2 for {{ name }}")
    assert (first.version, second.version) == (1, 2)
    before = version_rows(db)
    rolled = await service.rollback(tenant="default", name="receipt", locale="en", version=1)
    assert rolled.id == first.id
    assert version_rows(db) == before  # a rollback writes no version, changes none
    assert (await service.version(tenant="default", name="receipt", locale="en")).version == 1
    # The next publish takes the next number: never one a version had.
    third = await publish(service, "receipt", "en", subject="Receipt 3 for {{ name }}")
    assert third.version == 3
    assert version_rows(db)[:2] == before
    got = await service.version(tenant="default", name="receipt", locale="en", version=2)
    assert got.subject == "Receipt 2 for {{ name }}"


async def test_the_same_fields_again_publish_nothing(db, service):
    await publish(service, "receipt", "en", subject="Hi {{ name }}")
    again = await service.publish(
        tenant="default",
        name="receipt",
        locale="en",
        fields=version_fields("Hi {{ name }}"),
        changed_by="test",
    )
    assert not again.created and again.version.version == 1
    assert len(version_rows(db)) == 1


async def test_racing_publishes_on_separate_connections_each_get_a_number(db, service):
    await publish(service, "receipt", "en", subject="v1 {{ name }}")
    subjects = [f"racing {i} {{{{ name }}}}" for i in range(6)]
    done = await asyncio.gather(
        *(
            service.publish(
                tenant="default",
                name="receipt",
                locale="en",
                fields=version_fields(s),
                changed_by="test",
            )
            for s in subjects
        )
    )
    numbers = sorted(d.version.version for d in done)
    assert numbers == list(range(2, 8))
    with db.engine.connect() as conn:
        current = conn.execute(select(template_locales.c.current_version)).scalar_one()
    assert current == 7  # the highest number is current, whichever committed last


# --- pinning -------------------------------------------------------------------------------


async def test_a_pending_and_a_retried_message_keep_their_version_across_publishes(
    db, async_engine, service
):
    await publish(service, "receipt", "en", subject="Old receipt for {{ name }}")
    pending = enqueue(db, template="receipt", data={"name": "Ada"})
    assert pending.template_version == 1 and pending.template_locale == "en"
    await publish(service, "receipt", "en", subject="New receipt for {{ name }}")
    fresh = enqueue(db, template="receipt", data={"name": "Bob"})
    assert fresh.template_version == 2

    calls: list[str] = []

    def first_deferred(email: Any, nth: int) -> SendOutcome:
        calls.append(email.subject)
        if email.subject.startswith("Old") and nth == 1:
            return Deferred("try later", retry_after=timedelta(seconds=1))
        return Accepted(f"mem-{email.message_id}-{nth}")

    provider = MemoryProvider(first_deferred)
    await run_worker_until(
        worker(async_engine, provider),
        lambda: status_counts(db).get(Status.RETRYING.value, 0) == 1,
    )
    # Published again while the first one waits to be retried.
    await publish(service, "receipt", "en", subject="Newest receipt for {{ name }}")
    await run_worker_until(
        worker(async_engine, provider), lambda: status_counts(db) == {Status.SENT.value: 2}
    )
    assert sorted(calls) == [
        "New receipt for Bob",
        "Old receipt for Ada",
        "Old receipt for Ada",
    ]
    assert get(db, pending.id).template_version == 1


async def test_a_rollback_is_what_new_messages_get(db, service):
    await publish(service, "receipt", "en", subject="One {{ name }}")
    await publish(service, "receipt", "en", subject="Two {{ name }}")
    await service.rollback(tenant="default", name="receipt", locale="en", version=1)
    assert enqueue(db, template="receipt", data={"name": "Ada"}).template_version == 1


async def test_a_message_that_does_not_render_with_its_version_is_refused_unwritten(db, service):
    await publish(service, "receipt", "en", subject="Receipt for {{ name }}")
    with pytest.raises(InvalidMessage, match="name"):
        enqueue(db, template="receipt", data={})
    assert status_counts(db) == {}


# --- locales ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wanted", "chosen"),
    [
        ("fr-CA", "fr-CA"),
        ("fr-ca", "fr-CA"),  # the tag's case is not its meaning
        ("fr-BE", "fr"),
        ("fr", "fr"),
        ("de-AT", "en"),  # none of its own: the template's default (the first published)
        (None, "en"),
    ],
)
async def test_the_locale_falls_back_to_its_language_then_the_default(db, service, wanted, chosen):
    for locale in ("en", "fr", "fr-CA"):
        await publish(service, "receipt", locale, subject=f"{locale} {{{{ name }}}}")
    message = enqueue(db, template="receipt", data={"name": "Ada"}, locale=wanted)
    assert message.template_locale == chosen
    stored = get(db, message.id)
    assert (stored.template_locale, stored.locale) == (chosen, message.locale)


async def test_a_locale_that_is_not_one_is_refused(db, service):
    for bad in ("fr_CA", "français", "x", "en-", "a" * 40):
        with pytest.raises(InvalidTemplate):
            await publish(service, "receipt", bad, subject="s")
        with pytest.raises(InvalidMessage, match="locale"):
            enqueue(db, template="welcome", data={"name": "Ada"}, locale=bad)
    assert version_rows(db) == [] and status_counts(db) == {}


# --- the sandbox and its budget ------------------------------------------------------------

ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ ''|attr('__class__') }}",
    "{{ '{0.__class__}'.format('') }}",
]


@pytest.mark.parametrize("escape", ESCAPES)
async def test_the_sandbox_refuses_known_escapes_and_nothing_is_written(db, service, escape):
    with pytest.raises(TemplateError) as refused:
        await publish(service, "receipt", "en", subject="s", html=f"<p>{escape}</p>")
    assert "<class" not in str(refused.value)
    assert version_rows(db) == []


async def test_a_runaway_render_is_stopped_by_the_budget(db, service):
    runaway = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(TemplateError):
        await publish(service, "receipt", "en", subject="s", html=runaway)
    assert time.monotonic() - started < 10  # the budget's second, not the loop's hours
    assert version_rows(db) == []


async def test_a_version_over_the_size_limit_is_refused(db, service):
    with pytest.raises(TemplateTooLarge):
        await publish(service, "receipt", "en", subject="s", html="x" * (600 * 1024))
    assert version_rows(db) == []


async def test_an_unknown_version_is_unknown(db, service):
    await publish(service, "receipt", "en", subject="s {{ name }}")
    with pytest.raises(UnknownTemplate):
        await service.rollback(tenant="default", name="receipt", locale="en", version=9)
    with pytest.raises(UnknownTemplate):
        await service.version(tenant="default", name="receipt", locale="de", version=1)


# --- layouts and tenants -----------------------------------------------------------------


async def test_a_layout_is_shared_within_a_tenant_and_pinned_with_the_version(
    db, async_engine, service
):
    await publish(service, "layout", "en", fields=LAYOUT)
    child = {
        "subject": "Hello {{ name }}",
        "html": '{% extends "layout" %}{% block body %}<p>Hi {{ name }}</p>{% endblock %}',
        "text": '{% extends "layout" %}{% block body %}Hi {{ name }}{% endblock %}',
        "sample_data": {"name": "Ada", "company": "Acme"},
    }
    published = await publish(service, "hello", "en", fields=child)
    layout_v1 = (await service.version(tenant="default", name="layout", locale="en")).id
    assert dict(published.dependencies) == {"layout": layout_v1}
    message = enqueue(db, template="hello", data={"name": "Ada", "company": "Acme"})
    # A new layout does not change what the pinned version renders.
    await publish(service, "layout", "en", fields={**LAYOUT, "html": "<div>NEW</div>"})
    provider = MemoryProvider()
    await run_worker_until(
        worker(async_engine, provider), lambda: status_counts(db) == {Status.SENT.value: 1}
    )
    (email,) = provider.sent
    assert "<p>Hi Ada</p>" in email.html and "<footer>Acme</footer>" in email.html
    assert "NEW" not in email.html
    assert email.text.strip().endswith("-- Acme")
    assert get(db, message.id).template_version == 1


async def test_tenants_never_reach_each_others_templates(db, async_engine, service):
    other, _ = create_tenant(db.engine, "globex")
    await publish(service, "layout", "en", fields=LAYOUT)
    await publish(service, "welcome", "en", subject="Acme's own welcome, {{ name }}")
    extends = '{% extends "layout" %}{% block body %}x{% endblock %}'
    with pytest.raises(TemplateError, match="layout"):
        await publish(service, "hello", "en", tenant=other.id, subject="s", html=extends)
    include = '{% include "layout" %}'
    with pytest.raises(TemplateError, match="layout"):
        await publish(service, "hello", "en", tenant=other.id, subject="s", html=include)
    # The default tenant's `welcome` replaced the file one for it alone.
    mine = enqueue(db, template="welcome", data={"name": "Ada"})
    theirs = enqueue(db, template="welcome", data={"name": "Ada"}, tenant_id=other.id)
    assert mine.template_version == 1 and theirs.template_version is None
    # A name only another tenant has is no template at all.
    with pytest.raises(InvalidMessage, match="unknown template"):
        enqueue(db, template="layout", data={"company": "x"}, tenant_id=other.id)
    provider = MemoryProvider()
    await run_worker_until(
        worker(async_engine, provider), lambda: status_counts(db) == {Status.SENT.value: 2}
    )
    subjects = sorted(e.subject for e in provider.sent)
    assert subjects[0] == "Acme's own welcome, Ada"
    assert "Acme's own" not in subjects[1]


async def test_an_mjml_version_is_compiled_once_when_published_and_sent_as_html(
    db, async_engine, service
):
    mjml = (
        "<mjml><mj-body><mj-section><mj-column>"
        "<mj-text>Hello {{ name }}</mj-text>"
        "</mj-column></mj-section></mj-body></mjml>"
    )
    fields = version_fields("Hi {{ name }}", html=mjml, format="mjml")
    published = await publish(service, "hello", "en", fields=fields)
    assert published.html == mjml  # the source, as written
    assert published.compiled_html is not None and "<table" in published.compiled_html
    enqueue(db, template="hello", data={"name": "Ada"})
    provider = MemoryProvider()
    await run_worker_until(
        worker(async_engine, provider), lambda: status_counts(db) == {Status.SENT.value: 1}
    )
    (email,) = provider.sent
    assert "Hello Ada" in email.html and "<mj-text>" not in email.html
    assert "Hello Ada" in email.text


async def test_mjml_that_does_not_compile_is_refused(db, service):
    fields = version_fields("Hi", html="<mjml><mj-body><mj-section>", format="mjml")
    with pytest.raises(TemplateError):
        await publish(service, "hello", "en", fields=fields)
    assert version_rows(db) == []
