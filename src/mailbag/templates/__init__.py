"""Email templates: per name a subject, an HTML body and a text body, rendered with Jinja2.

A catalog is a folder with one sub-folder per template:

    welcome/subject.txt   one line; `{{ name }}` placeholders
    welcome/body.html     autoescaped HTML
    welcome/body.txt      plain text

`TEMPLATES_DIR` adds (or overrides) templates on top of the built-in ones. Undefined
variables are errors (StrictUndefined): an email that says "Hello ," is worse than none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from mailbag.domain.message import unsafe_text

BUILTIN_DIR = Path(__file__).parent / "builtin"
PARTS = ("subject.txt", "body.html", "body.txt")


class TemplateError(Exception):
    """Rendering failed for a reason retrying cannot fix (a permanent failure)."""


@dataclass(frozen=True)
class Rendered:
    subject: str
    html: str
    text: str


class Catalog:
    def __init__(self, *folders: Path | None) -> None:
        # Later folders override earlier ones, so a user's folder wins over the built-ins.
        self.folders = [BUILTIN_DIR, *(Path(f) for f in folders if f is not None)]
        for folder in self.folders:
            if not folder.is_dir():
                raise TemplateError(f"templates folder {folder} does not exist")
        loader = jinja2.FileSystemLoader([str(f) for f in reversed(self.folders)])
        common: dict[str, Any] = {
            "loader": loader,
            "undefined": jinja2.StrictUndefined,
            "keep_trailing_newline": True,
            "auto_reload": False,
        }
        self._html = jinja2.Environment(autoescape=True, **common)
        self._text = jinja2.Environment(autoescape=False, **common)  # noqa: S701
        self._names = frozenset(
            entry.name
            for folder in self.folders
            for entry in folder.iterdir()
            if entry.is_dir() and all((entry / part).is_file() for part in PARTS)
        )

    def names(self) -> frozenset[str]:
        return self._names

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def render(self, name: str, data: Mapping[str, Any], subject: str | None = None) -> Rendered:
        """Render all three parts; a caller-given subject replaces the template's."""
        if name not in self._names:
            raise TemplateError(f"unknown template {name!r}")
        try:
            # A caller's subject is sent exactly as given; a template's loses the blank
            # space around it (subject.txt ends with a newline).
            subject_text = (
                subject
                if subject is not None
                else self._text.get_template(f"{name}/subject.txt").render(data).strip()
            )
            html = self._html.get_template(f"{name}/body.html").render(data)
            text = self._text.get_template(f"{name}/body.txt").render(data)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {name!r}: {type(exc).__name__}: {exc}") from exc
        problem = unsafe_text(subject_text)  # the rule enqueue applies to a given subject
        if problem is not None:
            raise TemplateError(f"template {name!r}: the rendered subject {problem}")
        if not subject_text.strip():
            raise TemplateError(f"template {name!r}: the rendered subject is empty")
        return Rendered(subject_text, html, text)


_builtin: Catalog | None = None


def builtin() -> Catalog:
    global _builtin
    if _builtin is None:
        _builtin = Catalog()
    return _builtin


def load(templates_dir: Path | None) -> Catalog:
    return builtin() if templates_dir is None else Catalog(templates_dir)
