"""Templates operators own: the rules of names, locales, versions and sizes (no I/O).

A tenant's template has a name (the rule message templates follow), one or more locales
(BCP 47 tags, kept in their canonical case), and per locale an ordered list of versions
numbered from 1. A version never changes once written; publishing writes the next one and
makes it current; a rollback makes an older one current again. The first locale published
is the template's default: the one a message falls back to.

A message asks for a locale (or none); the version it gets is looked up as RFC 4647's
"lookup" does it, dropping subtags from the end: `fr-CA` -> `fr` -> the default locale.
The one it got is recorded with it (`Pin`), and it renders with that version even after
another is published.

A version may extend or include other templates of its tenant (`{% extends "layout" %}`);
which versions of those it uses is decided when it is published and kept with it
(`dependencies`), so that what a pinned message renders never changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mailbag.domain import storable

TEMPLATE_NAME_MAX = 100
LOCALE_MAX = 35  # RFC 5646 asks implementations to take tags of at least 35 characters
SUBJECT_SOURCE_MAX = 2_000
BODY_SOURCE_MAX = 512 * 1024  # html and text each, in characters
SAMPLE_DATA_MAX_BYTES = 64 * 1024
FORMATS = ("jinja", "mjml")

# language (2-3 letters, or a registered 5-8), script, region (2 letters or 3 digits),
# variants: the well-formed tags transactional mail meets (extensions and private use aside).
_LOCALE = re.compile(
    r"^(?P<language>[a-z]{2,3}|[a-z]{5,8})"
    r"(?:-(?P<script>[a-z]{4}))?"
    r"(?:-(?P<region>[a-z]{2}|[0-9]{3}))?"
    r"(?P<variants>(?:-(?:[a-z0-9]{5,8}|[0-9][a-z0-9]{3}))*)$",
    re.IGNORECASE,
)


_TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def template_name_problem(name: object) -> str | None:
    """What is wrong with a template's name (None: nothing): the one rule for file
    templates, templates in the database and the messages naming them."""
    if not isinstance(name, str) or not _TEMPLATE_NAME.match(name):
        return "must be lowercase letters, digits, '-', '_' or '.'"
    if len(name) > TEMPLATE_NAME_MAX:
        return f"is longer than {TEMPLATE_NAME_MAX} characters"
    return None


class InvalidTemplate(Exception):
    """What an operator sent is not a template version (by field: what is wrong)."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{name}: {problem}" for name, problem in self.errors.items()))


class TemplateTooLarge(InvalidTemplate):
    """A part or the sample data over its size limit (HTTP 413)."""


def locale(tag: str) -> str:
    """`tag` in its canonical case (`pt-br` -> `pt-BR`, `zh-hant-tw` -> `zh-Hant-TW`);
    InvalidTemplate when it is not a well-formed BCP 47 language tag."""
    problem = locale_problem(tag)
    if problem is not None:
        raise InvalidTemplate({"locale": problem})
    return normal_locale(tag)


def normal_locale(tag: str) -> str:
    """A well-formed tag (locale_problem found nothing) in its canonical case."""
    match = _LOCALE.match(tag)
    assert match is not None
    parts = [match["language"].lower()]
    if match["script"]:
        parts.append(match["script"].title())
    if match["region"]:
        parts.append(match["region"].upper())
    parts += [v.lower() for v in match["variants"].split("-") if v]
    return "-".join(parts)


def locale_problem(tag: object) -> str | None:
    if not isinstance(tag, str) or not tag:
        return "must be a BCP 47 language tag such as 'en', 'fr-CA' or 'zh-Hant-TW'"
    if len(tag) > LOCALE_MAX:
        return f"is longer than {LOCALE_MAX} characters"
    if not _LOCALE.match(tag):
        return f"{tag!r} is not a BCP 47 language tag such as 'en', 'fr-CA' or 'zh-Hant-TW'"
    return None


def fallbacks(wanted: str | None, default: str) -> list[str]:
    """The locales to try, best first: `wanted` less one subtag at a time, then `default`
    (`fr-CA`, `fr`, then `en`). A one-letter subtag is dropped with the one after it."""
    chain: list[str] = []
    tag = wanted
    while tag:
        if tag not in chain:
            chain.append(tag)
        tag = tag.rpartition("-")[0]
        if len(tag.rpartition("-")[2]) == 1:
            tag = tag.rpartition("-")[0]
    if default not in chain:
        chain.append(default)
    return chain


def chosen(available: Mapping[str, Any], wanted: str | None, default: str) -> str | None:
    """The locale of `available` a message asking for `wanted` gets (None: none fits)."""
    return next((tag for tag in fallbacks(wanted, default) if tag in available), None)


def template_name(name: object) -> str:
    problem = template_name_problem(name)
    if problem is not None:
        raise InvalidTemplate({"name": problem})
    assert isinstance(name, str)
    return name


@dataclass(frozen=True)
class Draft:
    """A version as an operator sends it, checked (`draft`): not yet compiled."""

    subject: str
    html: str
    text: str
    sample_data: Mapping[str, Any] = field(default_factory=dict)
    format: str = "jinja"


def draft(
    subject: object,
    html: object,
    text: object = "",
    sample_data: object = None,
    format: object = "jinja",
) -> Draft:
    """A version's fields checked, every problem at once (InvalidTemplate)."""
    errors: dict[str, str] = {}
    too_large: dict[str, str] = {}
    limits = {"subject": SUBJECT_SOURCE_MAX, "html": BODY_SOURCE_MAX, "text": BODY_SOURCE_MAX}
    given = {"subject": subject, "html": html, "text": "" if text is None else text}
    for name, value in given.items():
        if not isinstance(value, str):
            errors[name] = "must be a string"
        elif len(value) > limits[name]:
            too_large[name] = f"is longer than {limits[name]} characters"
        elif (problem := storable.text_problem(value)) is not None:
            errors[name] = problem
    if isinstance(subject, str) and not subject.strip():
        errors["subject"] = "is required"
    if isinstance(html, str) and isinstance(text, str) and not html.strip() and not text.strip():
        errors["html"] = "give html, text, or both"
    data = storable.json_object("sample_data", sample_data, errors, SAMPLE_DATA_MAX_BYTES)  # type: ignore[arg-type]
    if errors.get("sample_data", "").startswith("is larger than"):
        too_large["sample_data"] = errors.pop("sample_data")
    if format not in FORMATS:
        errors["format"] = f"must be one of {', '.join(FORMATS)}"
    if too_large:
        raise TemplateTooLarge({**errors, **too_large})
    if errors:
        raise InvalidTemplate(errors)
    assert isinstance(subject, str) and isinstance(html, str)
    return Draft(subject, html, str(given["text"]), data, str(format))


def draft_of(fields: Mapping[str, Any]) -> Draft:
    """`draft` from a mapping (an API body, a file pushed by the CLI)."""
    return draft(
        fields.get("subject"),
        fields.get("html", ""),
        fields.get("text", ""),
        fields.get("sample_data"),
        fields.get("format", "jinja"),
    )


def same(version: Version, draft: Draft) -> bool:
    """Whether publishing `draft` would write what `version` holds already."""
    return (version.subject, version.html, version.text, version.format) == (
        draft.subject,
        draft.html,
        draft.text,
        draft.format,
    ) and dict(version.sample_data) == dict(draft.sample_data)


@dataclass(frozen=True)
class Version:
    """One immutable version of a template in one locale."""

    id: int
    tenant_id: str
    name: str
    locale: str
    version: int
    format: str
    subject: str
    html: str
    text: str
    compiled_html: str | None  # an MJML version's html as HTML (with its Jinja)
    sample_data: Mapping[str, Any]
    # The other templates it extends or includes, by name: the version of each it uses.
    dependencies: Mapping[str, int]
    changed_by: str
    created_at: datetime

    def as_json(self, current: int | None = None) -> dict[str, Any]:
        """What the API and `mailbag templates show --json` say of it; `current`: the
        number of its locale's current version, if known."""
        return {
            "name": self.name,
            "locale": self.locale,
            "version": self.version,
            "current": None if current is None else self.version == current,
            "format": self.format,
            "subject": self.subject,
            "html": self.html,
            "text": self.text,
            "sample_data": dict(self.sample_data),
            "dependencies": dict(self.dependencies),
            "changed_by": self.changed_by,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True)
class Locale:
    """A template's locale: its current version, and how many it has."""

    locale: str
    current: int
    latest: int
    updated_at: datetime


@dataclass(frozen=True)
class Template:
    tenant_id: str
    name: str
    default_locale: str
    locales: Sequence[Locale]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "default_locale": self.default_locale,
            "locales": [
                {
                    "locale": held.locale,
                    "current_version": held.current,
                    "latest_version": held.latest,
                    "updated_at": held.updated_at.isoformat(),
                }
                for held in self.locales
            ],
        }


@dataclass(frozen=True)
class Pin:
    """The version a message renders with, decided at enqueue. `version_id` None: a file
    template of the deployment (no versions, no locales)."""

    version_id: int | None = None
    version: int | None = None
    locale: str | None = None


FILE_TEMPLATE = Pin()
