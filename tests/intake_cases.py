"""The bad inputs every door into the outbox must refuse with services.intake's own words
(tests/test_intake.py for the API, the CLI and the Python doors, tests/test_django.py for
Django's), each as the doors take it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine

import mailbag
from mailbag.services import intake
from mailbag.services.templates import pinned
from mailbag.settings import Settings
from mailbag.store.session import Session

BIN = b"\x00\x01 raw bytes"


@dataclass(frozen=True)
class Case:
    """One bad input, as each door takes it: `fields` for new_message (the Python doors),
    the rest derived from them. `field` is what the refusal names."""

    name: str
    field: str
    provider: str
    fields: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)  # attachments, by file name

    @property
    def template(self) -> str | None:
        template: str | None = self.fields.get("template")
        return template

    def python_fields(self) -> dict[str, Any]:
        given = [
            mailbag.Attachment(n, "application/octet-stream", b) for n, b in self.files.items()
        ]
        return {**self.fields, "attachments": given}

    def refusal(self, engine: Engine) -> str:
        """What the one door says of this input under its provider: every door must say it.
        A template is looked up (in `engine`'s database too) and rendered when the message is
        written: services.templates.pinned says that."""
        rules = intake.Rules.of(Settings(provider=self.provider))
        with pytest.raises(mailbag.InvalidMessage) as refused:
            message = rules.message(**self.python_fields())
            with engine.connect() as conn:
                Session(conn).run(pinned([message], rules.book))
        assert set(refused.value.errors) == {self.field}
        return refused.value.errors[self.field]


CASES = [
    Case(
        "an attachment the provider cannot carry",
        "attachments",
        "brevo",  # its API takes a documented list of file extensions, and .bin is not one
        {"to": "ada@example.com", "subject": "Your data", "text": "Attached."},
        {"data.bin": BIN},
    ),
    Case("an unknown template", "template", "file", {"to": "ada@example.com", "template": "nope"}),
    Case(
        "a template that does not render",
        "template",
        "file",
        {"to": "ada@example.com", "template": "welcome", "data": {}},  # it says {{ name }}
    ),
]
