"""Templates: the built-in catalog, a user's folder on top of it, and what rendering refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailbag.templates import Catalog, TemplateError, builtin


def write_template(folder: Path, name: str, subject: str, html: str, text: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "subject.txt").write_text(subject)
    (folder / name / "body.html").write_text(html)
    (folder / name / "body.txt").write_text(text)


def test_the_builtin_catalog_has_the_three_templates():
    assert {"welcome", "verify-email", "invitation"} <= builtin().names()
    invite = builtin().render(
        "invitation", {"inviter": "Ada", "team": "Engines", "accept_url": "https://example.com/a"}
    )
    assert invite.subject == "Ada invited you to Engines"
    assert 'href="https://example.com/a"' in invite.html


def test_html_is_autoescaped_and_text_is_not():
    rendered = builtin().render("welcome", {"name": "<b>Eve</b> & co"})
    assert "&lt;b&gt;Eve&lt;/b&gt; &amp; co" in rendered.html
    assert "<b>Eve</b> & co" in rendered.text


def test_a_users_folder_adds_and_overrides_templates(tmp_path):
    write_template(
        tmp_path, "receipt", "Receipt {{ number }}", "<p>{{ total }}</p>", "Total: {{ total }}"
    )
    write_template(tmp_path, "welcome", "Hi {{ name }}!", "<p>Hi</p>", "Hi")
    catalog = Catalog(tmp_path)
    assert "receipt" in catalog and "verify-email" in catalog
    assert catalog.render("receipt", {"number": 7, "total": "9.90"}).text == "Total: 9.90"
    assert catalog.render("welcome", {"name": "Ada"}).subject == "Hi Ada!"


@pytest.mark.parametrize(
    ("name", "data", "complaint"),
    [
        ("welcome", {}, "'name' is undefined"),
        ("missing", {}, "unknown template"),
        ("multiline", {"x": "a\nBcc: evil@example.com"}, "line break"),
        # Every character str.splitlines() breaks at, not only CR and LF.
        ("multiline", {"x": "a\u2028Bcc: evil@example.com"}, "line break"),
        ("multiline", {"x": "a\x85b"}, "line break"),
        ("multiline", {"x": "a\x0bb"}, "line break"),
        ("multiline", {"x": "a\x1cb"}, "line break"),
        ("multiline", {"x": "a\x07b"}, "control character"),
    ],
)
def test_rendering_refuses_what_would_be_a_broken_email(tmp_path, name, data, complaint):
    write_template(tmp_path, "multiline", "Subject {{ x }}", "<p></p>", "")
    with pytest.raises(TemplateError, match=complaint):
        Catalog(tmp_path).render(name, data)


def test_a_missing_templates_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TemplateError, match="does not exist"):
        Catalog(tmp_path / "nope")


def test_a_callers_subject_is_kept_exactly_and_a_templates_is_trimmed(tmp_path):
    write_template(tmp_path, "plain", "  Hi {{ x }}  \n", "<p></p>", "")
    catalog = Catalog(tmp_path)
    assert catalog.render("plain", {"x": "y"}).subject == "Hi y"
    assert catalog.render("plain", {"x": "y"}, " as  written ").subject == " as  written "
    with pytest.raises(TemplateError, match="empty"):
        catalog.render("plain", {"x": "y"}, "   ")
