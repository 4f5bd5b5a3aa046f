"""MJML to HTML, with mrml (the Rust implementation), for templates whose html is MJML.

The rules:

- Compiled once per template version, when it is compiled, never per email. Jinja inside
  the MJML is text to mrml and comes out as it went in; Jinja then compiles the HTML.
- mrml includes nothing: `<mj-include>` is refused (it would read files or URLs).
- mrml recurses on the stack of the thread it runs in, and a stack overflow kills the
  process: nesting deeper than `MAX_DEPTH` is refused, and mrml runs in a thread of its
  own with a large stack.
- Problems are `TemplateProblems` with mrml's message; mrml missing is a problem that says
  which extra to install.
"""

from __future__ import annotations

import re
import threading
from typing import Any

MAX_DEPTH = 1_000  # elements inside one another; legible MJML stays below a few dozen
_STACK_BYTES = 64 * 1024 * 1024  # measured: ~4 KiB of stack per level of <mj-wrapper>
_stack_lock = threading.Lock()  # threading.stack_size is process-wide: set, start, restore

_TAGS = re.compile(r"<(/?)([A-Za-z][\w:-]*)[^<>]*?(/?)>")
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source"}
    | {"track", "wbr", "mj-all", "mj-attributes", "mj-breakpoint", "mj-class", "mj-font"}
)


def to_html(source: str, *, part: str = "html") -> str:
    """The HTML of an MJML document; `part` names it in problems ("layout/html")."""
    from mailbag.templates.problems import Problem, TemplateProblems

    try:
        import mrml
    except ImportError:
        message = "MJML needs the mjml extra: pip install 'mailbag[mjml]'"
        raise TemplateProblems([Problem(part, None, message)]) from None
    if _depth(source) > MAX_DEPTH:
        message = f"MJML nested more than {MAX_DEPTH} elements deep"
        raise TemplateProblems([Problem(part, None, message)])
    outcome: dict[str, Any] = {}

    def convert() -> None:
        try:
            options = mrml.ParserOptions(include_loader=mrml.noop_loader())
            outcome["html"] = mrml.to_html(source, parser_options=options)
        except BaseException as exc:  # a Rust panic is a BaseException (pyo3)
            outcome["error"] = exc

    with _stack_lock:
        previous = threading.stack_size(_STACK_BYTES)
        try:
            worker = threading.Thread(target=convert, name="mailbag-mjml", daemon=True)
            worker.start()
        finally:
            threading.stack_size(previous)
    worker.join()
    error = outcome.get("error")
    if error is not None:
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise error
        message = f"MJML: {error}" if str(error) else f"MJML: {type(error).__name__}"
        raise TemplateProblems([Problem(part, None, message)])
    result = outcome["html"]
    html = getattr(result, "content", result)  # an Output since mrml 0.2, a str before
    if not isinstance(html, str):
        raise TemplateProblems([Problem(part, None, "MJML: mrml returned no HTML")])
    return html


def _depth(source: str) -> int:
    """How deep elements nest (an unclosed HTML tag counts as open: an overestimate)."""
    depth = deepest = 0
    for closing, name, self_closing in _TAGS.findall(source):
        if closing:
            depth = max(depth - 1, 0)
        elif not self_closing and name.lower() not in _VOID:
            depth += 1
            deepest = max(deepest, depth)
    return deepest
