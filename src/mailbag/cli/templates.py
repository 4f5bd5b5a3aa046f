"""`mailbag templates`: a tenant's own templates (the service the admin API and the console
use): publish versions from folders, roll back, read, compare, and check them in CI.

    mailbag templates push templates/                  # every template of a tree
    mailbag templates publish welcome fr-CA templates/welcome/fr-CA
    mailbag templates list
    mailbag templates show welcome en --version 2
    mailbag templates diff welcome en 1                 # version 1 -> the current one
    mailbag templates rollback welcome en 1
    mailbag templates check templates/                  # CI: no database needed

A template's folder is laid out like a file template's: `subject.txt`, `body.html` (or
`body.mjml`: format mjml), `body.txt` (optional; empty: made from the HTML), `sample.json`
(optional: a JSON object, the data it must render with to be published). In a tree,
`TREE/NAME/` holds those files (its locale: --locale) or one folder per locale
(`TREE/welcome/fr-CA/subject.txt`).

Exits: 2 for bad input (a name, a locale, a folder, its JSON, a size, an unknown version or
tenant, a template that does not compile or render with its sample data), having written
nothing; `check` exits 1 when a template fails to render, 0 when all do.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from mailbag.cli.help import Command, group
from mailbag.cli.invocation import fail, on_async_engine
from mailbag.domain.templates import BODY_SOURCE_MAX

if TYPE_CHECKING:
    from mailbag.domain.templates import Version
    from mailbag.services.templates import Published, Templates
    from mailbag.templates.sandbox import Parts, Problem

T = TypeVar("T")

templates = group(
    "Tenants' templates: publish versions from folders, roll back, compare, check in CI."
)

NAME = Annotated[str, typer.Argument(metavar="NAME", help="The template's name.")]
LOCALE = Annotated[
    str, typer.Argument(metavar="LOCALE", help="A BCP 47 locale (en, fr-CA, zh-Hant-TW).")
]
TENANT = Annotated[str, typer.Option(metavar="TENANT", help="Tenant id or name.")]
AS_JSON = Annotated[bool, typer.Option("--json", help="Print JSON, for automation.")]

SUBJECT, HTML, MJML, TEXT, SAMPLE = (
    "subject.txt",
    "body.html",
    "body.mjml",
    "body.txt",
    "sample.json",
)
FILES = (SUBJECT, HTML, MJML, TEXT, SAMPLE)
# Read no more of a file than its part may hold (characters are up to 4 bytes in UTF-8).
MAX_FILE_BYTES = 4 * BODY_SOURCE_MAX + 4
MAX_VERSION = 2**31 - 1  # a version number the databases hold (an INTEGER)


def _service(action: Callable[[Templates], Awaitable[T]], what: str = "refused") -> T:
    """Run one call of the templates service; its errors become messages and exit 2."""
    from mailbag.services import templates as service

    return on_async_engine(
        lambda engine: _refusals(lambda: action(service.Templates(engine)), what)
    )


async def _refusals(call: Callable[[], Awaitable[T]], what: str) -> T:
    """`call`, its refusals said on stderr (exit 2); `what`: a template's, how it starts."""
    from mailbag.domain.templates import InvalidTemplate
    from mailbag.services.templates import UnknownTemplate
    from mailbag.templates import TemplateError

    try:
        return await call()
    except InvalidTemplate as exc:
        fail(str(exc))
    except UnknownTemplate as exc:
        fail(str(exc))
    except TemplateError as exc:
        _refuse_problems(what, exc)


def _refuse_problems(what: str, exc: Exception, after: str = "") -> NoReturn:
    """A template that does not compile or render: each problem on its own line."""
    problems: Sequence[object] = getattr(exc, "problems", None) or [exc]
    lines = [f"{what}:", *(f"  {problem}" for problem in problems)]
    if after:
        lines.append(after)
    fail("\n".join(lines))


def _changed_by() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in the environment nor the password database
        return "cli"


def _at(when: Any) -> str:
    return f"{when:%Y-%m-%dT%H:%M:%SZ}"


# --- folders ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One template version as a folder holds it, checked by the rules (not compiled)."""

    name: str
    locale: str
    folder: Path
    fields: Mapping[str, Any]  # as the service takes them

    def parts(self) -> Parts:
        from mailbag.templates.sandbox import Parts

        f = self.fields
        return Parts(f["subject"], f["html"], f["text"], f["format"])

    @property
    def label(self) -> str:
        return f"{self.name}/{self.locale}"


def _read(path: Path) -> str:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        fail(f"{path}: {exc.strerror or exc}")
    if len(data) > MAX_FILE_BYTES:
        fail(f"{path}: larger than a template part may be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})")


def _fields(folder: Path) -> dict[str, Any]:
    """What a template's folder holds, as the service's fields (exit 2 if it cannot be)."""
    if not folder.is_dir():
        fail(f"{folder}: not a folder")
    if not (folder / SUBJECT).is_file():
        fail(f"{folder}: no {SUBJECT}")
    html_file, mjml_file = folder / HTML, folder / MJML
    if html_file.exists() and mjml_file.exists():
        fail(f"{folder}: holds both {HTML} and {MJML}; keep one")
    fields: dict[str, Any] = {
        "subject": _read(folder / SUBJECT).strip(),  # one line: the file ends with a newline
        "html": "",
        "text": "",
        "format": "jinja",
        "sample_data": {},
    }
    if mjml_file.exists():
        fields["html"], fields["format"] = _read(mjml_file), "mjml"
    elif html_file.exists():
        fields["html"] = _read(html_file)
    if (folder / TEXT).exists():
        fields["text"] = _read(folder / TEXT)
    if (folder / SAMPLE).exists():
        try:
            sample = json.loads(_read(folder / SAMPLE))
        except (ValueError, RecursionError) as exc:
            fail(f"{folder / SAMPLE}: not valid JSON: {exc}")
        if not isinstance(sample, dict):
            fail(f"{folder / SAMPLE}: must be a JSON object")
        fields["sample_data"] = sample
    return fields


def _source(name: str, locale: str, folder: Path, *, named_by_folder: bool = True) -> Source:
    """A folder's template; its `name` and `locale` come from the folder's path (a tree's)
    or from arguments (`named_by_folder` False: a bad one is said without the folder)."""
    from mailbag.domain import templates as rules

    try:
        name = rules.template_name(name)
        locale = rules.locale(locale)
    except rules.InvalidTemplate as exc:
        fail(f"{folder}: {exc}" if named_by_folder else str(exc))
    try:
        fields = _fields(folder)
        rules.draft_of(fields)  # every rule (sizes, a subject...) before anything is written
    except rules.InvalidTemplate as exc:
        fail(f"{folder}: {exc}")
    return Source(name, locale, folder, fields)


def _holds_files(folder: Path) -> bool:
    return any((folder / part).exists() for part in FILES)


def _subfolders(folder: Path) -> list[Path]:
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        fail(f"{folder}: {exc.strerror or exc}")
    return [entry for entry in entries if entry.is_dir() and not entry.name.startswith(".")]


def _tree(root: Path, default_locale: str) -> dict[str, list[Source]]:
    """Every template of a tree, by name: its locales, the one to publish first first
    (`default_locale` if it has it: the default locale of a new template)."""
    from mailbag.domain import templates as rules

    if not root.is_dir():
        fail(f"{root}: not a folder")
    try:
        default_locale = rules.locale(default_locale)
    except rules.InvalidTemplate as exc:
        fail(f"--locale: {exc}")
    found: dict[str, list[Source]] = {}
    for folder in _subfolders(root):
        if _holds_files(folder):
            extra = _subfolders(folder)
            if extra:
                fail(f"{folder}: holds template files and folders ({extra[0].name}); keep one")
            sources = [_source(folder.name, default_locale, folder)]
        else:
            sources = [_source(folder.name, sub.name, sub) for sub in _subfolders(folder)]
            if not sources:
                fail(f"{folder}: holds no {SUBJECT}, nor a folder per locale")
            seen: dict[str, Path] = {}
            for source in sources:
                if source.locale in seen:
                    twice = f"{seen[source.locale].name} and {source.folder.name}"
                    fail(f"{folder}: {twice} are both {source.locale}")
                seen[source.locale] = source.folder
            sources.sort(key=lambda s: (s.locale != default_locale, s.locale))
        found[sources[0].name] = sources
    if not found:
        fail(f"{root}: holds no template folder")
    return found


def _uses(sources: Sequence[Source]) -> set[str]:
    """The names a template's versions extend, include or import (TemplateProblems for a
    part that does not parse)."""
    from mailbag.templates.sandbox import referenced

    names: set[str] = set()
    for source in sources:
        names |= referenced(source.parts())
    return names


def _order(tree: Mapping[str, Sequence[Source]]) -> list[str]:
    """The tree's names, each after those of the tree it uses (exit 2 on a cycle)."""
    from mailbag.templates import TemplateError

    uses: dict[str, set[str]] = {}
    for name, sources in tree.items():
        try:
            uses[name] = _uses(sources) & set(tree)
        except TemplateError as exc:
            _refuse_problems(f"{name} does not parse", exc, "nothing was published")
    done: list[str] = []
    placed: set[str] = set()
    while len(done) < len(tree):
        ready = sorted(n for n in tree if n not in placed and uses[n] <= placed)
        if not ready:
            left = sorted(set(tree) - placed)
            circle = ", ".join(f"{n} uses {', '.join(sorted(uses[n] - placed))}" for n in left)
            fail(f"templates that use each other (a cycle): {circle}; nothing was published")
        done += ready
        placed.update(ready)
    return done


# --- commands --------------------------------------------------------------------------


@templates.command("list", cls=Command)
def list_(tenant: TENANT = "default", as_json: AS_JSON = False) -> None:
    """Every template of the tenant: per locale its current and latest version, and which
    locale is the default (the one a message falls back to)."""
    found = _service(lambda svc: svc.listing(tenant=tenant))
    if as_json:
        typer.echo(json.dumps([t.as_json() for t in found], indent=2))
        return
    for template in found:
        for held in template.locales:
            line = f"{template.name}\t{held.locale}\tcurrent {held.current}\tlatest {held.latest}"
            typer.echo(f"{line}\tdefault" if held.locale == template.default_locale else line)


@templates.command("show", cls=Command)
def show(
    name: NAME,
    locale: LOCALE,
    version: Annotated[
        int | None,
        typer.Option(metavar="N", min=1, max=MAX_VERSION, help="This version (default: current)."),
    ] = None,
    tenant: TENANT = "default",
    as_json: AS_JSON = False,
) -> None:
    """One version of a template in a locale (default: its current one): every part, the
    sample data, who published it and when, and the versions of the templates it uses."""

    async def shown(svc: Templates) -> tuple[Version, int, int, dict[str, str]]:
        got = await svc.version(tenant=tenant, name=name, locale=locale, version=version)
        template = await svc.template(tenant=tenant, name=got.name)
        held = next(h for h in template.locales if h.locale == got.locale)
        uses = {n: await _version_named(svc, tenant, n, i) for n, i in got.dependencies.items()}
        return got, held.current, held.latest, uses

    got, current, latest, uses = _service(shown)
    if as_json:
        typer.echo(json.dumps(_version_json(got, current, latest), indent=2, ensure_ascii=False))
        return
    state = "current" if got.version == current else f"current: {current}"
    typer.echo(f"{got.name} {got.locale} version {got.version} ({state}; latest: {latest})")
    typer.echo(f"format: {got.format}")
    typer.echo(f"changed by: {got.changed_by}")
    typer.echo(f"created at: {_at(got.created_at)}")
    typer.echo(f"uses: {', '.join(uses[n] for n in sorted(uses)) or '-'}")
    empty = {"text": "(empty: the text of the rendered HTML)", "html": "(empty)"}
    for title, body in (("subject", got.subject), ("html", got.html), ("text", got.text)):
        typer.echo(f"--- {title}")
        if not body:
            typer.echo(empty.get(title, ""))
        else:
            typer.echo(body, nl=not body.endswith("\n"))
    typer.echo("--- sample data")
    typer.echo(json.dumps(dict(got.sample_data), indent=2, ensure_ascii=False))


async def _version_named(svc: Templates, tenant: str, name: str, version_id: int) -> str:
    """A dependency's version (kept by id) as an operator names it: `layout en version 3`."""
    from mailbag.services.templates import UnknownTemplate

    try:
        for held in (await svc.template(tenant=tenant, name=name)).locales:
            for v in await svc.versions(tenant=tenant, name=name, locale=held.locale):
                if v.id == version_id:
                    return f"{name} {v.locale} version {v.version}"
    except UnknownTemplate:
        pass
    return f"{name} (version id {version_id})"


def _version_json(v: Version, current: int, latest: int) -> dict[str, Any]:
    return {**v.as_json(current), "current_version": current, "latest_version": latest}


def _said(published: Published) -> str:
    v = published.version
    if published.created:
        return f"{v.name} {v.locale} version {v.version}"
    return f"{v.name} {v.locale} unchanged (version {v.version} is current)"


@templates.command("publish", cls=Command)
def publish(
    name: NAME,
    locale: LOCALE,
    folder: Annotated[
        Path,
        typer.Argument(
            metavar="FOLDER",
            help="subject.txt, body.html or body.mjml, body.txt, sample.json.",
        ),
    ],
    tenant: TENANT = "default",
) -> None:
    """Publish a new version of a template in a locale from a folder, current at once;
    refused unless it renders with its sample data. The same parts as the current version
    publish nothing."""
    source = _source(name, locale, folder, named_by_folder=False)
    changed_by = _changed_by()
    published = _service(
        lambda svc: svc.publish(
            tenant=tenant,
            name=source.name,
            locale=source.locale,
            fields=source.fields,
            changed_by=changed_by,
        ),
        what=f"{source.label} refused, nothing was published",
    )
    typer.echo(_said(published))


@templates.command("push", cls=Command)
def push(
    folder: Annotated[
        Path, typer.Argument(metavar="FOLDER", help="A folder per template (or per locale).")
    ],
    tenant: TENANT = "default",
    locale: Annotated[
        str,
        typer.Option(
            metavar="LOCALE",
            help="The locale of template folders without locale folders, and the one "
            "published first (a new template's default) of those with.",
        ),
    ] = "en",
) -> None:
    """Publish every template of a tree, the ones others extend or include first; unchanged
    ones publish nothing. Stops at the first one refused (exit 2), saying which were
    published before it."""
    from mailbag.domain.templates import InvalidTemplate
    from mailbag.services.templates import Templates, UnknownTemplate
    from mailbag.templates import TemplateError

    tree = _tree(folder, locale)
    order = _order(tree)
    changed_by = _changed_by()

    async def publish_all(svc: Templates) -> None:
        written: list[str] = []
        for name in order:
            for source in tree[name]:
                try:
                    published = await svc.publish(
                        tenant=tenant,
                        name=source.name,
                        locale=source.locale,
                        fields=source.fields,
                        changed_by=changed_by,
                    )
                except (InvalidTemplate, UnknownTemplate, TemplateError) as exc:
                    before = (
                        f"published before it: {', '.join(written)}"
                        if written
                        else "nothing was published"
                    )
                    _refuse_problems(f"{source.label} ({source.folder}) refused", exc, before)
                typer.echo(_said(published))
                if published.created:
                    written.append(f"{source.label} version {published.version.version}")

    on_async_engine(lambda engine: publish_all(Templates(engine)))


@templates.command("rollback", cls=Command)
def rollback(
    name: NAME,
    locale: LOCALE,
    version: Annotated[
        int,
        typer.Argument(metavar="VERSION", min=1, max=MAX_VERSION, help="The one to make current."),
    ],
    tenant: TENANT = "default",
) -> None:
    """Make an older version current again (messages already enqueued keep theirs)."""
    got = _service(
        lambda svc: svc.rollback(tenant=tenant, name=name, locale=locale, version=version)
    )
    typer.echo(f"{got.name} {got.locale} version {got.version} is current")


@templates.command("diff", cls=Command)
def diff(
    name: NAME,
    locale: LOCALE,
    old: Annotated[
        int, typer.Argument(metavar="OLD", min=1, max=MAX_VERSION, help="A version number.")
    ],
    new: Annotated[
        int | None,
        typer.Argument(metavar="NEW", min=1, max=MAX_VERSION, help="Another (default: current)."),
    ] = None,
    tenant: TENANT = "default",
) -> None:
    """What changed in each part from version OLD to NEW (default: the current one), as a
    unified diff; nothing when they are the same."""
    shown = _service(
        lambda svc: svc.diff(tenant=tenant, name=name, locale=locale, old=old, new=new)
    )
    typer.echo(shown, nl=False)


@templates.command("check", cls=Command)
def check(
    folder: Annotated[
        Path | None,
        typer.Argument(
            metavar="FOLDER", help="A tree of templates, as `push` takes (no database needed)."
        ),
    ] = None,
    tenant: TENANT = "default",
    locale: Annotated[
        str, typer.Option(metavar="LOCALE", help="As `push` takes it, for a FOLDER.")
    ] = "en",
) -> None:
    """Render every template with its sample data, for an application's CI: a FOLDER's (as
    `push` would publish them), else the tenant's current versions. Prints each problem
    with its part and line; exits 1 if any template fails, 0 if all render."""
    if folder is not None:
        problems = _check_tree(_tree(folder, locale))
    else:
        found = _service(lambda svc: svc.check(tenant=tenant))
        problems = {label: list(p) for label, p in found.items()}
    failed = 0
    for label, said in problems.items():
        failed += bool(said)
        for problem in said:
            typer.echo(f"{label}: {problem}")
    if failed:
        typer.echo(f"{failed} of {len(problems)} templates failed")
        raise typer.Exit(1)
    typer.echo(f"{len(problems)} templates render")


def _check_tree(tree: Mapping[str, Sequence[Source]]) -> dict[str, list[Problem | str]]:
    """Each version of the tree compiled in the sandbox with the tree's other templates (in
    its locale, else as a message would fall back) and rendered with its sample data."""
    from mailbag.domain import templates as rules
    from mailbag.templates import TemplateError
    from mailbag.templates.sandbox import Sandbox

    sandbox = Sandbox()
    found: dict[str, list[Problem | str]] = {}
    for name, sources in tree.items():
        for source in sources:
            library = {}
            for other, theirs in tree.items():
                if other == name:
                    continue
                by_locale = {s.locale: s for s in theirs}
                tag = rules.chosen(by_locale, source.locale, theirs[0].locale)
                library[other] = by_locale[tag or theirs[0].locale].parts()
            try:
                sandbox.compile(source.parts(), library).check(source.fields["sample_data"])
                found[source.label] = []
            except TemplateError as exc:
                found[source.label] = list(getattr(exc, "problems", None) or [str(exc)])
    return found
