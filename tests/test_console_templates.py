"""Tenants' templates in the operator console through the real app, on each database: the
index, the editor with its preview (nothing written), publish, the versions with their diff
and rollback (with its confirmation), the message page's version, and what is refused:
missing CSRF tokens, sandbox escapes, bad names, locales, versions, JSON and sizes."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

import mailbag
from api_helpers import new_tenant
from mailbag.console.templates_editor import EDITOR_POLICY, SCRIPT_PATH, diff_lines
from mailbag.domain.templates import SAMPLE_DATA_MAX_BYTES, SUBJECT_SOURCE_MAX
from mailbag.settings import Settings
from mailbag.store.schema import template_versions
from test_console import ACTOR, console, csrf_in

from conftest import TestDB

RECEIPT = {
    "subject": "Receipt {{ number }}",
    "html": "<p>Hello {{ name }},</p>\n<p>Your receipt {{ number }}.</p>\n",
    "text": "Hello {{ name }},\nyour receipt {{ number }}.\n",
    "sample_data": json.dumps({"name": "Ada", "number": 7}),
    "format": "jinja",
}
ESCAPE = "{{ ''.__class__.__mro__ }}"


def url(tenant: str = "default", name: str = "receipt", locale: str = "en") -> str:
    return f"/admin/tenants/{tenant}/templates/{name}/{locale}"


def version_count(db: TestDB) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(template_versions)).scalar_one())


async def post(
    client: httpx.AsyncClient, path: str, *, csrf: bool = True, **fields: str
) -> httpx.Response:
    """A form as the browser sends it: the CSRF token from the page it was on."""
    token = csrf_in(await client.get("/admin")) if csrf else None
    return await client.post(path, data={**({"csrf": token} if token else {}), **fields})


async def publish(client: httpx.AsyncClient, page: str = url(), **changes: str) -> httpx.Response:
    return await post(client, f"{page}/publish", **{**RECEIPT, **changes})


def current_in(page: httpx.Response) -> str:
    found = re.search(r'id="current-version">([^<]*)<', page.text)
    assert found, "the page names no current version"
    return found.group(1)


def srcdocs(page: httpx.Response) -> dict[str, str]:
    """The preview frames' documents by id, unescaped as the browser reads them."""
    found = re.findall(r'<iframe class="preview" id="([^"]+)"[^>]* srcdoc="([^"]*)"', page.text)
    return {frame: html.unescape(doc) for frame, doc in found}


def textarea(page: httpx.Response, name: str) -> str:
    found = re.search(rf'<textarea name="{name}"[^>]*>\n(.*?)</textarea>', page.text, re.S)
    assert found, f"no textarea {name}"
    return html.unescape(found.group(1))


async def test_publishing_from_the_form_makes_version_1_then_2(db):
    tenant, _ = new_tenant(db, "acme")
    page = url(tenant)
    async with console(db) as client:
        index = await client.get(f"/admin/tenants/{tenant}/templates")
        assert index.status_code == 200 and 'id="no-templates"' in index.text
        assert 'href="/admin/templates" class="here"' in index.text  # the nav's Templates
        tenant_page = await client.get(f"/admin/tenants/{tenant}")
        assert f'href="/admin/tenants/{tenant}/templates"' in tenant_page.text

        opened = await client.get(
            "/admin/tenants/acme/templates/new", params={"name": "receipt", "locale": "EN"}
        )
        assert opened.status_code == 303 and opened.headers["location"] == page
        empty = await client.get(page)
        assert empty.status_code == 200
        assert current_in(empty) == "not published" and "A new template" in empty.text
        assert textarea(empty, "html") == "" and 'id="no-versions"' in empty.text
        assert empty.headers["content-security-policy"] == EDITOR_POLICY

        first = await publish(client, page)
        assert first.status_code == 303 and first.headers["location"] == page
        shown = await client.get(page)
        assert "Published version 1 of receipt (en): it is current." in shown.text
        assert current_in(shown) == "version 1 is current"
        # The form holds the current version, exactly (the textarea's leading newline aside).
        assert textarea(shown, "html") == RECEIPT["html"]
        assert json.loads(textarea(shown, "sample_data")) == {"name": "Ada", "number": 7}
        assert "Hello Ada," in srcdocs(shown)["preview-desktop"]  # its preview, at once

        # A browser sends a textarea's lines with CRLF: the version keeps LF.
        crlf = RECEIPT["html"].replace("\n", "\r\n").replace("Your", "Thank you for your")
        second = await publish(client, page, html=crlf)
        assert second.status_code == 303
        shown = await client.get(page)
        assert "Published version 2" in shown.text and current_in(shown) == "version 2 is current"
        assert "\r" not in textarea(shown, "html")
        rows = re.findall(r'<tr id="version-(\d+)">(.*?)</tr>', shown.text, re.S)
        assert [number for number, _ in rows] == ["2", "1"]  # newest first
        assert all(ACTOR in row for _, row in rows)
        assert "current" in rows[0][1] and "Roll back to 2" not in shown.text
        assert "Roll back to 1…" in shown.text

        again = await publish(client, page, html=crlf)  # the same fields: nothing new
        assert "Nothing published: the form is version 2" in (await client.get(page)).text
        assert again.status_code == 303 and version_count(db) == 2

        index = await client.get(f"/admin/tenants/{tenant}/templates")
        assert f'href="{page}"' in index.text and "(default)" in index.text

        picker = await client.get("/admin/templates")
        assert f'href="/admin/tenants/{tenant}/templates"' in picker.text
        assert "welcome" in picker.text  # a file template of the deployment
        chosen = await client.get("/admin/templates", params={"tenant": "acme"})
        assert chosen.status_code == 303
        assert chosen.headers["location"] == f"/admin/tenants/{tenant}/templates"
        nobody = await client.get("/admin/templates", params={"tenant": "nobody"})
        assert nobody.status_code == 400 and "no tenant has this id or name" in nobody.text


async def test_a_new_locale_starts_from_the_default_one(db):
    async with console(db) as client:
        await publish(client)
        french = await client.get(url(locale="fr-ca"))
        assert french.status_code == 303 and french.headers["location"] == url(locale="fr-CA")
        french = await client.get(url(locale="fr-CA"))
        assert "A new locale of receipt" in french.text and "version 1 of en" in french.text
        assert textarea(french, "html") == RECEIPT["html"]
        assert await publish(client, url(locale="fr-CA"), subject="Reçu {{ number }}")
        assert (
            'href="/admin/tenants/default/templates/receipt/en"'
            in (await client.get(url(locale="fr-CA"))).text
        )


async def test_preview_renders_the_draft_at_both_widths_and_writes_nothing(db):
    async with console(db) as client:
        await publish(client)
        before = version_count(db)
        draft = {
            **RECEIPT,
            "html": "<p>Draft for {{ name }} & co</p>",
            "text": "",  # made from the HTML
            "sample_data": '{"name": "Grace <b>", "number": 7}',
        }
        shown = await post(client, f"{url()}/preview", **draft)
        assert shown.status_code == 200, shown.text
        frames = srcdocs(shown)
        assert set(frames) == {"preview-desktop", "preview-narrow"}
        for document in frames.values():
            assert document == "<p>Draft for Grace &lt;b&gt; & co</p>"  # the data autoescaped
        assert re.search(r'<iframe class="preview" id="preview-narrow"[^>]* sandbox ', shown.text)
        assert "allow-scripts" not in shown.text
        assert 'id="preview-subject">Receipt 7<' in shown.text
        assert '<pre id="preview-text">Draft for Grace &lt;b&gt; &amp; co' in shown.text
        # The draft is kept in the form; the current version is still 1.
        assert textarea(shown, "html") == draft["html"]
        assert current_in(shown) == "version 1 is current"
        assert version_count(db) == before

        # The script's door: the same as JSON, behind the same CSRF token.
        live = await post(client, f"{url()}/live", **draft)
        assert live.status_code == 200 and live.headers["content-type"] == "application/json"
        assert live.json()["html"] == "<p>Draft for Grace &lt;b&gt; & co</p>"
        assert live.json()["subject"] == "Receipt 7"
        broken = await post(client, f"{url()}/live", **{**draft, "html": "{{ name "})
        assert broken.status_code == 422 and broken.json()["problems"][0]["part"] == "html"
        assert (await post(client, f"{url()}/live", csrf=False, **draft)).status_code == 403
        assert version_count(db) == before

        script = await client.get(SCRIPT_PATH)
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert "srcdoc" in script.text and "innerHTML" not in script.text
        assert f'<script src="{SCRIPT_PATH}" defer>' in shown.text
        # Only the editor may run it; every other page keeps the policy without scripts.
        assert "script-src" not in (await client.get("/admin")).headers["content-security-policy"]


async def test_rollback_from_the_form_makes_version_1_current_after_a_confirmation(db):
    async with console(db) as client:
        await publish(client)
        await publish(client, subject="Your receipt {{ number }}")
        asked = await post(client, f"{url()}/rollback", version="1")
        assert asked.status_code == 200 and "Roll back to version 1?" in asked.text
        assert 'name="confirm" value="yes"' in asked.text
        assert 'name="version" value="1"' in asked.text
        assert current_in(await client.get(url())) == "version 2 is current"  # only asked

        done = await post(client, f"{url()}/rollback", version="1", confirm="yes")
        assert done.status_code == 303 and done.headers["location"] == url()
        shown = await client.get(url())
        assert "Rolled back: version 1 is current again." in shown.text
        assert current_in(shown) == "version 1 is current"
        assert 'value="Receipt {{ number }}"' in shown.text  # the form holds version 1 again
        assert "Roll back to 2…" in shown.text and version_count(db) == 2

        again = await post(client, f"{url()}/rollback", version="1", confirm="yes")
        assert again.status_code == 409 and "current one already" in again.text
        index = await client.get("/admin/tenants/default/templates")
        assert "(rolled back)" in index.text


async def test_the_diff_of_two_versions_colours_its_lines(db):
    async with console(db) as client:
        await publish(client)
        await publish(
            client,
            html=RECEIPT["html"].replace("Your receipt", "-- your receipt"),
            sample_data=json.dumps({"name": "Ada", "number": 8}),
        )
        shown = await client.get(f"{url()}/diff", params={"old": "1", "new": "2"})
        assert shown.status_code == 200
        assert '<span class="del">-&lt;p&gt;Your receipt {{ number }}.&lt;/p&gt;' in shown.text
        assert '<span class="add">+&lt;p&gt;-- your receipt {{ number }}.&lt;/p&gt;' in shown.text
        assert '<span class="file">--- receipt/en@1/html' in shown.text
        assert '<span class="hunk">@@ ' in shown.text
        assert '<span class="add">+  &#34;number&#34;: 8' in shown.text  # the sample data's
        assert "receipt/en@1/subject" not in shown.text  # unchanged: no diff of it
        default = await client.get(f"{url()}/diff")  # the current one and the one before
        assert default.status_code == 200 and "version 1 → 2" in default.text
        same = await client.get(f"{url()}/diff", params={"old": "2", "new": "2"})
        assert 'id="no-changes"' in same.text
        # From the versions table: one form of radio buttons.
        page = await client.get(url())
        radios = 'form="compare" name="{}" value="{}" aria-label="{}: version {}" checked'
        assert radios.format("old", 1, "old", 1) in page.text
        assert radios.format("new", 2, "new", 2) in page.text


def test_a_removed_line_that_reads_like_a_file_header_is_still_removed():
    text = (
        "--- a/html\n+++ b/html\n@@ -1,3 +1,2 @@\n same\n--- looks like a header\n-gone\n+new\n"
        "--- a/text\n+++ b/text\n@@ -1 +1 @@\n-x\n+y\n"
    )
    kinds = [kind for kind, _ in diff_lines(text)]
    assert kinds == [
        *("file", "file", "hunk", "same", "del", "del", "add"),
        *("file", "file", "hunk", "del", "add"),
    ]


async def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(db):
    async with console(db) as client:
        await publish(client)
        for action, fields in (
            ("publish", {**RECEIPT, "subject": "Forged {{ number }}"}),
            ("preview", RECEIPT),
            ("rollback", {"version": "1", "confirm": "yes"}),
        ):
            refused = await post(client, f"{url()}/{action}", csrf=False, **fields)
            assert refused.status_code == 403, action
            assert "security token" in refused.text
            forged = await client.post(f"{url()}/{action}", data={"csrf": "forged", **fields})
            assert forged.status_code == 403, action
        assert version_count(db) == 1
        assert current_in(await client.get(url())) == "version 1 is current"


@pytest.mark.parametrize(
    ("part", "source"),
    [
        ("html", f"<p>{ESCAPE}</p>"),
        ("subject", ESCAPE),
        ("text", "{{ name.__class__ }}"),
        ("html", "{{ cycler.__init__.__globals__ }}"),
    ],
)
async def test_a_sandbox_escape_is_a_problem_shown_and_nothing_is_published(db, part, source):
    async with console(db) as client:
        for action in ("preview", "publish"):
            shown = await post(client, f"{url()}/{action}", **{**RECEIPT, part: source})
            assert shown.status_code == 422, shown.text
            problems = re.search(r'<ul id="problem-list">(.*?)</ul>', shown.text, re.S)
            assert problems and f'<span class="mono">{part}' in problems.group(1)
            assert "not allowed" in problems.group(1) or "unsafe" in problems.group(1)
            assert "__mro__" not in srcdocs(shown).get("preview-desktop", "")
            assert "mailbag." not in problems.group(1)  # no Python module named
            assert html.unescape(textarea(shown, "html")) == (
                source if part == "html" else RECEIPT["html"]
            )
        assert version_count(db) == 0
        assert current_in(await client.get(url())) == "not published"


async def test_a_template_error_names_its_part_and_line(db):
    async with console(db) as client:
        broken = {**RECEIPT, "html": "<p>one</p>\n<p>{{ missing }}</p>\n"}
        shown = await post(client, f"{url()}/publish", **broken)
        assert shown.status_code == 422
        assert "Not published: the draft has problems" in shown.text
        assert re.search(r'<span class="mono">html line 2</span>: .*missing', shown.text)
        syntax = await post(client, f"{url()}/preview", **{**RECEIPT, "text": "a\n{% if %}"})
        assert syntax.status_code == 422
        assert '<span class="mono">text line 2</span>' in syntax.text
        assert version_count(db) == 0


async def test_bad_input_is_a_clear_4xx_page_never_a_500(db):
    async with console(db) as client:
        await publish(client)
        cases: list[tuple[str, str, dict[str, str], int, str]] = [
            ("GET", url(locale="english!"), {}, 404, "BCP 47"),
            ("GET", url(locale="x" * 40), {}, 404, "longer than 35"),
            ("GET", url(name="Receipt"), {}, 404, "lowercase letters"),
            ("GET", url(tenant="nobody"), {}, 404, "No tenant has this id or name"),
            ("POST", f"{url(locale='english!')}/publish", RECEIPT, 404, "BCP 47"),
            ("GET", f"{url()}/diff?old=1&new=9", {}, 404, "has no version 9 in en"),
            ("GET", f"{url()}/diff?old=x&new=1", {}, 400, "not a version number"),
            ("GET", f"{url(locale='de')}/diff", {}, 404, "has no versions in de"),
            ("POST", f"{url()}/rollback", {"version": "9"}, 404, "has no version 9"),
            ("POST", f"{url()}/rollback", {"version": "-1"}, 400, "not a version number"),
            ("POST", f"{url()}/rollback", {"version": "9" * 30}, 400, "not a version number"),
            ("GET", "/admin/tenants/default/templates/new?name=a b&locale=en", {}, 400, "name:"),
            ("GET", "/admin/tenants/default/templates/new?name=ok&locale=1", {}, 400, "locale:"),
        ]
        for method, path, fields, status, says in cases:
            if method == "GET":
                answer = await client.get(path)
            else:
                answer = await post(client, path, **fields)
            assert answer.status_code == status, (path, answer.status_code, answer.text[:300])
            assert says in html.unescape(answer.text), (path, says)
            assert "text/html" in answer.headers["content-type"]

        refused: list[tuple[dict[str, str], int, str]] = [
            ({"sample_data": '{"name": "Ada",}'}, 422, "not JSON"),
            ({"sample_data": "[1, 2]"}, 422, "must be a JSON object"),
            ({"sample_data": '{"n": NaN}'}, 422, "NaN is not JSON"),
            ({"sample_data": '{"n": ' + "[" * 300 + "]" * 300 + "}"}, 422, "not JSON mailbag"),
            ({"sample_data": '{"n": 1' + "0" * 30 + "}"}, 422, "not JSON mailbag"),
            ({"subject": ""}, 422, "subject"),
            ({"format": "handlebars"}, 422, "format"),
            ({"subject": "x" * (SUBJECT_SOURCE_MAX + 1)}, 413, "longer than"),
            (
                {"sample_data": json.dumps({"blob": "x" * SAMPLE_DATA_MAX_BYTES})},
                413,
                "larger than",
            ),
        ]
        for changes, status, says in refused:
            for action in ("preview", "publish"):
                answer = await post(client, f"{url()}/{action}", **{**RECEIPT, **changes})
                assert answer.status_code == status, (changes, action, answer.text[:300])
                problems = re.search(r'<ul id="problem-list">(.*?)</ul>', answer.text, re.S)
                assert problems and says in html.unescape(problems.group(1)), (changes, action)
            live = await post(client, f"{url()}/live", **{**RECEIPT, **changes})
            assert live.status_code == status and live.json()["problems"]
        assert version_count(db) == 1


async def test_the_message_page_names_its_template_version_and_locale(db):
    async with console(db) as client:
        await publish(client, url(locale="fr"), subject="Reçu {{ number }}")
        await publish(client, url(locale="fr"), subject="Votre reçu {{ number }}")
        with db.engine.begin() as conn:
            message = mailbag.enqueue(
                conn,
                to="ada@example.com",
                settings=Settings(),
                template="receipt",
                data={"name": "Ada", "number": 9},
                locale="fr-CA",
            ).message
        shown = await client.get(f"/admin/messages/{message.id}")
        assert shown.status_code == 200
        assert f'id="template-version" href="{url(locale="fr")}">version 2 in fr</a>' in shown.text
        assert re.search(r'id="locale">fr-CA<', shown.text)

        with db.engine.begin() as conn:
            filed: Any = mailbag.enqueue(
                conn,
                to="ada@example.com",
                settings=Settings(),
                template="welcome",
                data={"name": "Ada"},
            ).message
        shown = await client.get(f"/admin/messages/{filed.id}")
        assert "the deployment's file template" in shown.text
        assert 'id="template-version"' not in shown.text


async def test_a_form_over_the_body_limit_is_a_page_that_says_so_and_publishes_nothing(db):
    tenant, _ = new_tenant(db, "acme")
    async with console(db) as client:
        # URL-encoded, each `<` is 3 bytes: 100,000 of them are over the default 256 KiB.
        refused = await publish(client, url(tenant), html="<" * 100_000)
    assert refused.status_code == 413
    assert refused.headers["content-type"].startswith("text/html")
    assert "Request body too large" in refused.text and "Nothing was changed" in refused.text
    assert refused.headers["content-security-policy"].startswith("default-src 'none'")
    assert version_count(db) == 0
