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
from jinja2.runtime import new_context

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
        self._parts: dict[str, tuple[_Part, _Part, _Part]] = {}  # compiled, by name
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
        parts = self._parts.get(name)
        if parts is None:
            if name not in self._names:
                raise TemplateError(f"unknown template {name!r}")
            parts = self._parts[name] = self._load(name)
        subject_part, html_part, text_part = parts
        try:
            # A caller's subject is sent exactly as given; a template's loses the blank
            # space around it (subject.txt ends with a newline).
            subject_text = subject if subject is not None else subject_part.render(data).strip()
            html = html_part.render(data)
            text = text_part.render(data)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {name!r}: {type(exc).__name__}: {exc}") from exc
        problem = unsafe_text(subject_text)  # the rule enqueue applies to a given subject
        if problem is not None:
            raise TemplateError(f"template {name!r}: the rendered subject {problem}")
        if not subject_text.strip():
            raise TemplateError(f"template {name!r}: the rendered subject is empty")
        return Rendered(subject_text, html, text)

    def _load(self, name: str) -> tuple[_Part, _Part, _Part]:
        try:
            return (
                _Part(self._text.get_template(f"{name}/subject.txt")),
                _Part(self._html.get_template(f"{name}/body.html")),
                _Part(self._text.get_template(f"{name}/body.txt")),
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {name!r}: {type(exc).__name__}: {exc}") from exc


class _Part:
    """One compiled template, rendered as `Template.render` does it, minus the cost of
    merging its globals into every context: Jinja rebuilds them from a ChainMap at each
    render (a third of the time for a short template); here they are merged once."""

    def __init__(self, template: jinja2.Template) -> None:
        self.template = template
        self.globals = dict(template.globals)

    def render(self, data: Mapping[str, Any]) -> str:
        template = self.template
        context = new_context(
            template.environment,
            template.name,
            template.blocks,
            {**self.globals, **data},
            shared=True,  # the dict above is this render's own: nothing to copy again
            globals=self.globals,
        )
        try:
            return template.environment.concat(template.root_render_func(context))
        except Exception:
            template.environment.handle_exception()  # raises, with the template's lines


_builtin: Catalog | None = None


def builtin() -> Catalog:
    global _builtin
    if _builtin is None:
        _builtin = Catalog()
    return _builtin


def load(templates_dir: Path | None) -> Catalog:
    return builtin() if templates_dir is None else Catalog(templates_dir)
