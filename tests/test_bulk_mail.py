"""Bulk mail as the mailbox providers want it, on each database: send-bulk and the batch API
tag what they write as bulk; a bulk message goes out with List-Unsubscribe one-click to
mailbag's own link (PUBLIC_URL), Precedence and Feedback-ID, a transactional one with none
of them; a POST to the link (what Gmail sends) suppresses that recipient for that tenant
and a forged or foreign token is a 404; REQUIRE_UNSUBSCRIBE_FOR_BULK refuses a bulk message
that would have no unsubscribe target."""

from __future__ import annotations

from email import policy
from email.parser import BytesParser
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from typer.testing import CliRunner

import mailbag
from api_helpers import api_client, new_tenant, settings_for
from mailbag.cli import app
from mailbag.domain import bulk
from mailbag.domain.bulk import BadToken, UnsubscribeLinks
from mailbag.domain.message import new_message
from mailbag.domain.states import Status
from mailbag.providers.file import FileProvider
from mailbag.settings import Settings
from mailbag.store.schema import outbox_messages, suppressions
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig
from test_hooks_api import problem

from conftest import TestDB
from helpers import run_worker_until, status_counts

PUBLIC_URL = "https://mail.example.com"
runner = CliRunner()


def test_bulk_headers_leave_the_messages_own_and_keep_feedback_id_a_token() -> None:
    assert new_message(to="a@example.org", subject="s", text="t", tags=["bulk"]).bulk
    assert not new_message(to="a@example.org", subject="s", text="t", tags=["news"]).bulk
    assert bulk.bulk_headers({}, "t_1", "weekly news: 12") == {
        "Precedence": "bulk",
        "Feedback-ID": "weekly-news--12:t_1:mailbag",
    }
    own = bulk.bulk_headers({"precedence": "list"}, "acme", None)
    assert own == {"Feedback-ID": "message:acme:mailbag"}


def test_a_link_unsubscribes_its_own_recipient_and_a_changed_one_nobody() -> None:
    links = UnsubscribeLinks(PUBLIC_URL, b"k" * 32)
    url = links.link("acme", "Ada@Example.org", "m-1")
    assert url.startswith(f"{PUBLIC_URL}/v1/unsubscribe/")
    token = url.rsplit("/", 1)[1]
    who = links.read(token)
    assert (who.tenant_id, who.address, who.message_id) == ("acme", "ada@example.org", "m-1")
    for forged in (token[:-2] + "xx", "", "not.a.token"):
        with pytest.raises(BadToken):
            links.read(forged)
    with pytest.raises(BadToken):  # another deployment's key
        UnsubscribeLinks(PUBLIC_URL, b"o" * 32).read(token)


@pytest.mark.parametrize(
    ("given", "ok"),
    [
        ("https://mail.example.com/", True),
        ("https://mail.example.com/base", True),
        ("http://localhost:8025", True),
        ("http://mail.example.com", False),
        ("ftp://mail.example.com", False),
        ("https://", False),
        ("https://mail.example.com/?a=1", False),
    ],
)
def test_public_url_must_be_https_except_on_this_machine(given: str, ok: bool) -> None:
    if ok:
        assert Settings(public_url=given).public_url == given.rstrip("/")
    else:
        with pytest.raises(ValidationError, match="public_url"):
            Settings(public_url=given)


def parsed(path: Path) -> Any:
    return BytesParser(policy=policy.default).parsebytes(path.read_bytes())


async def test_a_bulk_message_carries_one_click_to_mailbags_link_which_suppresses_its_recipient(
    db: TestDB, async_engine: Any, tmp_path: Path
) -> None:
    tenant, key = new_tenant(db)
    settings = settings_for(db, public_url=PUBLIC_URL)
    with db.engine.begin() as conn:
        for to, tags in (("ada@example.org", ["bulk", "news"]), ("bob@example.org", [])):
            mailbag.enqueue(
                conn, to=to, subject="News", text="Hi", tags=tags, tenant_id=tenant,
                settings=settings,
            )  # fmt: skip
    folder = tmp_path / "mail"
    worker = Worker(
        engine=async_engine,
        provider=FileProvider(folder),
        catalog=builtin(),
        config=WorkerConfig(
            worker_id="bulk", poll_interval=0.05, unsubscribe=settings.unsubscribe_links
        ),
    )
    await run_worker_until(worker, lambda: status_counts(db).get(Status.SENT.value, 0) == 2)
    emails = {str(parsed(p)["To"]): parsed(p) for p in folder.glob("*.eml")}
    news, receipt = emails["ada@example.org"], emails["bob@example.org"]
    link = news["List-Unsubscribe"].strip("<>")
    assert link.startswith(f"{PUBLIC_URL}/v1/unsubscribe/")
    assert news["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert news["Precedence"] == "bulk"
    assert news["Feedback-ID"] == f"message:{tenant}:mailbag"
    for header in ("List-Unsubscribe", "Precedence", "Feedback-ID"):
        assert header not in receipt

    path = link.removeprefix(PUBLIC_URL)
    async with api_client(db, public_url=PUBLIC_URL) as client:
        page = await client.get(path)
        assert page.status_code == 200 and "ada@example.org" in page.text
        assert f'action="{path}"' in page.text
        for _ in range(2):  # a provider may POST twice: the same answer, one suppression
            done = await client.post(path, data={"List-Unsubscribe": "One-Click"})
            assert done.status_code == 200 and "Unsubscribed" in done.text
        problem(await client.post(path[:-3] + "abc"), 404, "not-found")
    async with api_client(db) as client:  # no PUBLIC_URL: no links, and none are honoured
        problem(await client.post(path), 404, "not-found")
    with db.engine.connect() as conn:
        rows = conn.execute(select(suppressions)).all()
    assert [(r.tenant_id, r.email, r.reason) for r in rows] == [
        (tenant, "ada@example.org", "unsubscribed")
    ]
    async with api_client(db, key) as client:  # suppressed for that tenant from now on
        again = await client.post(
            "/v1/messages", json={"to": "ada@example.org", "subject": "x", "text": "y"}
        )
    assert again.status_code == 201 and again.json()["status"] == "failed"


def test_send_bulk_writes_bulk_mail(
    db: TestDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    sheet = tmp_path / "people.csv"
    sheet.write_text("to,name\nada@example.org,Ada\n")
    done = runner.invoke(app, ["send-bulk", str(sheet), "--template", "welcome"])
    assert done.exit_code == 0, done.output
    with db.engine.connect() as conn:
        (flag,) = conn.execute(select(outbox_messages.c.bulk)).scalars().all()
    assert flag is True


async def test_the_batch_api_writes_bulk_mail_and_the_unsubscribe_rule_refuses_it_untargeted(
    db: TestDB,
) -> None:
    _, key = new_tenant(db)
    item = {"to": "ada@example.org", "subject": "News", "text": "Hi", "tags": ["news"]}
    with_target = {**item, "to": "bob@example.org", "unsubscribe_url": "https://x.example/u"}
    batch = {"messages": [item, with_target]}
    async with api_client(db, key, require_unsubscribe_for_bulk=True) as client:
        answer = await client.post(
            "/v1/messages/batch", json=batch, headers={"Idempotency-Key": "b"}
        )
        results = answer.json()["results"]
        assert [r["result"] for r in results] == ["invalid", "created"], results
        assert "needs an unsubscribe target" in str(results[0])
        single = await client.post("/v1/messages", json={**item, "tags": ["news", "bulk"]})
        assert single.status_code == 422
        assert "unsubscribe_url" in single.json()["errors"]
        plain = await client.post("/v1/messages", json=item)  # not bulk: nothing asked
        assert plain.status_code == 201
    async with api_client(
        db, key, require_unsubscribe_for_bulk=True, public_url=PUBLIC_URL
    ) as client:  # mailbag makes the link: accepted
        answer = await client.post(
            "/v1/messages/batch", json=batch, headers={"Idempotency-Key": "c"}
        )
        assert [r["result"] for r in answer.json()["results"]] == ["created", "created"]
    with db.engine.connect() as conn:
        flags = conn.execute(select(outbox_messages.c.bulk)).scalars().all()
    assert sorted(flags) == [False, True, True, True]  # the plain message, then the batches'
