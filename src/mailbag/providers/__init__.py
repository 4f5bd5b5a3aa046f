"""Providers: one module each behind one interface (see base.py), found by name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from mailbag.providers.base import Provider, SendOneByOne

if TYPE_CHECKING:
    from mailbag.settings import Settings

ProviderFactory = Callable[["Settings"], Provider]

BUILTIN = {
    "console": "mailbag.providers.console",
    "file": "mailbag.providers.file",
    "smtp": "mailbag.providers.smtp",
    "ses": "mailbag.providers.ses",
    "brevo": "mailbag.providers.brevo",
    # In-memory, for tests (mailbag.testing); "memory" is the test suite's own plug-in.
    "capture": "mailbag.providers.memory",
}
ENTRY_POINT_GROUP = "mailbag.providers"
_registry: dict[str, ProviderFactory] = {}


class UnknownProvider(LookupError):
    pass


def register(name: str) -> Callable[[ProviderFactory], ProviderFactory]:
    def decorate(factory: ProviderFactory) -> ProviderFactory:
        _registry[name] = factory
        return factory

    return decorate


def available() -> list[str]:
    plugins = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(set(BUILTIN) | set(_registry) | plugins)


def factory_for(name: str) -> ProviderFactory:
    if name in _registry:
        return _registry[name]
    if name in BUILTIN:
        importlib.import_module(BUILTIN[name])  # its module registers itself
        return _registry[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        factory: ProviderFactory = ep.load()
        _registry[name] = factory
        return factory
    raise UnknownProvider(f"unknown provider {name!r}; available: {', '.join(available())}")


def create(name: str, settings: Settings) -> Provider:
    return factory_for(name)(settings)


__all__ = ["Provider", "SendOneByOne", "UnknownProvider", "available", "create", "register"]
