"""Operators' templates, stored in the database: rendered in Jinja2's sandbox, on a budget.

The rules:

- A template version is three Jinja sources (subject, html, text) and a format. An MJML
  version's html is MJML with Jinja inside, compiled to HTML once, when the version is
  compiled; Jinja then compiles that HTML. So an MJML template is compiled on its own: what
  it extends or includes is HTML already (a library template's html, compiled from its own
  MJML if it is one), and a child that only fills an MJML layout's blocks is a "jinja" one.
  An empty text source means "the text of the rendered HTML" (inscriptis).
- Templates run in `ImmutableSandboxedEnvironment`: no attribute starting with "_", no
  method that changes a list, dict or set (not even through the class: `dict.update(x, y)`),
  `str.format` sandboxed too. An unsafe attribute is an error at once, not an undefined
  value. Undefined variables are errors (StrictUndefined). `lipsum` is gone.
- A template names the other templates it extends, includes or imports with literal strings,
  so what a version depends on is known when it is published. They come from the tenant's
  `library`, resolved by the caller: the html part loads the library template's html, the
  text part its text, the subject part its subject.
- Compiling runs no template code: Jinja's optimizer is off, and every hook fails outside a
  render, which Jinja's compiler takes as "not a constant: evaluate it when rendering".
- The budget of one render (all three parts): `Budget.seconds` of wall time, checked by code
  the template cannot avoid: every loop iteration, every call (macros included), every
  filter and every intercepted operator. No thread is killed and no tracer is installed.
- Sizes, checked before the work where the size can be known first, else right after it:
  no string, part or joined buffer longer than `Budget.max_output` characters; no list,
  tuple or dict built by the template with more than `MAX_ITEMS` items or printing longer
  than `max_output` (counted flattened: `[x, x]` weighs twice x); no integer beyond
  `MAX_INT_BITS` bits. Whatever may pile up is counted against `ALLOWANCE_FACTOR` x
  `max_output` characters for the whole render: values printed where they can print many
  times, joined buffers, the literal text of each loop iteration, block run and include,
  and every big value built (from `_CHARGED_FROM` characters). So memory stays bounded
  even when nothing single is too big, and the final join of a part is safe.
- A namespace may not be stored in a list, dict or another namespace: it is the one object
  a template can change, so a size checked once could not be trusted afterwards.
- Errors are `TemplateProblems` (part, line, message) or `RenderBudgetExceeded`; their
  messages name no Python class or module.
"""

from __future__ import annotations

import codecs
import functools
import json
import re
import types
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from string import Formatter
from threading import get_ident
from time import monotonic
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.environment import TemplateModule
from jinja2.exceptions import SecurityError
from jinja2.filters import FILTERS as DEFAULT_FILTERS
from jinja2.nodes import EvalContext
from jinja2.runtime import Context, LoopContext, Undefined, new_context
from jinja2.sandbox import (
    ImmutableSandboxedEnvironment,
    SandboxedEscapeFormatter,
    SandboxedFormatter,
)
from jinja2.utils import Namespace, pass_environment, pass_eval_context
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from mailbag.domain.content import text_from_html
from mailbag.domain.message import unsafe_text
from mailbag.templates import Rendered, TemplateError
from mailbag.templates.problems import Problem, RenderBudgetExceeded, TemplateProblems

__all__ = [
    "Budget",
    "Compiled",
    "Parts",
    "Problem",
    "RenderBudgetExceeded",
    "Sandbox",
    "TemplateProblems",
    "referenced",
]

KINDS = ("subject", "html", "text")
MAX_ITEMS = 100_000  # items in one list, tuple or dict the template builds (as MAX_RANGE)
MAX_INT_BITS = 65_536  # Python prints at most 4,300 digits anyway (~14,300 bits)
ALLOWANCE_FACTOR = 16  # all the characters one render prints or builds, in max_outputs
_CHARGED_FROM = 65_536  # built values this long count against the allowance; shorter are free
_SMALL = 32  # printed strings this short are paid for in advance, per `{{ }}` in the source


@dataclass(frozen=True)
class Parts:
    """The sources of one template version."""

    subject: str
    html: str
    text: str  # "": the text of the rendered HTML
    format: str = "jinja"  # "jinja" | "mjml" (the html source is MJML)


@dataclass(frozen=True)
class Budget:
    seconds: float = 1.0  # wall time for one render of all three parts
    max_output: int = 2_000_000  # characters: any part, any string or list built on the way


# --- names of other templates --------------------------------------------------------

_PARSER = jinja2.Environment()  # noqa: S701 (parses only: the syntax is the sandbox's)
_REFERENCES = (nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport)


def referenced(parts: Parts) -> set[str]:
    """Names of other templates the parts extend, include or import. A name that is not a
    literal string (`{% include var %}`) is a problem: what a version depends on must be
    known when it is published."""
    names: set[str] = set()
    problems: list[Problem] = []
    for kind in KINDS:
        source = getattr(parts, kind)
        try:
            tree = _PARSER.parse(source)
        except jinja2.TemplateSyntaxError as exc:
            problems.append(Problem(kind, exc.lineno, exc.message or "syntax error"))
            continue
        found, unnamed = _names_in(tree)
        names |= found
        problems += [Problem(kind, line, _NOT_LITERAL) for line in unnamed]
    if problems:
        raise TemplateProblems(problems)
    return names


_NOT_LITERAL = 'the name of another template must be a quoted string ({% include "name" %})'


def _names_in(tree: nodes.Template) -> tuple[set[str], list[int]]:
    """The literal template names in a parsed template, and the lines of those that are not."""
    names: set[str] = set()
    unnamed: list[int] = []
    for node in tree.find_all(_REFERENCES):
        target = node.template  # type: ignore[attr-defined]
        if isinstance(target, nodes.Const) and isinstance(target.value, str):
            names.add(target.value)
        elif isinstance(target, nodes.Const) and isinstance(target.value, list | tuple):
            # {% include ["a", "b"] %}: the first that exists
            if all(isinstance(name, str) for name in target.value):
                names.update(target.value)
            else:
                unnamed.append(node.lineno)
        elif isinstance(target, nodes.List | nodes.Tuple) and all(
            isinstance(item, nodes.Const) and isinstance(item.value, str) for item in target.items
        ):
            names.update(item.value for item in target.items)  # type: ignore[attr-defined]
        else:
            unnamed.append(node.lineno)
    return names, unnamed


# --- the budget of one render ----------------------------------------------------------


class _OverBudget(BaseException):
    """Raised inside a render when its budget is spent. A BaseException so that nothing on
    the way (a data object's `except Exception`) can swallow it; turned into
    RenderBudgetExceeded, with the part and line, where the part is rendered."""


_LONG_AGO = float("-inf")


class _NotRendering(Exception):
    """A hook ran outside `Compiled.render`."""


class _Render:
    """The budget of the render under way, in `_current`: the hooks read it there. Renders
    are synchronous, so one object per thread serves them all, one after the other."""

    __slots__ = (
        "active",
        "allowance",
        "built",
        "deadline",
        "max_output",
        "memo",
        "seconds",
        "thread",
    )

    def __init__(self, thread: int | None = None) -> None:
        self.thread = thread
        self.seconds = 0.0
        self.max_output = self.built = 0
        # id -> (value, weight) of containers already weighed (they cannot change); made
        # when first needed, which most renders never do.
        self.memo: dict[int, tuple[object, int]] | None = None
        self.end()

    def begin(self, seconds: float, max_output: int, allowance: int) -> None:
        self.active = True
        self.seconds = seconds
        self.deadline = monotonic() + seconds
        self.max_output = max_output
        self.allowance = allowance
        self.built = 0
        if self.memo is not None:
            self.memo = None

    def end(self) -> None:
        # Between renders every hook fails: the deadline is past and nothing is allowed.
        self.active = False
        self.deadline = _LONG_AGO
        self.allowance = -1

    def tick(self) -> None:
        if monotonic() > self.deadline:
            self.out_of_time()

    def out_of_time(self) -> NoReturn:
        self.fail(f"rendering took longer than {self.seconds:g} s")

    def charge(self, size: int) -> None:
        self.built += size
        if self.built > self.allowance:
            self.fail(f"the template built more than {self.allowance} characters")

    def too_long(self, what: str = "a value built in the template") -> NoReturn:
        self.fail(f"{what} is longer than {self.max_output} characters")

    def fail(self, message: str) -> NoReturn:
        if not self.active:
            # An Exception: Jinja's compiler, evaluating a constant, takes it as "not constant".
            raise _NotRendering("template code ran outside a budgeted render")
        raise _OverBudget(message)

    def checked(self, value: Any) -> Any:
        """`value`, built by a hook, once its size is known to be in the budget."""
        cls = type(value)
        if cls is str or cls is Markup or cls is bytes or isinstance(value, str | bytes):
            size = len(value)
            if size > self.max_output:
                self.too_long()
            if size >= _CHARGED_FROM:
                self.charge(size)
        elif cls is int:
            if value.bit_length() > MAX_INT_BITS:
                self.fail(f"an integer built in the template exceeds {MAX_INT_BITS} bits")
        elif isinstance(value, _CONTAINERS):
            if len(value) > MAX_ITEMS:
                self.fail(f"a list built in the template has more than {MAX_ITEMS} items")
            self.weigh(value)
        elif isinstance(value, Namespace):
            self.weigh(value)
        return value

    def weigh(self, value: Any) -> int:
        """About how long `value` prints, counting shared parts each time they print
        (`[x, x]` twice x): what `str`, `tojson` or `==` would walk through. Raises past
        max_output, so the walk is never longer than that either."""
        memo = self.memo
        if memo is None:
            memo = self.memo = {}
        known = memo.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        limit = self.max_output
        total = 0
        steps = 0
        stack = [value]
        top = True
        while stack:
            item = stack.pop()
            cls = type(item)
            if cls is str or cls is Markup or cls is bytes:
                total += len(item) + 2
            elif cls is int or cls is bool:
                total += 2 + item.bit_length() // 3
            elif isinstance(item, _CONTAINERS):
                known = memo.get(id(item))
                if known is not None and known[0] is item:
                    total += known[1]
                else:
                    total += 2 + 2 * len(item)  # brackets and separators
                    if total > limit:
                        break
                    if isinstance(item, dict):
                        stack += item.keys()
                        stack += item.values()
                    else:
                        stack += item
            elif isinstance(item, Namespace):
                if not top:
                    raise SecurityError("a namespace cannot be stored in a list or a namespace")
                attributes = _attributes(item)
                total += 12 + 2 * len(attributes)
                stack += attributes.values()
            elif isinstance(item, _Module):
                total += item.mailbag_size
            elif isinstance(item, str | bytes):
                total += len(item) + 2
            else:
                total += 8  # a number, a date, a macro: prints short (data objects are trusted)
            if total > limit:
                break
            top = False
            steps += 1
            if not steps & 4095:
                self.tick()
        if total > limit:
            self.too_long()
        if isinstance(value, _CONTAINERS):  # namespaces change: never remembered
            self.remember(value, total)
        return total

    def remember(self, value: Any, weight: int) -> None:
        memo = self.memo
        if memo is None:
            memo = self.memo = {}
        elif len(memo) >= 4096:
            memo.clear()
        memo[id(value)] = (value, weight)


_CONTAINERS: tuple[type[Collection[Any]], ...] = (
    list,
    tuple,
    dict,
    set,
    frozenset,
    type({}.keys()),
    type({}.values()),
    type({}.items()),
)


def _attributes(namespace: Namespace) -> dict[str, Any]:
    attributes: dict[str, Any] = object.__getattribute__(namespace, "_Namespace__attrs")
    return attributes


# No thread's: outside a render every hook fails.
_NOT_RENDERING = _Render()
_current: ContextVar[_Render] = ContextVar("mailbag_template_render", default=_NOT_RENDERING)


def _joined(chunks: Iterable[str]) -> str:
    """`Environment.concat` (macros, `{% set %}` blocks, `{% filter %}`, `super()`): the
    size is checked before the join, which is where a loop of references would become a
    string of gigabytes, and counted against the allowance."""
    state = _current.get()
    state.tick()
    if not isinstance(chunks, list):
        chunks = list(chunks)
    size = sum(map(len, chunks))
    if size > state.max_output:
        state.too_long()
    state.charge(size)  # a new string, which may be printed or joined again and again
    return "".join(chunks)


def _printed(value: Any) -> Any:
    """A `{{ value }}` that may run many times: counted against the allowance before it is
    printed. A short string is not: the part that prints it paid in advance (`static_size`)."""
    cls = type(value)
    if cls is str or cls is Markup:
        if len(value) > _SMALL:
            _current.get().charge(len(value))
        return value
    if cls is int or cls is float or cls is bool or value is None:
        return value
    if isinstance(value, Undefined):
        return value  # printing it raises the UndefinedError that names it
    state = _current.get()
    if isinstance(value, _Module):
        state.charge(value.mailbag_size)
    elif isinstance(value, (str, bytes, Namespace, *_CONTAINERS)):
        state.charge(state.weigh(value))
    return value


def _budgeted(iterable: Iterable[Any]) -> Iterator[Any]:
    """Every `{% for %}` iterates through this: one deadline check per item, so even nested
    loops with empty bodies stop in time."""
    state = _current.get()
    deadline = state.deadline
    for item in iterable:
        if monotonic() > deadline:
            state.out_of_time()
        yield item


def _sized(value: Any) -> Any:
    """`a ~ b` and list, tuple and dict literals: their size, right after they are built."""
    state = _current.get()
    state.tick()
    return state.checked(value)


def _charge(size: int) -> str:
    """The literal text of a loop body (per iteration) or of a block (per run)."""
    _current.get().charge(size)
    return ""


@pass_environment
def _charge_templates(environment: jinja2.Environment, names: tuple[str, ...]) -> str:
    """Before an include or an extends: the literal text of the template it runs."""
    sizes: dict[str | None, int] = environment.literal_sizes  # type: ignore[attr-defined]
    _current.get().charge(max((sizes.get(name, 0) for name in names), default=0))
    return ""


def _charged(value: Any) -> Any:
    """A `{% filter %}` block's output: the filter may make it longer than what was counted."""
    state = _current.get()
    state.charge(len(value) if isinstance(value, str) else state.weigh(value))
    return value


def _ns_sized(value: Any, namespace: Any, attribute: str) -> Any:
    """`{% set ns.attribute = value %}`: the namespace stays printable within the budget."""
    state = _current.get()
    state.tick()
    if isinstance(value, Namespace):
        raise SecurityError("a namespace cannot be stored in a list or a namespace")
    state.checked(value)
    if isinstance(namespace, Namespace):
        total = state.weigh(value)
        for name, other in _attributes(namespace).items():
            if name != attribute:
                total += state.weigh(other)
        if total > state.max_output:
            state.too_long("a namespace")
    return value


# --- operators and calls ---------------------------------------------------------------


def _check_multiply(left: Any, right: Any, state: _Render) -> None:
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            state.fail(f"an integer built in the template exceeds {MAX_INT_BITS} bits")
        return
    for sequence, times in ((left, right), (right, left)):
        if not isinstance(times, int) or times <= 0:
            continue
        if isinstance(sequence, str | bytes):
            if len(sequence) * times > state.max_output:
                state.too_long()
        elif isinstance(sequence, list | tuple):
            if len(sequence) * times > MAX_ITEMS:
                state.fail(f"a list built in the template has more than {MAX_ITEMS} items")
            if state.weigh(sequence) * times > state.max_output:
                state.too_long()


def _check_power(base: Any, exponent: Any, state: _Render) -> None:
    if not (isinstance(base, int) and isinstance(exponent, int)) or exponent <= 0:
        return
    if base not in (-1, 0, 1) and base.bit_length() * exponent > MAX_INT_BITS:
        state.fail(f"an integer built in the template exceeds {MAX_INT_BITS} bits")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.?)")
_NUMBERS = re.compile(r"\d+")


def _check_number(digits: str, state: _Render) -> int:
    """A width or precision written in a format: at most max_output."""
    if len(digits) > 9 or int(digits) > state.max_output:
        state.too_long("a formatted value")
    return int(digits)


def _check_percent(template: str | bytes, values: Any, state: _Render) -> None:
    """`'%...' % values` and `|format`: refused before formatting when the widths, or the
    values times the number of conversions, would be too long."""
    text = template.decode("latin-1") if isinstance(template, bytes) else template
    conversions = 0
    widest = 0
    for match in _PERCENT_SPEC.finditer(text):
        width, precision, conversion = match.groups()
        if conversion == "%":
            continue
        if width == "*" or precision == "*":
            raise SecurityError("'*' widths in % formatting")
        for number in (width, precision):
            if number:
                widest = max(widest, _check_number(number, state))
        conversions += 1
    if not conversions:
        return
    if isinstance(values, tuple):
        printed = sum(state.weigh(value) for value in values)  # one conversion each
    elif isinstance(values, Mapping):  # "%(name)s": a name may be used many times
        printed = conversions * max((state.weigh(v) for v in values.values()), default=0)
    else:
        printed = conversions * state.weigh(values)
    if len(text) + printed + conversions * widest > state.max_output:
        state.too_long("a formatted value")


_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})
_CODECS = frozenset({"utf-8", "ascii", "latin-1", "iso8859-1", "utf-16", "utf-32", "cp1252"})


def _check_text_method(
    text: str | bytes, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], state: _Render
) -> tuple[Any, ...]:
    """Methods of str and bytes whose result can be far longer than the string: refused
    before they run when it would be too long. Returns the arguments (join's iterable made
    a list, to be measured)."""
    limit = state.max_output
    if name in _WIDTH_METHODS:
        width = args[0] if args else kwargs.get("width")
        if isinstance(width, int) and width > limit:
            state.too_long()
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        tab = "\t" if isinstance(text, str) else b"\t"
        if isinstance(size, int) and (text.count(tab) + 1) * size + len(text) > limit:  # type: ignore[arg-type]
            state.too_long()
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        if isinstance(old, str | bytes) and isinstance(new, str | bytes):
            times = text.count(old) if old else len(text) + 1  # type: ignore[arg-type]
            if isinstance(count, int) and count >= 0:
                times = min(times, count)
            if len(text) + times * max(len(new) - len(old), 0) > limit:
                state.too_long()
    elif name == "join" and args:
        items = list(args[0])
        size = len(text) * max(len(items) - 1, 0)
        size += sum(len(item) for item in items if isinstance(item, str | bytes))
        if size > limit:
            state.too_long()
        return (items, *args[1:])
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str | bytes)), default=1)
        if len(text) * longest > limit:
            state.too_long()
    elif name in ("encode", "decode"):
        # Codecs such as punycode take time quadratic in the length of the text.
        encoding = args[0] if args else kwargs.get("encoding", "utf-8")
        try:
            known = codecs.lookup(encoding).name
        except (LookupError, TypeError):
            known = None
        if known not in _CODECS:
            raise SecurityError(f"the {encoding!r} encoding")
    return args


def _callable_name(value: Any) -> str:
    name = getattr(value, "__name__", None)
    return repr(name) if isinstance(name, str) else "this value"


# --- str.format ------------------------------------------------------------------------


class _SizedFields(Formatter):
    """`str.format` in the sandbox, with every width and precision at most max_output and
    the fields, together, no longer than that."""

    size = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        state = _current.get()
        state.tick()
        for digits in _NUMBERS.findall(format_spec):
            _check_number(digits, state)
        if len(format_spec) > state.max_output:
            state.too_long("a formatted value")
        formatted = super().format_field(value, format_spec)
        self.size += len(formatted)
        if self.size > state.max_output:
            state.too_long("a formatted value")
        return formatted


class _BudgetedFormatter(_SizedFields, SandboxedFormatter):
    pass


class _BudgetedEscapeFormatter(_SizedFields, SandboxedEscapeFormatter):
    pass


# --- filters ---------------------------------------------------------------------------

_do_join = DEFAULT_FILTERS["join"]
_do_replace = DEFAULT_FILTERS["replace"]
_do_indent = DEFAULT_FILTERS["indent"]
_do_wordwrap = DEFAULT_FILTERS["wordwrap"]
_do_center = DEFAULT_FILTERS["center"]
_do_format = DEFAULT_FILTERS["format"]
_do_batch = DEFAULT_FILTERS["batch"]
_do_slice = DEFAULT_FILTERS["slice"]
_do_striptags = DEFAULT_FILTERS["striptags"]
_do_urlize = DEFAULT_FILTERS["urlize"]
_do_tojson = DEFAULT_FILTERS["tojson"]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


@pass_eval_context
def _join(eval_ctx: EvalContext, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
    state = _current.get()
    items = list(value)
    # Items and separator weighed before the join: a separator of a megabyte between a
    # hundred thousand items is a string of a hundred gigabytes.
    size = len(_text(d)) * max(len(items) - 1, 0)
    if size > state.max_output:
        state.too_long()
    if attribute is None:
        for item in items:
            size += state.weigh(item)
            if size > state.max_output:
                state.too_long()
    result: str = _do_join(eval_ctx, items, d, attribute)
    return result


@pass_eval_context
def _replace(eval_ctx: EvalContext, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    state = _current.get()
    text, old_text, new_text = _text(s), _text(old), _text(new)
    times = text.count(old_text) if old_text else len(text) + 1
    if count is not None and count >= 0:
        times = min(times, count)
    if len(text) + times * max(len(new_text) - len(old_text), 0) > state.max_output:
        state.too_long()
    result: str = _do_replace(eval_ctx, s, old, new, count)
    return result


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    state = _current.get()
    if isinstance(width, int) and width > state.max_output:
        state.too_long()
    step = len(width) if isinstance(width, str) else max(width, 0)
    if len(_text(s)) + (_text(s).count("\n") + 1) * step > state.max_output:
        state.too_long()
    result: str = _do_indent(s, width, first, blank)
    return result


@pass_environment
def _wordwrap(
    environment: jinja2.Environment,
    s: Any,
    width: int = 79,
    break_long_words: bool = True,
    wrapstring: str | None = None,
    break_on_hyphens: bool = True,
) -> str:
    state = _current.get()
    text = _text(s)
    between = len(environment.newline_sequence if wrapstring is None else _text(wrapstring))
    # Every line holds at least one character: at most len(text) separators.
    if len(text) * (1 + between) > state.allowance:
        state.too_long()
    result: str = _do_wordwrap(
        environment, s, width, break_long_words, wrapstring, break_on_hyphens
    )
    return result


def _center(value: Any, width: int = 80) -> str:
    state = _current.get()
    if isinstance(width, int) and width > state.max_output:
        state.too_long()
    result: str = _do_center(value, width)
    return result


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    _check_percent(_text(value), kwargs or args, _current.get())
    result: str = _do_format(value, *args, **kwargs)
    return result


def _batch(value: Iterable[Any], linecount: int, fill_with: Any = None) -> Iterator[list[Any]]:
    state = _current.get()
    if isinstance(linecount, int) and linecount > MAX_ITEMS:
        state.fail(f"a list built in the template has more than {MAX_ITEMS} items")
    if fill_with is not None and linecount * state.weigh(fill_with) > state.max_output:
        state.too_long()
    result: Iterator[list[Any]] = _do_batch(value, linecount, fill_with)
    return result


def _slice(value: Any, slices: int, fill_with: Any = None) -> Iterator[list[Any]]:
    state = _current.get()
    if isinstance(slices, int) and slices > MAX_ITEMS:
        state.fail(f"a list built in the template has more than {MAX_ITEMS} items")
    if fill_with is not None and slices * state.weigh(fill_with) > state.max_output:
        state.too_long()
    result: Iterator[list[Any]] = _do_slice(value, slices, fill_with)
    return result


@pass_environment
def _sum(
    environment: jinja2.Environment, iterable: Iterable[Any], attribute: Any = None, start: Any = 0
) -> Any:
    """Python's sum adds lists one to the next, in time quadratic in the items: lists and
    tuples are summed by extending one list instead."""
    if attribute is not None:
        iterable = map(jinja2.filters.make_attrgetter(environment, attribute), iterable)
    if not isinstance(start, list | tuple):
        return sum(iterable, start)
    state = _current.get()
    total = list(start)
    for item in iterable:
        if not isinstance(item, type(start)):
            kind = type(start).__name__
            raise TypeError(f'can only concatenate {kind} (not "{type(item).__name__}") to {kind}')
        total.extend(item)
        if len(total) > MAX_ITEMS:
            state.fail(f"a list built in the template has more than {MAX_ITEMS} items")
        state.tick()
    return total if isinstance(start, list) else tuple(total)


def _striptags(value: Any) -> str:
    # markupsafe removes one tag at a time, copying the rest: time ~ tags x length.
    text = _text(value)
    state = _current.get()
    if text.count("<") * len(text) > 50 * state.allowance:
        state.fail("striptags on so long a text with so many tags")
    result: str = _do_striptags(value)
    return result


@pass_eval_context
def _urlize(
    eval_ctx: EvalContext,
    value: Any,
    trim_url_limit: int | None = None,
    nofollow: bool = False,
    target: str | None = None,
    rel: str | None = None,
    extra_schemes: Iterable[str] | None = None,
) -> str:
    state = _current.get()
    text = _text(value)
    # Each word may become a link that repeats it, with the target and rel attributes.
    extra = len(_text(target or "")) + len(_text(rel or "")) + 64
    if 3 * len(text) + len(text.split()) * extra > state.allowance:
        state.too_long()
    result: str = _do_urlize(eval_ctx, value, trim_url_limit, nofollow, target, rel, extra_schemes)
    return result


@pass_eval_context
def _tojson(eval_ctx: EvalContext, value: Any, indent: int | str | None = None) -> Markup:
    if indent is None:  # as long as the value prints, about
        result: Markup = _do_tojson(eval_ctx, value)
        return result
    # Indented, nesting multiplies the length: encoded piece by piece, counted as it goes.
    state = _current.get()
    if (isinstance(indent, int) and indent > 16) or (isinstance(indent, str) and len(indent) > 16):
        raise SecurityError("tojson indents of more than 16")
    options = dict(eval_ctx.environment.policies["json.dumps_kwargs"])
    encoder = json.JSONEncoder(indent=indent, **options)
    pieces: list[str] = []
    size = 0
    for piece in encoder.iterencode(value):
        size += len(piece)
        if size > state.max_output:
            state.too_long()
        pieces.append(piece)
        if not len(pieces) & 1023:
            state.tick()
    encoded = "".join(pieces)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        encoded = encoded.replace(char, escaped)
    return Markup(encoded)  # noqa: S704 (JSON with <, >, & and ' escaped, as Jinja's tojson)


_SPECIAL: dict[str, Callable[..., Any]] = {
    "join": _join,
    "replace": _replace,
    "indent": _indent,
    "wordwrap": _wordwrap,
    "center": _center,
    "format": _format,
    "batch": _batch,
    "slice": _slice,
    "sum": _sum,
    "striptags": _striptags,
    "urlize": _urlize,
    "tojson": _tojson,
}
# Filters that return one of their inputs, or a number: nothing to count, and fast.
_AS_IS = frozenset(
    {"default", "d", "length", "count", "first", "last", "attr", "abs", "int", "float"}
    | {"round", "min", "max", "random", "wordcount", "filesizeformat"}
)
_DROPPED = frozenset({"pprint"})  # pure-Python pretty printing: slow, and deep nesting multiplies


def _budgeted_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)  # keeps jinja_pass_arg: Jinja passes context/env the same way
    def run(*args: Any, **kwargs: Any) -> Any:
        state = _current.get()
        state.tick()
        return state.checked(function(*args, **kwargs))

    return run


def _filters() -> dict[str, Callable[..., Any]]:
    filters: dict[str, Callable[..., Any]] = {}
    for name, function in DEFAULT_FILTERS.items():
        if name in _DROPPED:
            continue
        if name in _AS_IS:
            filters[name] = function
        else:
            filters[name] = _budgeted_filter(_SPECIAL.get(name, function))
    # The hooks the rewritten templates call (harmless if a template names them too).
    filters["_budgeted"] = _budgeted
    filters["_sized"] = _sized
    filters["_ns_sized"] = _ns_sized
    filters["_charge"] = _charge
    filters["_charge_templates"] = _charge_templates
    filters["_charged"] = _charged
    filters["_printed"] = _printed
    return filters


_FILTERS = _filters()


# --- the environment -------------------------------------------------------------------


def _filter(node: nodes.Node | None, name: str, *args: nodes.Expr, lineno: int) -> nodes.Filter:
    # Jinja's nodes take their fields positionally, untyped: any node goes.
    return nodes.Filter(node, name, list(args), [], None, None, lineno=lineno)


# Parts of a template that count their own literal text (or are joined, and counted there).
_OWN_UNITS: tuple[type[nodes.Node], ...] = (nodes.For, nodes.Block, nodes.Macro, nodes.CallBlock)
_OWN_UNITS += (nodes.FilterBlock, nodes.AssignBlock)


def static_size(body: list[nodes.Node]) -> int:
    """What one run of `body` may yield without a hook counting it: its literal text and
    `_SMALL` characters per `{{ }}` (a longer value is counted as it is printed), but for
    the parts inside it that count their own."""
    size = 0
    stack: list[nodes.Node] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.TemplateData):
            size += len(node.data)
        elif isinstance(node, nodes.Output):
            size += _SMALL * sum(not isinstance(n, nodes.TemplateData) for n in node.nodes)
            stack += node.nodes
        elif isinstance(node, nodes.For):
            stack += node.else_  # runs once, in the enclosing part
        elif not isinstance(node, _OWN_UNITS):
            stack += node.iter_child_nodes()
    return size


def _charge_statement(size: int, lineno: int) -> nodes.ExprStmt:
    return nodes.ExprStmt(_filter(nodes.Const(size), "_charge", lineno=lineno), lineno=lineno)


class _Rewriter(NodeTransformer):
    """Puts the budget's checks into the parsed template, where the template cannot skip them.

    Every chunk of output reaches the final join counted, which is what makes that join
    safe: values printed where they may print many times through `_printed`, joined buffers
    through `concat`, and literal text charged by each part that can run many times (a
    loop body per iteration, a block per run, an included or extended template where it is
    included or extended). The top level of the version's own template runs once per
    render: its values go uncounted (the final length check sees them), which keeps the
    common template as fast as the file Catalog's."""

    def __init__(self, repeats: bool) -> None:
        self.repeats = repeats  # may the nodes visited now run more than once per render?

    def _repeated(self, node: nodes.Node) -> None:
        repeats, self.repeats = self.repeats, True
        self.generic_visit(node)
        self.repeats = repeats

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        if self.repeats:
            node.nodes = [
                child
                if isinstance(child, nodes.TemplateData)
                else _filter(child, "_printed", lineno=child.lineno)
                for child in node.nodes
            ]
        return node

    def visit_Macro(self, node: nodes.Macro | nodes.CallBlock) -> nodes.Node:
        self._repeated(node)
        return node

    visit_CallBlock = visit_Macro

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self._repeated(node)
        node.iter = _filter(node.iter, "_budgeted", lineno=node.lineno)
        size = static_size(node.body)
        if size:
            node.body.insert(0, _charge_statement(size, node.lineno))
        return node

    def visit_Block(self, node: nodes.Block) -> nodes.Node:
        self._repeated(node)
        size = static_size(node.body)
        if size:
            node.body.insert(0, _charge_statement(size, node.lineno))
        return node

    def _charge_template(self, node: nodes.Include | nodes.Extends) -> list[nodes.Node]:
        self.generic_visit(node)
        names, _ = _names_in(nodes.Template([node]))
        if not names:
            return [node]
        argument = nodes.Const(tuple(sorted(names)), lineno=node.lineno)
        charge = _filter(argument, "_charge_templates", lineno=node.lineno)
        return [nodes.ExprStmt(charge, lineno=node.lineno), node]

    visit_Include = visit_Extends = _charge_template

    def visit_FilterBlock(self, node: nodes.FilterBlock) -> nodes.Node:
        self._repeated(node)
        node.filter = _filter(node.filter, "_charged", lineno=node.lineno)
        return node

    def _sized(self, node: nodes.Expr) -> nodes.Node:
        self.generic_visit(node)
        return _filter(node, "_sized", lineno=node.lineno)

    visit_Concat = visit_List = visit_Dict = _sized

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        if node.ctx != "load":  # a loop's or a set's targets
            return self.generic_visit(node)
        return self._sized(node)

    def visit_Assign(self, node: nodes.Assign) -> nodes.Node:
        self.generic_visit(node)
        target = node.target
        if isinstance(target, nodes.NSRef):
            namespace = nodes.Name(target.name, "load", lineno=node.lineno)
            attribute = nodes.Const(target.attr, lineno=node.lineno)
            node.node = _filter(node.node, "_ns_sized", namespace, attribute, lineno=node.lineno)
        return node

    def visit_AssignBlock(self, node: nodes.AssignBlock) -> nodes.Node:
        self._repeated(node)
        target = node.target
        if isinstance(target, nodes.NSRef):
            namespace = nodes.Name(target.name, "load", lineno=node.lineno)
            attribute = nodes.Const(target.attr, lineno=node.lineno)
            # A filter without a node filters the block's captured output.
            node.filter = _filter(
                node.filter, "_ns_sized", namespace, attribute, lineno=node.lineno
            )
        return node


_MUTATORS = frozenset(
    {"add", "append", "clear", "discard", "extend", "insert", "pop", "popitem", "remove"}
    | {"reverse", "setdefault", "sort", "update", "difference_update", "intersection_update"}
    | {"symmetric_difference_update", "appendleft", "extendleft", "popleft", "rotate"}
)


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox for one part kind of one compiled version."""

    intercepted_binops = frozenset({"*", "**", "+", "-", "%"})
    concat = staticmethod(_joined)

    def __init__(self, kind: str, sources: Mapping[str, str], mjml: frozenset[str | None]) -> None:
        super().__init__(
            loader=jinja2.DictLoader(dict(sources)),
            autoescape=kind == "html",
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            auto_reload=False,
            optimized=False,  # constant folding would run template code at compile time
            cache_size=-1,  # every library template stays compiled; a dict: no lock to render
        )
        self.kind = kind
        self.mjml = mjml  # the templates whose lines are the compiled MJML's, not the source's
        self.globals.pop("lipsum", None)
        self.filters = dict(_FILTERS)
        self.template_class = _Template
        self.literal_sizes: dict[str | None, int] = {}  # of each template's top level

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        self.literal_sizes[name] = static_size(tree.body)
        # A library template may be included many times; the version's own runs once.
        rewritten: nodes.Template = _Rewriter(repeats=name is not None).visit(tree)
        return rewritten

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        # `dict.update(d, ...)` changes a dict through its class: refused like `d.update`.
        if isinstance(obj, type) and attr in _MUTATORS:
            return False
        return super().is_safe_attribute(obj, attr, value)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        # At once: an undefined that fails only when printed could still be tested or passed.
        raise SecurityError(f"the attribute {attribute!r} of a {type(obj).__name__} value")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) or (
            value.__name__ not in ("format", "format_map")
        ):
            return None
        owner = value.__self__
        if not isinstance(owner, str):
            return None
        owner_type = type(owner)
        is_format_map = value.__name__ == "format_map"
        environment = self

        def budgeted_format(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                kwargs = args[0]
                args = ()
            formatter: _SizedFields
            if isinstance(owner, Markup):
                formatter = _BudgetedEscapeFormatter(environment, escape=owner.escape)
            else:
                formatter = _BudgetedFormatter(environment)
            return owner_type(formatter.vformat(owner, args, kwargs))

        return functools.update_wrapper(budgeted_format, value)

    def call(
        __self,
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        state = _current.get()
        state.tick()
        if not __self.is_safe_callable(__obj):
            raise SecurityError(f"calling {_callable_name(__obj)}")
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str | bytes):
            args = _check_text_method(owner, __obj.__name__, args, kwargs, state)
        elif isinstance(__obj, LoopContext) and args:
            args = (_budgeted(args[0]), *args[1:])  # loop(children) in a recursive loop
        return state.checked(__context.call(__obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        state = _current.get()
        state.tick()
        if operator == "*":
            _check_multiply(left, right, state)
        elif operator == "**":
            _check_power(left, right, state)
        elif operator == "%" and isinstance(left, str | bytes):
            _check_percent(left, right, state)
        elif operator == "+" and isinstance(left, list | tuple) and isinstance(right, list | tuple):
            if len(left) + len(right) > MAX_ITEMS:
                state.fail(f"a list built in the template has more than {MAX_ITEMS} items")
            weight = state.weigh(left) + state.weigh(right)
            if weight > state.max_output:
                state.too_long()
            joined = self.binop_table[operator](left, right)
            state.remember(joined, weight)  # so the next `+` does not walk it again
            return joined
        return state.checked(self.binop_table[operator](left, right))


class _Module(TemplateModule):
    """An imported template, with the length of what it printed (its `str`)."""

    def __init__(self, template: jinja2.Template, context: Context, body: list[str]) -> None:
        super().__init__(template, context, body)
        # Jinja exports no name that starts with "_", so the template cannot overwrite this.
        self.mailbag_size = sum(map(len, body))


class _Template(jinja2.Template):
    def make_module(
        self,
        vars: dict[str, Any] | None = None,
        shared: bool = False,
        locals: Mapping[str, Any] | None = None,
    ) -> TemplateModule:
        context = self.new_context(vars, shared, locals)
        body = list(self.root_render_func(context))
        state = _current.get()
        size = sum(map(len, body))
        if size > state.max_output:
            state.too_long("an imported template's output")
        state.charge(size)  # `include ... without context` yields it once per include
        return _Module(self, context, body)

    def _get_default_module(self, ctx: Context | None = None) -> TemplateModule:
        # Jinja keeps this module on the template, for every later render and thread: a
        # namespace set at its top level would carry one email's data into the next.
        if ctx is not None:
            keys = ctx.globals_keys - self.globals.keys()
            if keys:
                return self.make_module({key: ctx.parent[key] for key in keys})
        return self.make_module()


# --- compiling and rendering -----------------------------------------------------------


class _Part:
    """One compiled part, rendered as the file Catalog's `_Part` does (globals merged once)."""

    def __init__(self, template: jinja2.Template) -> None:
        self.template = template
        self.environment = template.environment
        self.globals = dict(template.globals)
        self.kind: str = template.environment.kind  # type: ignore[attr-defined]

    def render(self, data: Mapping[str, Any], state: _Render) -> str:
        template = self.template
        context = new_context(
            self.environment,
            template.name,
            template.blocks,
            {**self.globals, **data},
            shared=True,  # the dict above is this render's own
            globals=self.globals,
        )
        try:
            # Safe to join at once: every chunk was counted on its way (see _Rewriter).
            output = "".join(template.root_render_func(context))
        except _OverBudget as exc:
            raise RenderBudgetExceeded(self._problem(exc, str(exc))) from None
        except SecurityError as exc:
            message = f"not allowed in a template: {_clean(exc.message or str(exc))}"
            raise TemplateProblems([self._problem(exc, message)]) from None
        except jinja2.TemplateError as exc:
            raise TemplateProblems([self._problem(exc, _clean(exc.message or str(exc)))]) from None
        except RecursionError as exc:
            message = "nested too deeply (a macro, include or loop that calls itself?)"
            raise TemplateProblems([self._problem(exc, message)]) from None
        except MemoryError as exc:
            raise RenderBudgetExceeded(self._problem(exc, "out of memory")) from None
        except TemplateError:
            raise
        except Exception as exc:
            message = _clean(f"{type(exc).__name__}: {exc}")
            raise TemplateProblems([self._problem(exc, message)]) from None
        if len(output) > state.max_output:
            message = f"the output is longer than {state.max_output} characters"
            raise RenderBudgetExceeded(Problem(self.kind, None, message))
        return output

    def _problem(self, exc: BaseException, message: str) -> Problem:
        part, line = self.kind, None
        # The innermost frame of a compiled template names it and, mapped back, its line.
        traceback = exc.__traceback__
        while traceback is not None:
            template = traceback.tb_frame.f_globals.get("__jinja_template__")
            if isinstance(template, jinja2.Template) and template.environment is self.environment:
                part = self.kind if template.name is None else f"{template.name}/{self.kind}"
                mjml: frozenset[str | None] = self.environment.mjml  # type: ignore[attr-defined]
                line = (
                    None
                    if template.name in mjml
                    else template.get_corresponding_lineno(traceback.tb_lineno)
                )
            traceback = traceback.tb_next
        return Problem(part, line, message)


_PYTHON_NAMES = re.compile(
    r"<(?:class|function|module|built-in \w+) '?([\w.]+?)'?(?: at 0x[0-9a-f]+)?>"
)
_OBJECTS = re.compile(r"<([\w.]+) object at 0x[0-9a-f]+>")
# 'module.Class' -> 'Class', and Jinja's 'module.Class object' -> 'Class object'
_DOTTED = re.compile(r"'(?:[A-Za-z_]\w*\.)+(\w+( object)?)'")


def _clean(message: str) -> str:
    """An error's message without Python's own names of classes, functions and modules."""
    message = _PYTHON_NAMES.sub(lambda match: match.group(1).rpartition(".")[2], message)
    message = _OBJECTS.sub(lambda match: f"a {match.group(1).rpartition('.')[2]} value", message)
    return _DOTTED.sub(r"'\1'", message)


class Compiled:
    """One compiled template version: immutable, and rendered from any thread or task."""

    def __init__(self, budget: Budget, subject: _Part, html: _Part, text: _Part | None) -> None:
        self._seconds = budget.seconds
        self._max_output = budget.max_output
        self._allowance = budget.max_output * ALLOWANCE_FACTOR
        self._subject = subject
        self._html = html
        self._text = text  # None: the text of the rendered HTML

    def render(self, data: Mapping[str, Any]) -> Rendered:
        state = _current.get()
        thread = get_ident()
        token = None
        if state.active:  # a render inside a render (a data object that renders): its own
            state = _Render(thread)
            token = _current.set(state)
        elif state.thread != thread:  # this thread's first render (in this context)
            state = _Render(thread)
            _current.set(state)  # kept, for the thread's next renders
        state.begin(self._seconds, self._max_output, self._allowance)
        try:
            subject = self._subject.render(data, state).strip()
            html = self._html.render(data, state)
            text = text_from_html(html) if self._text is None else self._text.render(data, state)
        finally:
            state.end()
            if token is not None:
                _current.reset(token)
        problem = unsafe_text(subject)  # the rule enqueue applies to a given subject
        if problem is not None:
            raise TemplateProblems([Problem("subject", None, f"the rendered subject {problem}")])
        if not subject:
            raise TemplateProblems([Problem("subject", None, "the rendered subject is empty")])
        return Rendered(subject, html, text)

    def check(self, sample_data: Mapping[str, Any]) -> Rendered:
        """Publish-time validation: a render of sample data, with the same rules."""
        return self.render(sample_data)


class Sandbox:
    def __init__(self, budget: Budget = Budget()) -> None:
        if budget.seconds <= 0 or budget.max_output <= 0:
            raise ValueError("a budget needs some time and some output")
        self.budget = budget

    def compile(self, parts: Parts, library: Mapping[str, Parts] = {}) -> Compiled:
        """`library`: the tenant's other templates that `parts` may extend, include or import
        by name (resolved by the caller). Every part is compiled here, and every library
        template it reaches; MJML too. Problems are raised together, with their lines."""
        problems: list[Problem] = []
        versions: dict[str | None, Parts] = {None: parts}
        versions.update(library)
        for name, version in versions.items():
            if version.format not in ("jinja", "mjml"):
                label = "format" if name is None else f"{name}/format"
                problems.append(Problem(label, None, f"unknown format {version.format!r}"))
        if problems:
            raise TemplateProblems(problems)
        compiled: list[_Part | None] = []
        for kind in KINDS:
            try:
                compiled.append(self._compile_kind(kind, versions))
            except TemplateProblems as exc:
                problems += exc.problems
        if problems:
            raise TemplateProblems(problems)
        subject, html, text = compiled
        assert subject is not None and html is not None  # only the text part may be derived
        return Compiled(self.budget, subject, html, text)

    def _compile_kind(self, kind: str, versions: Mapping[str | None, Parts]) -> _Part | None:
        main = versions[None]
        if kind == "text" and main.text == "":
            return None  # made from the rendered HTML
        if kind == "subject" and not main.subject.strip():
            raise TemplateProblems([Problem("subject", None, "the subject is empty")])
        problems: list[Problem] = []
        sources: dict[str | None, str] = {}
        mjml: set[str | None] = set()
        # Every template the part reaches, through the library, compiled from MJML if it is.
        pending: list[str | None] = [None]
        while pending:
            name = pending.pop()
            label = kind if name is None else f"{name}/{kind}"
            version = versions[name]
            source = getattr(version, kind)
            if len(source) > self.budget.max_output:
                problems.append(Problem(label, None, "the source is longer than the output may be"))
                continue
            try:
                tree = _PARSER.parse(source)
            except jinja2.TemplateSyntaxError as exc:
                problems.append(Problem(label, exc.lineno, exc.message or "syntax error"))
                continue
            except RecursionError:
                problems.append(Problem(label, None, "nested too deeply"))
                continue
            names, unnamed = _names_in(tree)
            problems += [Problem(label, line, _NOT_LITERAL) for line in unnamed]
            for other in sorted(names):
                if other not in versions or other is None:
                    problems.append(Problem(label, None, f"no template named {other!r}"))
                elif other not in sources and other not in pending:
                    pending.append(other)
            if kind == "html" and version.format == "mjml":
                from mailbag.templates import mjml as mjml_compiler

                try:
                    source = mjml_compiler.to_html(source, part=label)
                except TemplateProblems as exc:
                    problems += exc.problems
                    continue
                if len(source) > self.budget.max_output:
                    message = "the compiled MJML is longer than the output may be"
                    problems.append(Problem(label, None, message))
                    continue
                mjml.add(name)
            sources[name] = source
        if problems:
            raise TemplateProblems(problems)
        library_sources = {name: source for name, source in sources.items() if name is not None}
        environment = _Environment(kind, library_sources, frozenset(mjml))
        try:
            for name in library_sources:
                environment.get_template(name)  # compiled now: its problems are the publisher's
            code = environment.compile(sources[None])
            template = environment.template_class.from_code(
                environment, code, environment.make_globals(None)
            )
        except jinja2.TemplateSyntaxError as exc:
            name = exc.name
            label = kind if name is None else f"{name}/{kind}"
            line = None if name in mjml else exc.lineno
            raise TemplateProblems(
                [Problem(label, line, _clean(exc.message or str(exc)))]
            ) from None
        except (RecursionError, MemoryError, SyntaxError):
            # Python's compiler has limits of its own (about 20 nested blocks).
            raise TemplateProblems([Problem(kind, None, "nested too deeply")]) from None
        return _Part(template)
