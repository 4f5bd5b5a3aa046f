"""What renders a message's template: the version of its tenant's template it was pinned to
at enqueue (domain/templates.py), else the deployment's file template of that name.

A version never changes, so it is compiled once (in the sandbox, templates/sandbox.py) and
kept, with the versions of the templates it extends or includes that it was published
with, for as long as the process renders it (the least recently used go past `size`).
Who holds a Book loads the versions it lacks (`missing`) and hands them over (`add`)
before rendering: the worker with its claim, enqueue before its render check.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from mailbag.domain.templates import Version
from mailbag.store import templates as store
from mailbag.store.plan import Plan
from mailbag.templates import Catalog, Rendered, TemplateError
from mailbag.templates.sandbox import Compiled, Parts, Sandbox


def parts_of(version: Version) -> Parts:
    """What the sandbox compiles of a version: an MJML version's html as compiled."""
    html = version.compiled_html if version.compiled_html is not None else version.html
    return Parts(version.subject, html, version.text)


class Book:
    def __init__(self, catalog: Catalog, sandbox: Sandbox | None = None, size: int = 2048) -> None:
        self.catalog = catalog
        self.sandbox = sandbox or Sandbox()
        self.size = size
        self._versions: OrderedDict[int, Version] = OrderedDict()
        self._compiled: dict[int, Compiled | TemplateError] = {}
        self._lock = threading.Lock()  # the API renders in threads, the worker in its loop

    def missing(self, ids: Iterable[int | None]) -> set[int]:
        """Of these version ids, the ones not held (with what they depend on, once added)."""
        held = self._versions
        wanted = {i for i in ids if i is not None and i not in held}
        for i in ids:
            if i is not None and (version := held.get(i)) is not None:
                wanted.update(d for d in version.dependencies.values() if d not in held)
        return wanted

    def load(self, ids: Iterable[int | None]) -> Plan[None]:
        """Read the versions with these ids it lacks, and those they extend or include."""
        tried: set[int] = set()
        missing = self.missing(ids)
        while missing:
            tried |= missing
            versions = yield from store.by_ids(missing)
            self.add(versions)
            missing = self.missing(versions) - tried

    def add(self, versions: Mapping[int, Version]) -> None:
        with self._lock:
            self._versions.update(versions)
            while len(self._versions) > self.size:
                evicted, _ = self._versions.popitem(last=False)
                self._compiled.pop(evicted, None)

    def render(
        self,
        name: str,
        data: Mapping[str, Any],
        subject: str | None = None,
        version_id: int | None = None,
    ) -> Rendered:
        """A message's content: `version_id` None renders the file template `name`."""
        if version_id is None:
            return self.catalog.render(name, data, subject)
        rendered = self.compiled(version_id).render(data)
        if subject is not None:  # a caller's subject is sent exactly as given
            return Rendered(subject, rendered.html, rendered.text)
        return rendered

    def compiled(self, version_id: int) -> Compiled:
        found = self._compiled.get(version_id)
        if found is None:
            version = self._versions.get(version_id)
            if version is None or self.missing([version_id]):
                raise TemplateError(
                    f"template version {version_id} or a part it uses is not loaded"
                )
            found = self._compile(version)
            with self._lock:
                self._compiled[version_id] = found
                if version_id in self._versions:
                    self._versions.move_to_end(version_id)
        if isinstance(found, TemplateError):
            raise found
        return found

    def _compile(self, version: Version) -> Compiled | TemplateError:
        library = {
            name: parts_of(self._versions[dependency])
            for name, dependency in version.dependencies.items()
        }
        try:
            return self.sandbox.compile(parts_of(version), library)
        except TemplateError as exc:
            return TemplateError(f"template {version.name!r} ({version.locale}): {exc}")


_books: dict[int, tuple[Catalog, Book]] = {}


def book_of(catalog: Catalog) -> Book:
    """The process's one Book over `catalog`: its compiled versions shared by every use."""
    held = _books.get(id(catalog))
    if held is None or held[0] is not catalog:
        held = _books[id(catalog)] = (catalog, Book(catalog))
    return held[1]
