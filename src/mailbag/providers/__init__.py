"""Providers: one module each behind one interface (see base.py), found by name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import lru_cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from mailbag.providers.base import Capabilities, Provider, SendOneByOne, built_by

if TYPE_CHECKING:
    from mailbag.settings import Settings

ProviderFactory = Callable[["Settings"], Provider]

BUILTIN = {
    "console": "mailbag.providers.console",
    "file": "mailbag.providers.file",
    "smtp": "mailbag.providers.smtp",
    "ses": "mailbag.providers.ses",
    "brevo": "mailbag.providers.brevo",
    "postmark": "mailbag.providers.postmark",
    "resend": "mailbag.providers.resend",
    "sendgrid": "mailbag.providers.sendgrid",
    "mailgun": "mailbag.providers.mailgun",
    # In-memory, for tests (mailbag.testing); "memory" is the test suite's own plug-in.
    "capture": "mailbag.providers.memory",
    "faults": "mailbag.providers.faults",  # fails as real providers do (mailbag.testing.faults)
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


def capabilities(name: str) -> Capabilities:
    """What the provider registered as `name` declares it can carry, read from the class
    behind its factory without building it (a provider needs credentials, connections).
    An unknown name, or a plug-in whose class declares none: the defaults of Capabilities
    (no UTF-8 local parts, no limits of its own)."""
    try:
        return _declared_by(factory_for(name))
    except UnknownProvider:
        return Capabilities()


@lru_cache(maxsize=64)
def _declared_by(factory: ProviderFactory) -> Capabilities:
    # The one place a provider's declaration is looked for: a plug-in written before
    # Capabilities existed has none, and gets the defaults.
    declared = getattr(built_by(factory), "capabilities", None)
    return declared if isinstance(declared, Capabilities) else Capabilities()


__all__ = [
    "Capabilities",
    "Provider",
    "SendOneByOne",
    "UnknownProvider",
    "available",
    "capabilities",
    "create",
    "register",
]
