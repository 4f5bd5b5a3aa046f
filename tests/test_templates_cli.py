"""`mailbag templates` on each database: a tree pushed (layouts first, locale folders),
versions published, unchanged, rolled back, shown and compared; `check` of a folder with
no database and of the stored templates; and bad input (a locale, a folder, a sandbox
escape, an unknown version or tenant) refused with exit 2 and nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from mailbag.cli import app
from mailbag.store.schema import template_versions

from conftest import TestDB

runner = CliRunner()

LAYOUT = {
    "subject.txt": "unused\n",
    "body.html": "<html><body>{% block body %}{% endblock %}"
    "<footer>{{ company }}</footer></body></html>\n",
    "body.txt": "{% block body %}{% endblock %}\n-- {{ company }}\n",
    "sample.json": '{"company": "Acme"}',
}


def child(subject: str) -> dict[str, str]:
    return {
        "subject.txt": f"{subject}\n",
        "body.html": '{% extends "layout" %}{% block body %}<p>Hi {{ name }}</p>{% endblock %}\n',
        "body.txt": '{% extends "layout" %}{% block body %}Hi {{ name }}{% endblock %}\n',
        "sample.json": json.dumps({"name": "Ada", "company": "Acme"}),
    }


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_text(content)
    return folder


def tree(root: Path) -> Path:
    """A layout (its files directly: the --locale), and `welcome` extending it, in en and
    fr-CA folders."""
    write(root / "layout", LAYOUT)
    write(root / "welcome" / "en", child("Welcome, {{ name }}"))
    write(root / "welcome" / "fr-CA", child("Bienvenue, {{ name }}"))
    return root


@pytest.fixture
def cli(db: TestDB, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)

    def invoke(*args: str) -> Any:
        return runner.invoke(app, ["templates", *args])

    return invoke


def ok(result: Any) -> list[str]:
    assert result.exit_code == 0, result.output
    lines: list[str] = result.stdout.splitlines()
    return lines


def versions(db: TestDB) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(template_versions)).scalar_one())


def test_push_publishes_what_others_extend_first_and_list_shows_each_locale(
    cli: Any, db: TestDB, tmp_path: Path
) -> None:
    # `alpha` sorts before `layout` yet extends it: it must be published after it.
    root = tree(tmp_path / "tree")
    write(root / "alpha", child("Alpha {{ name }}"))
    assert ok(cli("push", str(root))) == [
        "layout en version 1",
        "alpha en version 1",
        "welcome en version 1",
        "welcome fr-CA version 1",
    ]
    assert ok(cli("list")) == [
        "alpha\ten\tcurrent 1\tlatest 1\tdefault",
        "layout\ten\tcurrent 1\tlatest 1\tdefault",
        "welcome\ten\tcurrent 1\tlatest 1\tdefault",
        "welcome\tfr-CA\tcurrent 1\tlatest 1",
    ]
    listed = json.loads(cli("list", "--json").stdout)
    welcome = next(t for t in listed if t["name"] == "welcome")
    assert welcome["default_locale"] == "en"
    assert [held["locale"] for held in welcome["locales"]] == ["en", "fr-CA"]
    # The child's version records the layout's it was published with.
    shown = ok(cli("show", "welcome", "fr-CA"))
    assert shown[0] == "welcome fr-CA version 1 (current; latest: 1)"
    assert "uses: layout en version 1" in shown
    # Again: nothing changed, nothing written.
    assert ok(cli("push", str(root))) == [
        "layout en unchanged (version 1 is current)",
        "alpha en unchanged (version 1 is current)",
        "welcome en unchanged (version 1 is current)",
        "welcome fr-CA unchanged (version 1 is current)",
    ]
    assert versions(db) == 4
    assert ok(cli("check")) == ["4 templates render"]  # the stored ones, each with its sample


def test_push_publishes_the_locale_option_first_so_it_is_the_default(
    cli: Any, tmp_path: Path
) -> None:
    root = tree(tmp_path / "tree")
    assert ok(cli("push", str(root), "--locale", "fr-ca")) == [
        "layout fr-CA version 1",
        "welcome fr-CA version 1",
        "welcome en version 1",
    ]
    listed = {t["name"]: t for t in json.loads(cli("list", "--json").stdout)}
    assert listed["welcome"]["default_locale"] == "fr-CA"
    assert listed["layout"]["default_locale"] == "fr-CA"


def test_publish_a_change_roll_back_show_and_diff(cli: Any, db: TestDB, tmp_path: Path) -> None:
    folder = write(tmp_path / "receipt", {"subject.txt": "Receipt for {{ name }}\n"})
    write(folder, {"body.html": "<p>{{ name }}</p>\n", "sample.json": '{"name": "Ada"}'})
    assert ok(cli("publish", "receipt", "en", str(folder))) == ["receipt en version 1"]
    write(folder, {"subject.txt": "Your receipt, {{ name }}\n"})
    assert ok(cli("publish", "receipt", "en", str(folder))) == ["receipt en version 2"]
    assert ok(cli("publish", "receipt", "en", str(folder))) == [
        "receipt en unchanged (version 2 is current)"
    ]
    assert versions(db) == 2

    shown = json.loads("\n".join(ok(cli("show", "receipt", "en", "--json"))))
    assert (shown["version"], shown["current"]) == (2, True)
    assert shown["subject"] == "Your receipt, {{ name }}"  # one line: its newline dropped
    assert shown["sample_data"] == {"name": "Ada"} and shown["format"] == "jinja"
    assert shown["changed_by"].startswith("cli:")

    diff = ok(cli("diff", "receipt", "en", "1"))
    assert diff[:2] == ["--- receipt/en@1/subject", "+++ receipt/en@2/subject"]
    assert "-Receipt for {{ name }}" in diff and "+Your receipt, {{ name }}" in diff
    assert ok(cli("diff", "receipt", "en", "2", "2")) == []

    assert ok(cli("rollback", "receipt", "en", "1")) == ["receipt en version 1 is current"]
    shown_text = ok(cli("show", "receipt", "en"))
    assert shown_text[0] == "receipt en version 1 (current; latest: 2)"
    assert shown_text[shown_text.index("--- subject") + 1] == "Receipt for {{ name }}"
    again = json.loads(cli("show", "receipt", "en", "--version", "2", "--json").stdout)
    assert (again["version"], again["current"], again["current_version"]) == (2, False, 1)
    assert versions(db) == 2  # a rollback writes no version


def test_an_mjml_body_is_published_as_mjml(cli: Any, tmp_path: Path) -> None:
    pytest.importorskip("mailbag.templates.mjml")
    folder = write(
        tmp_path / "promo",
        {
            "subject.txt": "Hi {{ name }}\n",
            "body.mjml": "<mjml><mj-body><mj-section><mj-column><mj-text>Hi {{ name }}"
            "</mj-text></mj-column></mj-section></mj-body></mjml>\n",
            "sample.json": '{"name": "Ada"}',
        },
    )
    assert ok(cli("publish", "promo", "en", str(folder))) == ["promo en version 1"]
    assert json.loads(cli("show", "promo", "en", "--json").stdout)["format"] == "mjml"


# --- check: a folder with no database, for an application's CI ---------------------------


@pytest.fixture
def no_database(monkeypatch: pytest.MonkeyPatch) -> Any:
    # Nothing listens there: a check of a folder must never connect.
    monkeypatch.setenv("MAILBAG_DATABASE_URL", "postgresql://nobody@127.0.0.1:9/nothing")

    def invoke(*args: str) -> Any:
        return runner.invoke(app, ["templates", *args])

    return invoke


def test_check_a_folder_renders_each_template_with_no_database(
    no_database: Any, tmp_path: Path
) -> None:
    assert ok(no_database("check", str(tree(tmp_path / "tree")))) == ["3 templates render"]


def test_check_a_folder_fails_with_the_line_of_each_problem(
    no_database: Any, tmp_path: Path
) -> None:
    root = tree(tmp_path / "tree")
    write(root / "broken", {"subject.txt": "Hi\n", "body.html": "<p>\nfine\n{% if %}</p>\n"})
    write(
        root / "lacking",
        {
            "subject.txt": "Hi {{ name }}\n",
            "body.html": "<p>\n{{ name }} {{ missing }}</p>\n",
            "sample.json": '{"name": "Ada"}',
        },
    )
    # A layout's problem is the child's too, named by the layout's part and line.
    write(root / "orphan", {**child("Hi {{ name }}"), "sample.json": '{"name": "Ada"}'})
    result = no_database("check", str(root))
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert "broken/en: html line 3: Expected an expression, got 'end of statement block'" in lines
    assert "lacking/en: html line 2: 'missing' is undefined" in lines
    assert any(line.startswith("orphan/en: layout/html line 1: ") for line in lines), lines
    assert not any(line.startswith(("welcome/", "layout/")) for line in lines)
    assert lines[-1] == "3 of 6 templates failed"


def test_check_a_folder_refuses_what_is_not_a_tree(no_database: Any, tmp_path: Path) -> None:
    result = no_database("check", str(tmp_path / "nowhere"))
    assert result.exit_code == 2 and "not a folder" in result.stderr


# --- refused: exit 2, nothing written ------------------------------------------------------


def test_a_sandbox_escape_is_refused_and_nothing_is_written(
    cli: Any, db: TestDB, tmp_path: Path
) -> None:
    ok(cli("push", str(tree(tmp_path / "tree"))))
    before = cli("list").stdout
    folder = write(tmp_path / "evil", {"subject.txt": "Hi\n"})
    write(folder, {"body.html": "<p>{{ ''.__class__.__mro__ }}</p>\n"})
    result = cli("publish", "evil", "en", str(folder))
    assert result.exit_code == 2, result.output
    assert "evil/en refused" in result.stderr and "html line 1: not allowed" in result.stderr
    assert "<class" not in result.output and "Traceback" not in result.output
    assert cli("list").stdout == before
    assert versions(db) == 3


def test_push_stops_at_the_first_refused_and_says_what_was_published(
    cli: Any, db: TestDB, tmp_path: Path
) -> None:
    root = write(tmp_path / "tree" / "layout", LAYOUT).parent
    write(root / "welcome", {**child("Hi {{ name }}"), "sample.json": '{"name": "Ada"}'})
    result = cli("push", str(root))
    assert result.exit_code == 2, result.output
    assert result.stdout.splitlines() == ["layout en version 1"]
    assert "welcome/en" in result.stderr and "'company' is undefined" in result.stderr
    assert "published before it: layout/en version 1" in result.stderr
    assert [line.split("\t")[0] for line in ok(cli("list"))] == ["layout"]


def test_push_refuses_templates_that_use_each_other(cli: Any, db: TestDB, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    write(root / "a", {"subject.txt": "a\n", "body.html": '{% include "b" %}'})
    write(root / "b", {"subject.txt": "b\n", "body.html": '{% include "a" %}'})
    write(root / "c", {"subject.txt": "c\n", "body.html": "fine"})
    result = cli("push", str(root))
    assert result.exit_code == 2, result.output
    assert "a uses b, b uses a" in result.stderr and "nothing was published" in result.stderr
    assert versions(db) == 0


@pytest.mark.parametrize(
    ("files", "complaint"),
    [
        ({"body.html": "<p>x</p>"}, "no subject.txt"),
        ({"subject.txt": "s", "body.html": "x", "body.mjml": "<mjml/>"}, "both body.html"),
        ({"subject.txt": "s", "body.html": "x", "sample.json": "{nope"}, "not valid JSON"),
        ({"subject.txt": "s", "body.html": "x", "sample.json": "[1, 2]"}, "a JSON object"),
        ({"subject.txt": "s", "body.html": "x" * (600 * 1024)}, "longer than"),
        ({"subject.txt": "\n"}, "subject: is required"),
        ({"subject.txt": "s", "body.html": "{% if %}"}, "html line 1"),
    ],
)
def test_a_folder_that_is_not_a_template_is_refused(
    cli: Any, db: TestDB, tmp_path: Path, files: dict[str, str], complaint: str
) -> None:
    folder = write(tmp_path / "tree" / "receipt", files)
    for args in (["publish", "receipt", "en", str(folder)], ["push", str(folder.parent)]):
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert complaint in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.output
    assert versions(db) == 0


def test_a_bad_locale_or_name_is_refused(cli: Any, db: TestDB, tmp_path: Path) -> None:
    folder = write(tmp_path / "receipt", {"subject.txt": "s\n", "body.html": "x"})
    result = cli("publish", "receipt", "xx_YY!", str(folder))
    assert result.exit_code == 2 and "'xx_YY!' is not a BCP 47 language tag" in result.stderr
    result = cli("publish", "Receipt!", "en", str(folder))
    assert result.exit_code == 2 and "name: must be lowercase" in result.stderr
    # In a tree the locale is a folder's name.
    write(tmp_path / "tree" / "receipt" / "fr_CA", {"subject.txt": "s\n", "body.html": "x"})
    result = cli("push", str(tmp_path / "tree"))
    assert result.exit_code == 2 and "fr_CA" in result.stderr and "BCP 47" in result.stderr
    assert versions(db) == 0


def test_an_unknown_version_template_or_tenant_is_refused(cli: Any, tmp_path: Path) -> None:
    folder = write(tmp_path / "receipt", {"subject.txt": "s {{ name }}\n", "body.html": "x"})
    write(folder, {"sample.json": '{"name": "Ada"}'})
    ok(cli("publish", "receipt", "en", str(folder)))
    for args, complaint in [
        (["show", "receipt", "en", "--version", "9"], "no version 9 in en"),
        (["rollback", "receipt", "en", "9"], "no version 9 in en"),
        (["diff", "receipt", "en", "1", "9"], "no version 9 in en"),
        (["rollback", "receipt", "en", str(2**31)], "less than or equal to 2147483647"),
        (["show", "receipt", "de"], "no current version in de"),
        (["show", "nothing", "en"], "'nothing'"),
        (["list", "--tenant", "nobody"], "nobody"),
        (["publish", "receipt", "en", str(folder), "--tenant", "nobody"], "nobody"),
    ]:
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert complaint in result.stderr, (args, result.stderr)
    assert ok(cli("show", "receipt", "en"))[0] == "receipt en version 1 (current; latest: 1)"
