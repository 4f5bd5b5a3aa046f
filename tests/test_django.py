"""mailbag.django in a real Django project (tests/django_project), on SQLite and PostgreSQL.

Django is set up once in this test process (a session fixture: Django can be set up only
once per process), with the SQLite database as the "default" alias and, when
MAILBAG_TEST_POSTGRES_URL is given, a scratch PostgreSQL database as "pg". The management
commands run as real `manage.py` processes: `mailbag_migrate` makes the schema, one
`mailbag_worker` per database sends to the SMTP test server (aiosmtpd) in this process,
and every delivery is checked on the bytes the server received.

What is shown, per database:
- an email sent inside `transaction.atomic()` is written on Django's own connection: the
  transaction sees it, another connection does not until the commit; a rollback leaves
  nothing, and the worker never sends it;
- alternatives, attachments (a PDF, an inline image with a Content-ID), cc, bcc (envelope
  only), reply-to and extra headers arrive intact;
- the Idempotency-Key header enqueues once; fail_silently; unsupported content is refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from email import policy
from email.message import EmailMessage as ParsedEmail
from email.mime.image import MIMEImage
from email.parser import BytesParser
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from intake_cases import CASES
from mailbag.domain.message import InvalidMessage
from mailbag.store.database import READ_ONLY, make_engine
from mailbag.store.schema import outbox_messages

from conftest import SERVER_URLS, _server_database
from helpers import tiny_pdf, tiny_png
from smtp_server import ReceivedMessage, RecordingSMTPServer

MANAGE = Path(__file__).resolve().parent / "django_project" / "manage.py"
ALIASES = {"sqlite": "default", "postgresql": "pg"}


# --- the project, its databases, the SMTP server and the workers ---------------------------


@pytest.fixture(scope="session")
def _django_postgres_url() -> Iterator[str]:
    """A scratch database of this module's own: the workers it runs must never claim the
    messages of other tests sharing conftest's."""
    yield from _server_database("postgresql")


@pytest.fixture(scope="session")
def django_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """Django set up in this process on the test databases, both migrated: the project's
    own tables by `migrate`, mailbag's by `manage.py mailbag_migrate` (a real process)."""
    env = {
        "DJANGO_SETTINGS_MODULE": "django_project.settings",
        "MAILBAG_TEST_DJANGO_SQLITE": str(tmp_path_factory.mktemp("django") / "project.db"),
    }
    if os.environ.get(SERVER_URLS["postgresql"]):
        env["MAILBAG_TEST_DJANGO_POSTGRES"] = request.getfixturevalue("_django_postgres_url")
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    import django
    from django.core.management import call_command
    from django.db import connections

    django.setup()
    # Read once, by setup: left in the environment, they would reach every process the
    # tests after these start (a Celery worker then sets up this Django project).
    for name, value in before.items():
        if value is None:
            os.environ.pop(name)
        else:
            os.environ[name] = value
    for alias in connections:
        call_command("migrate", database=alias, verbosity=0)
        done = manage(env, "mailbag_migrate", "--database", alias)
        assert done.returncode == 0, done.stderr
        assert "schema at revision" in done.stdout
    yield env
    connections.close_all()


def manage(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(params=list(ALIASES), ids=list(ALIASES))
def alias(request: pytest.FixtureRequest, django_env: dict[str, str]) -> str:
    from django.conf import settings

    name = ALIASES[request.param]
    if name not in settings.DATABASES:
        pytest.skip(f"{SERVER_URLS['postgresql']} not set: postgresql suite skipped")
    return name


@pytest.fixture(scope="session")
def smtp() -> Iterator[RecordingSMTPServer]:
    with RecordingSMTPServer() as server:
        yield server


@pytest.fixture(scope="session")
def _workers(
    django_env: dict[str, str], smtp: RecordingSMTPServer
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The running workers by alias; stopped before the SMTP server and the databases go."""
    running: dict[str, subprocess.Popen[bytes]] = {}
    yield running
    for process in running.values():
        process.send_signal(signal.SIGTERM)
    for name, process in running.items():
        # Drained and stopped on SIGTERM, as `mailbag worker` does.
        assert process.wait(timeout=30) == 0, f"the {name} worker did not stop cleanly"


@pytest.fixture
def worker(
    alias: str,
    django_env: dict[str, str],
    smtp: RecordingSMTPServer,
    _workers: dict[str, subprocess.Popen[bytes]],
    tmp_path_factory: pytest.TempPathFactory,
) -> subprocess.Popen[bytes]:
    """`manage.py mailbag_worker --database <alias>` running (one per database), sending to
    the test server: its port comes from the environment, the rest from settings.MAILBAG."""
    if alias not in _workers:
        log = tmp_path_factory.mktemp("worker") / f"{alias}.log"  # to read when one fails
        with log.open("wb") as output:
            _workers[alias] = subprocess.Popen(
                [sys.executable, str(MANAGE), "mailbag_worker", "--database", alias],
                env={**os.environ, **django_env, "MAILBAG_SMTP_PORT": str(smtp.port)},
                stdout=output,
                stderr=subprocess.STDOUT,
            )
    process = _workers[alias]
    assert process.poll() is None, "the worker stopped"
    return process


@pytest.fixture
def outbox(alias: str) -> Iterator[Engine]:
    """Another connection to the same database: mailbag's own engine, not Django's."""
    from mailbag.django.conf import database_url

    engine = make_engine(database_url(alias), null_pool=True)
    yield engine
    engine.dispose()


def count(engine: Engine, **where: Any) -> int:
    query = select(func.count()).select_from(outbox_messages)
    for column, value in where.items():
        query = query.where(outbox_messages.c[column] == value)
    with engine.connect().execution_options(**READ_ONLY) as conn:
        return int(conn.execute(query).scalar_one())


def backend(alias: str, **options: Any) -> Any:
    from django.core.mail import get_connection

    return get_connection(database=alias, **options)


def arrived(smtp: RecordingSMTPServer, subject: str, timeout: float = 20) -> ReceivedMessage:
    def found() -> list[ReceivedMessage]:
        return [m for m in smtp.accepted if parsed(m)["Subject"] == subject]

    assert smtp.wait_until(lambda: bool(found()), timeout=timeout), f"{subject!r} never arrived"
    (message,) = found()
    return message


def parsed(received: ReceivedMessage) -> ParsedEmail:
    message = BytesParser(policy=policy.default).parsebytes(received.raw)
    assert isinstance(message, ParsedEmail)
    return message


def unique(text: str) -> str:
    return f"{text} {uuid.uuid4().hex[:8]}"


# --- transactions ------------------------------------------------------------------------


def test_an_email_is_written_in_the_callers_transaction_and_sent_once_it_commits(
    alias, outbox, worker, smtp
):
    from django.core.mail import send_mail
    from django.db import connections, transaction

    from mailbag.django import connection

    from django_project.shop.models import Order

    # A fresh engine: SQLAlchemy's first connect (dialect set-up, then a rollback it would
    # do) happens here, inside the caller's transaction, after its first write.
    connection._engines.pop(alias, None)
    subject = unique("Your order")
    with transaction.atomic(using=alias):
        Order.objects.using(alias).create(email="ann@example.com", reference=subject)
        sent = send_mail(
            subject, "Thanks!", None, ["Ann <ann@example.com>"], connection=backend(alias)
        )
        assert sent == 1
        # Django's connection, in the same transaction, sees the row; no other one does.
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM outbox_messages WHERE subject = %s", [subject])
            assert cursor.fetchone()[0] == 1
        assert count(outbox, subject=subject) == 0
    assert count(outbox, subject=subject) == 1
    assert Order.objects.using(alias).filter(reference=subject).exists()

    email = parsed(arrived(smtp, subject))
    assert email["To"].addresses[0].display_name == "Ann"
    assert email["To"].addresses[0].addr_spec == "ann@example.com"
    # Django's DEFAULT_FROM_EMAIL is mailbag's FROM_EMAIL (and FROM_NAME) here.
    assert (email["From"].addresses[0].display_name, email["From"].addresses[0].addr_spec) == (
        "Shop",
        "shop@example.com",
    )
    body = email.get_body(("plain",))
    assert body is not None and body.get_content().strip() == "Thanks!"


def test_a_rolled_back_transaction_leaves_no_email_and_nothing_is_sent(alias, outbox, worker, smtp):
    from django.core.mail import send_mail
    from django.db import transaction

    from django_project.shop.models import Order

    dropped, kept = unique("Never sent"), unique("Sent after")
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        Order.objects.using(alias).create(email="ann@example.com", reference=dropped)
        assert send_mail(dropped, "No.", None, ["ann@example.com"], connection=backend(alias)) == 1
        raise RuntimeError("the order failed")
    assert count(outbox, subject=dropped) == 0
    assert not Order.objects.using(alias).filter(reference=dropped).exists()

    # A later email goes out; the rolled-back one never does.
    assert send_mail(kept, "Yes.", None, ["ann@example.com"], connection=backend(alias)) == 1
    arrived(smtp, kept)
    assert not [m for m in smtp.arrived if parsed(m)["Subject"] == dropped]


def test_workers_in_this_process_are_woken_when_django_commits_and_not_before(alias):
    from django.core.mail import send_mail
    from django.db import transaction

    from mailbag import wakeup

    woken: list[int] = []
    unsubscribe = wakeup.subscribe(lambda: woken.append(1))
    try:
        with transaction.atomic(using=alias):
            send_mail(unique("Wake"), "x", None, ["ann@example.com"], connection=backend(alias))
            assert woken == []
        assert woken == [1]
        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            send_mail(unique("Sleep"), "x", None, ["ann@example.com"], connection=backend(alias))
            raise RuntimeError
        assert woken == [1]
    finally:
        unsubscribe()


def test_a_refused_enqueue_inside_the_callers_transaction_leaves_it_usable(alias, outbox):
    """The backend writes in a savepoint: when enqueue refuses a message, the caller's
    transaction goes on (with fail_silently, the backend returns 0)."""
    from django.core.mail import EmailMessage
    from django.db import transaction

    from django_project.shop.models import Order

    reference = unique("order")
    with transaction.atomic(using=alias):
        # From an address that is not a sender identity: refused by enqueue, in the database.
        message = EmailMessage(
            "Hi", "Body", "stranger@example.com", ["ann@example.com"], connection=backend(alias)
        )
        with pytest.raises(InvalidMessage, match="not a sender identity"):
            message.send()
        assert backend(alias, fail_silently=True).send_messages([message]) == 0
        Order.objects.using(alias).create(email="ann@example.com", reference=reference)
    assert Order.objects.using(alias).filter(reference=reference).exists()


# --- content ---------------------------------------------------------------------------------


def test_alternatives_attachments_inline_images_and_recipients_arrive_intact(alias, worker, smtp):
    from django.core.mail import EmailMultiAlternatives

    subject = unique("Invoice März")
    pdf, png = tiny_pdf(), tiny_png()
    message = EmailMultiAlternatives(
        subject=subject,
        body="Your invoice is attached.",
        to=["Ann Ångström <ann@example.com>", "bob@example.com"],
        cc=['"Carol, CFO" <carol@example.com>'],
        bcc=["Dave Hidden <dave.hidden@example.com>"],
        reply_to=['"Help, Desk" <help@example.com>', "billing@example.com"],
        headers={"List-Unsubscribe": "<https://example.com/u/1>", "X-Order": "42"},
        connection=backend(alias),
    )
    message.attach_alternative('<p>Your invoice.</p><img src="cid:logo@shop.test">', "text/html")
    message.attach("Rechnung März.pdf", pdf, "application/pdf")
    message.attach("notes.txt", "Grüße aus Köln\n", "text/plain")
    logo = MIMEImage(png, "png")
    logo.add_header("Content-ID", "<logo@shop.test>")
    logo.add_header("Content-Disposition", "inline", filename="logo.png")
    message.attach(logo)
    assert message.send() == 1

    received = arrived(smtp, subject)
    assert sorted(received.rcpt_tos) == sorted(
        ["ann@example.com", "bob@example.com", "carol@example.com", "dave.hidden@example.com"]
    )
    email = parsed(received)

    def mailboxes(header: str) -> list[tuple[str, str]]:
        return [(a.display_name, a.addr_spec) for a in email[header].addresses]

    assert mailboxes("To") == [("Ann Ångström", "ann@example.com"), ("", "bob@example.com")]
    assert mailboxes("Cc") == [("Carol, CFO", "carol@example.com")]
    assert mailboxes("Reply-To") == [
        ("Help, Desk", "help@example.com"),
        ("", "billing@example.com"),
    ]
    assert "Bcc" not in email and b"dave.hidden" not in received.raw.lower()
    assert email["List-Unsubscribe"] == "<https://example.com/u/1>"
    assert email["X-Order"] == "42"
    assert email["Subject"] == subject

    text, html = email.get_body(("plain",)), email.get_body(("html",))
    assert text is not None and text.get_content().strip() == "Your invoice is attached."
    assert html is not None and 'src="cid:logo@shop.test"' in html.get_content()
    files = [p for p in email.iter_attachments() if not p["Content-ID"]]
    assert [(p.get_filename(), p.get_content_type()) for p in files] == [
        ("Rechnung März.pdf", "application/pdf"),
        ("notes.txt", "text/plain"),
    ]
    assert files[0].get_content() == pdf
    assert files[1].get_payload(decode=True) == "Grüße aus Köln\n".encode()
    (related,) = [p for p in email.walk() if p.get_content_type() == "multipart/related"]
    (inline,) = [p for p in related.iter_parts() if p["Content-ID"]]
    assert str(inline["Content-ID"]).strip("<>") == "logo@shop.test"
    assert inline.get_content_type() == "image/png"
    assert inline.get_content() == png
    assert inline.get_content_disposition() == "inline"


def test_an_html_body_and_a_sender_identity_from_address_arrive_as_given(
    alias, outbox, worker, smtp
):
    from django.core.mail import EmailMessage

    from mailbag.clock import utcnow
    from mailbag.store import senders
    from mailbag.store.plan import run

    with outbox.begin() as conn:
        run(conn, senders.add("default", "billing@shop.example", None, utcnow()))
    subject = unique("Receipt")
    message = EmailMessage(
        subject,
        "<h1>Paid</h1><p>Thank you.</p>",
        "Shop Billing <billing@shop.example>",
        ["ann@example.com"],
        connection=backend(alias),
    )
    message.content_subtype = "html"
    assert message.send() == 1

    received = arrived(smtp, subject)
    email = parsed(received)
    assert email["From"].addresses[0].display_name == "Shop Billing"
    assert email["From"].addresses[0].addr_spec == "billing@shop.example"
    html, text = email.get_body(("html",)), email.get_body(("plain",))
    assert html is not None and "<h1>Paid</h1>" in html.get_content()
    assert text is not None and "Paid" in text.get_content()  # made from the HTML


def test_enqueue_sends_a_mailbag_template_written_in_the_callers_transaction(
    alias, outbox, worker, smtp
):
    from django.db import transaction

    from mailbag.django import enqueue

    from django_project.shop.models import Order

    name = unique("Ann")
    with transaction.atomic(using=alias):
        Order.objects.using(alias).create(email="ann@example.com", reference=name)
        result = enqueue(
            to="ann@example.com",
            template="welcome",
            data={"name": name, "product": "the shop"},
            priority="high",
            using=alias,
        )
        assert result.created
        assert count(outbox, id=result.message.id) == 0
    email = parsed(arrived(smtp, f"Welcome to the shop, {name}"))
    assert email["To"].addresses[0].addr_spec == "ann@example.com"
    with pytest.raises(InvalidMessage, match="unknown template"):
        enqueue(to="ann@example.com", template="no-such-template", using=alias)


def test_the_default_address_under_another_name_needs_a_sender_identity(alias, outbox):
    """Only mailbag's own FROM_EMAIL with its FROM_NAME (or none) is left to the worker: a
    different name cannot be shown without a sender identity, so it is refused, not lost."""
    from django.core.mail import EmailMessage

    def send(from_email: str) -> int:
        message = EmailMessage(unique("From"), "x", from_email, ["ann@example.com"])
        return int(backend(alias).send_messages([message]))

    assert send("shop@example.com") == 1
    assert send("Shop <shop@example.com>") == 1
    with pytest.raises(InvalidMessage, match="not a sender identity"):
        send("Someone Else <shop@example.com>")


def test_the_idempotency_key_header_enqueues_a_message_once(alias, outbox):
    from django.core.mail import EmailMessage

    key = unique("welcome-ann").replace(" ", "-")

    def send() -> int:
        message = EmailMessage(
            "Welcome", "Hi Ann", None, ["ann@example.com"], headers={"Idempotency-Key": key}
        )
        return int(backend(alias).send_messages([message]))

    assert send() == 1
    assert send() == 1  # already in the outbox under that key: counted, not written again
    assert count(outbox, idempotency_key=key) == 1


def test_a_replayed_key_reads_the_stored_message_back_through_djangos_connection(alias):
    """The values Django's connection hands back (jsonb as text on PostgreSQL, DATETIME
    parsed by Django's SQLite converters) come out of the plans typed as usual."""
    from django.db import transaction

    from mailbag.django.connection import on_django_connection
    from mailbag.domain.message import new_message
    from mailbag.services.outbox import write_many

    key = unique("replay").replace(" ", "-")
    message = new_message(
        to="ann@example.com",
        subject="Hi",
        text="Hi",
        headers={"X-Order": "7"},
        tags=["welcome"],
        metadata={"user": 7},
        idempotency_key=key,
    )
    with transaction.atomic(using=alias), on_django_connection(alias) as conn:
        (first,) = write_many(conn, [message])
    with transaction.atomic(using=alias), on_django_connection(alias) as conn:
        (again,) = write_many(conn, [message])
    assert first.created and not again.created
    assert again.message.id == first.message.id
    assert again.message.headers == {"X-Order": "7"}
    assert list(again.message.tags) == ["welcome"] and again.message.metadata == {"user": 7}
    assert again.message.created_at == first.message.created_at
    assert again.message.created_at.utcoffset() is not None


def test_a_message_to_suppressed_addresses_only_is_not_counted_as_enqueued(alias, outbox):
    from django.core.mail import send_mail

    from mailbag.clock import utcnow
    from mailbag.store import suppressions
    from mailbag.store.plan import run

    gone = f"gone-{uuid.uuid4().hex[:8]}@example.com"
    with outbox.begin() as conn:
        run(conn, suppressions.add(tenant_id="default", email=gone, reason="bounce", now=utcnow()))
    subject = unique("Suppressed")
    assert send_mail(subject, "x", None, [gone], connection=backend(alias)) == 0
    assert count(outbox, subject=subject, status="failed") == 1  # written, and never sent


def test_fail_silently_skips_an_invalid_message_and_enqueues_the_others(alias, outbox):
    from django.core.mail import EmailMessage

    good, bad = unique("Good"), unique("Bad")
    messages = [
        EmailMessage(bad, "x", None, ["not an address"]),
        EmailMessage(good, "x", None, ["ann@example.com"]),
    ]
    with pytest.raises(InvalidMessage, match="to"):
        backend(alias).send_messages(messages)
    assert count(outbox, subject=good) == 0  # all checked before anything is written

    assert backend(alias, fail_silently=True).send_messages(messages) == 1
    assert (count(outbox, subject=good), count(outbox, subject=bad)) == (1, 0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda m: m.attach_alternative("BEGIN:VCALENDAR", "text/calendar"), "alternatives"),
        (
            lambda m: (
                m.attach_alternative("<p>2</p>", "text/html")
                or m.attach_alternative("<p>3</p>", "text/html")
            ),
            "alternatives",
        ),
        (lambda m: m.extra_headers.update({"To": "someone@example.com"}), "headers"),
        (lambda m: m.extra_headers.update({"Message-ID": "<x@example.com>"}), "headers"),
    ],
    ids=["calendar-alternative", "two-html-bodies", "to-header", "message-id-header"],
)
def test_what_mailbag_cannot_carry_is_refused_not_dropped(alias, outbox, change, field):
    from django.core.mail import EmailMultiAlternatives

    subject = unique("Refused")
    message = EmailMultiAlternatives(subject, "x", None, ["ann@example.com"])
    change(message)
    with pytest.raises(InvalidMessage) as raised:
        backend(alias).send_messages([message])
    assert field in raised.value.errors
    assert count(outbox, subject=subject) == 0


def test_the_backend_and_enqueue_refuse_what_the_configured_provider_cannot_carry(alias, outbox):
    """With PROVIDER=brevo, whose API takes no `.bin` attachment, both Django doors refuse
    one at once (as mailbag.enqueue and the API do) and write nothing; a `.pdf` goes."""
    from django.conf import settings
    from django.core.mail import EmailMessage
    from django.test import override_settings

    from mailbag.django import enqueue
    from mailbag.domain.content import Attachment

    brevo = {**settings.MAILBAG, "PROVIDER": "brevo", "BREVO_API_KEY": "xkeysib-test"}
    subject = unique("Data")

    def email(filename: str) -> EmailMessage:
        message = EmailMessage(subject, "Attached.", None, ["ann@example.com"])
        message.attach(filename, b"\x00\x01 raw bytes", "application/octet-stream")
        return message

    def enqueued(filename: str) -> Any:
        data = Attachment(filename, "application/octet-stream", b"\x00\x01 raw bytes")
        return enqueue(
            to="ann@example.com", subject=subject, text="x", attachments=[data], using=alias
        )

    with override_settings(MAILBAG=brevo):
        for door in (lambda name: backend(alias).send_messages([email(name)]), enqueued):
            with pytest.raises(InvalidMessage) as refused:
                door("data.bin")
            assert set(refused.value.errors) == {"attachments"}
            assert "(brevo) does not accept" in str(refused.value)
        assert count(outbox, subject=subject) == 0
        assert backend(alias).send_messages([email("data.pdf")]) == 1
        assert enqueued("data.pdf").created
    assert count(outbox, subject=subject) == 2


def test_enqueue_renders_its_template_once_before_anything_is_written(alias, outbox):
    from mailbag.django import enqueue

    key = unique("welcome")
    with pytest.raises(InvalidMessage, match="does not render with this data"):
        enqueue(to="ann@example.com", template="welcome", data={}, idempotency_key=key)
    assert count(outbox, idempotency_key=key) == 0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_doors_refuse_what_every_door_refuses_with_the_one_doors_words(alias, outbox, case):
    """tests/intake_cases.py's bad inputs through mailbag.django.enqueue (every case) and
    the email backend (what an EmailMessage can say: an attachment), with the case's
    provider: refused with services.intake's words, as the API, the CLI and mailbag.enqueue
    refuse them (test_intake.py), and nothing written."""
    from django.conf import settings
    from django.core.mail import EmailMessage
    from django.test import override_settings

    from mailbag.django import enqueue

    deployment = {**settings.MAILBAG, "PROVIDER": case.provider, "BREVO_API_KEY": "xkeysib-test"}
    key = unique("intake").replace(" ", "-")
    said = {}
    with override_settings(MAILBAG=deployment):
        with pytest.raises(InvalidMessage) as refused:
            enqueue(using=alias, idempotency_key=key, **case.python_fields())
        said["mailbag.django.enqueue"] = refused.value.errors[case.field]
        if case.template is None:
            email = EmailMessage(
                case.fields["subject"], case.fields["text"], None, [case.fields["to"]]
            )
            for name, content in case.files.items():
                email.attach(name, content, "application/octet-stream")
            with pytest.raises(InvalidMessage) as refused:
                backend(alias).send_messages([email])
            said["EmailBackend"] = refused.value.errors[case.field]
    assert said == dict.fromkeys(said, case.refusal(outbox))
    assert len(said) == (1 if case.template else 2)
    assert count(outbox, idempotency_key=key) == 0
    if case.template is None:
        assert count(outbox, subject=case.fields["subject"]) == 0


# --- settings and commands -------------------------------------------------------------------


def test_the_worker_database_url_is_the_django_databases(alias, django_env):
    from mailbag.django.conf import database_url

    url = database_url(alias)
    if alias == "default":
        assert url == f"sqlite:///{Path(django_env['MAILBAG_TEST_DJANGO_SQLITE']).resolve()}"
    else:
        assert url == django_env["MAILBAG_TEST_DJANGO_POSTGRES"]


@pytest.mark.parametrize(
    ("vendor", "params", "expected"),
    [
        (
            "postgresql",
            {
                "NAME": "shop",
                "USER": "app",
                "PASSWORD": "p@ss word",
                "HOST": "db.internal",
                "PORT": "6432",
                "OPTIONS": {"sslmode": "require", "server_side_binding": True},
            },
            ("app", "p@ss word", "db.internal", 6432, "shop", {"sslmode": "require"}),
        ),
        (
            "postgresql",
            {"NAME": "shop", "HOST": "/var/run/postgresql", "OPTIONS": {"service": "main"}},
            (None, None, None, None, "shop", {"host": "/var/run/postgresql", "service": "main"}),
        ),
        (
            "sqlite",
            {"NAME": "/srv/app/db.sqlite3"},
            (None, None, None, None, "/srv/app/db.sqlite3", {}),
        ),
    ],
    ids=["postgresql-tcp", "postgresql-socket", "sqlite"],
)
def test_the_worker_reaches_the_database_django_is_configured_with(
    django_env, vendor, params, expected
):
    from sqlalchemy.engine import make_url

    from mailbag.django.conf import url_of

    url = make_url(url_of("default", vendor, params))
    assert url.drivername == vendor
    assert (url.username, url.password, url.host, url.port, url.database, dict(url.query)) == (
        expected
    )


@pytest.mark.parametrize("name", [":memory:", "file:memdb1?mode=memory&cache=shared", ""])
def test_an_in_memory_or_unnamed_sqlite_database_is_refused(django_env, name):
    from django.core.exceptions import ImproperlyConfigured

    from mailbag.django.conf import url_of

    with pytest.raises(ImproperlyConfigured, match="in-memory"):
        url_of("default", "sqlite", {"NAME": name})
    with pytest.raises(ImproperlyConfigured, match="mysql"):
        url_of("default", "mysql", {"NAME": "shop"})


def test_an_unknown_mailbag_setting_or_backend_option_is_refused(alias):
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from mailbag.django import EmailBackend

    with (
        override_settings(MAILBAG={"PROVIDR": "smtp"}),
        pytest.raises(ImproperlyConfigured, match="PROVIDR"),
    ):
        EmailBackend(database=alias)
    with pytest.raises(TypeError, match="colour"):
        EmailBackend(database=alias, colour="blue")
    with pytest.raises(ImproperlyConfigured, match="auth_user"):
        EmailBackend(database=alias, username="me", password="secret")


def test_backend_options_as_mailers_passes_them_win_over_settings(alias, outbox):
    """Django 6.1's MAILERS gives OPTIONS to the backend as keyword arguments (and the
    entry's name as `alias`); EMAIL_BACKEND's backend takes settings.MAILBAG's."""
    from django.core.mail import EmailMessage

    from mailbag.django import EmailBackend

    subject = unique("Tenant")
    mailer = EmailBackend(alias="transactional", database=alias, tenant="shop-eu")
    assert mailer.send_messages([EmailMessage(subject, "x", None, ["ann@example.com"])]) == 1
    assert count(outbox, subject=subject, tenant_id="shop-eu") == 1


def test_system_checks_report_unusable_settings_and_a_deferred_sqlite(django_env):
    from django.core.checks import run_checks
    from django.db import connections
    from django.test import override_settings

    def reported() -> set[str]:
        return {message.id for message in run_checks(tags=["mailbag"])}

    assert reported() == set()
    with override_settings(MAILBAG={"DATABASE": "missing"}):
        assert reported() == {"mailbag.E001"}
    with override_settings(MAILBAG={"BATCH_SIZE": 0}):
        assert reported() == {"mailbag.E001"}
    options = connections["default"].settings_dict["OPTIONS"]
    mode = options.pop("transaction_mode")
    try:
        assert reported() == {"mailbag.W001"}
    finally:
        options["transaction_mode"] = mode


def test_system_checks_name_an_unknown_provider_and_a_missing_secret_key(
    django_env, monkeypatch, tmp_path
):
    """`manage.py check` passed PROVIDER "smpt" and a server database without a key; the
    worker then refused at once. Both are reported at start now."""
    from django.conf import settings
    from django.core.checks import run_checks
    from django.test import override_settings

    from mailbag import providers

    monkeypatch.delenv("MAILBAG_SECRET_KEY", raising=False)
    monkeypatch.delenv("MAILBAG_PROVIDER", raising=False)

    def reported(**mailbag: Any) -> dict[str, str]:
        with override_settings(MAILBAG=mailbag):
            return {
                message.id: f"{message.msg} {message.hint}"
                for message in run_checks(tags=["mailbag"])
            }

    given = dict(settings.MAILBAG)
    assert reported(**given) == {}
    typo = reported(**{**given, "PROVIDER": "smpt"})
    assert set(typo) == {"mailbag.E002"}
    assert "'smpt'" in typo["mailbag.E002"]
    assert all(name in typo["mailbag.E002"] for name in providers.available())
    keyless = {k: v for k, v in given.items() if k != "SECRET_KEY"}
    assert reported(**keyless) == {}  # SQLite: a key file beside the database will do
    short = reported(**{**given, "SECRET_KEY": "too-short"})
    assert set(short) == {"mailbag.E001"} and "SECRET_KEY" in short["mailbag.E001"]
    assert "too-short" not in short["mailbag.E001"]  # a secret never in a message
    if "pg" in settings.DATABASES:
        missing = reported(**{**keyless, "DATABASE": "pg"})
        assert set(missing) == {"mailbag.E003"}
        assert "SECRET_KEY" in missing["mailbag.E003"]

    # And as an operator runs it: `manage.py check` fails, naming the provider.
    (tmp_path / "typo_settings.py").write_text(
        "from django_project.settings import *  # noqa: F403\n"
        'MAILBAG = {**MAILBAG, "PROVIDER": "smpt"}  # noqa: F405\n'
    )
    typo_env = {
        **django_env,
        "DJANGO_SETTINGS_MODULE": "typo_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    done = manage(typo_env, "check")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "mailbag.E002" in done.stderr and "'smpt'" in done.stderr and "smtp" in done.stderr


def test_mailbag_stats_counts_the_outbox_of_the_django_database(alias, django_env, outbox):
    from django.core.mail import send_mail

    send_mail(unique("Counted"), "x", None, ["ann@example.com"], connection=backend(alias))
    done = manage(django_env, "mailbag_stats", "--json", "--database", alias)
    assert done.returncode == 0, done.stderr
    assert sum(json.loads(done.stdout)["counts"].values()) == count(outbox)


def test_a_command_with_bad_settings_says_so_and_exits_non_zero(django_env):
    bad = {**django_env, "MAILBAG_BATCH_SIZE": "0"}
    done = manage(bad, "mailbag_worker")  # stopped by the system check
    assert done.returncode == 1
    assert "mailbag.E001" in done.stderr and "BATCH_SIZE" in done.stderr
    done = manage(bad, "mailbag_worker", "--skip-checks")  # then by mailbag's own settings
    assert done.returncode == 2
    assert "invalid settings" in done.stderr and "batch_size" in done.stderr
    done = manage(django_env, "mailbag_stats", "--database", "nope")
    assert done.returncode != 0
    assert "no database 'nope'" in done.stderr
