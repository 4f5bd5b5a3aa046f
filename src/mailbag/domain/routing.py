"""Which providers a message may go through, in which order, and when the next one may be
tried. Pure: no I/O.

A deployment names its providers (`[providers.NAME]` in mailbag.toml; with only PROVIDER
set there is one, named after its kind) and lists routes (`[[routes]]`): the first route
whose `match` fits a message gives its providers, in order; a route without `match` fits
every message. Without routes, every message goes through the one provider.

Failover never sends twice. The next provider of a route is tried only when the one
before surely did not accept the message (`sure_refusal`): it could not be reached, it
answered an error before taking anything, it is disabled, or it throttled. After an
ambiguous outcome the message stays `unknown` (domain.delivery), whatever the route says:
another provider could deliver it a second time. A refusal about the message itself (an
invalid recipient, content the provider refuses) ends it, as with one provider.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mailbag.domain.delivery import Deferred, Disabled, SendOutcome, Throttled

# The provider entry of a route that stands for the message's tenant's own account (set
# by an operator: `mailbag tenants account`); a tenant without one skips it.
TENANT_ACCOUNT = "tenant"


class InvalidRouting(ValueError):
    """Routes that cannot work; the message names the table and the key."""


@dataclass(frozen=True)
class Match:
    """What a route applies to; None (or empty): anything."""

    tenant: str | None = None
    tags: frozenset[str] = frozenset()  # the message has every one of these tags
    recipient_domain: str | None = None  # every recipient is at this domain (lower case)

    def fits(self, tenant_id: str, tags: Iterable[str], recipient_domains: set[str]) -> bool:
        if self.tenant is not None and tenant_id != self.tenant:
            return False
        if self.tags and not self.tags <= set(tags):
            return False
        return self.recipient_domain is None or recipient_domains == {self.recipient_domain}


@dataclass(frozen=True)
class Route:
    providers: tuple[str, ...]  # provider names, tried in this order
    match: Match = field(default_factory=Match)


@dataclass(frozen=True)
class Routing:
    """The routes of a deployment, first match wins; `default` for a message none fits."""

    routes: tuple[Route, ...]
    default: Route

    @classmethod
    def single(cls, provider: str) -> Routing:
        """One provider for everything: a deployment with only PROVIDER set."""
        route = Route((provider,))
        return cls((), route)

    @classmethod
    def of(cls, routes: Sequence[Route], providers: Iterable[str]) -> Routing:
        """Routes checked against the providers configured: InvalidRouting if a route names
        a provider that does not exist, has none, or none is left to serve messages that
        no route matches."""
        configured = sorted(set(providers))
        known = {*configured, TENANT_ACCOUNT}
        default: Route | None = None
        for number, route in enumerate(routes, start=1):
            where = f"routes[{number}]"
            if not route.providers:
                raise InvalidRouting(f"{where}.providers: names no provider")
            missing = [name for name in route.providers if name not in known]
            if missing:
                raise InvalidRouting(
                    f"{where}.providers: no [providers.{missing[0]}] table"
                    f" (configured: {', '.join(configured) or 'none'})"
                )
            if default is not None:  # first match wins: the default fits every message
                raise InvalidRouting(f"{where}: comes after the route without `match`, never used")
            if route.match == Match():
                default = route
        if default is not None:
            return cls(tuple(routes[:-1]), default)
        if len(configured) == 1:
            return cls(tuple(routes), Route(tuple(configured)))
        raise InvalidRouting(
            "routes: no route without `match`, so messages no route fits have no provider;"
            " add a last [[routes]] with only `providers`"
        )

    def route_for(self, tenant_id: str, tags: Iterable[str], recipients: Iterable[str]) -> Route:
        domains = {address.rpartition("@")[2].lower() for address in recipients}
        tags = tuple(tags)
        return next(
            (r for r in self.routes if r.match.fits(tenant_id, tags, domains)), self.default
        )

    @property
    def providers(self) -> frozenset[str]:
        return frozenset(name for r in (*self.routes, self.default) for name in r.providers)


def sure_refusal(outcome: SendOutcome) -> bool:
    """Whether the provider surely did not take the message, for a reason of its own (so
    another provider may be tried, and the message's attempts are not spent): it could not
    be reached or answered an error before taking anything (Deferred about the provider),
    is disabled, or throttled."""
    if isinstance(outcome, Deferred):
        return outcome.provider_fault
    return isinstance(outcome, Disabled | Throttled)


def next_provider(route: Route, tried: Iterable[str], available: Mapping[str, bool]) -> str | None:
    """The first provider of the route not tried yet for this message and available now
    (its breaker closed, not paused); None: none is."""
    done = set(tried)
    return next(
        (name for name in route.providers if name not in done and available.get(name, False)),
        None,
    )


# How a message that no provider of its route can take now says why it waits (its history,
# its last_error): the console reads back which providers were paused.
WAITING = "no provider of its route is available: "
PAUSED = " paused"


def waiting_reason(states: Mapping[str, str]) -> str:
    """Why a message waits, from each of its providers' states (`paused`, `failing (...)`,
    `probing`)."""
    return WAITING + "; ".join(f"{name} {state}" for name, state in states.items())


def paused_in(reason: str | None) -> frozenset[str]:
    """The providers a `waiting_reason` says were paused."""
    if not reason or not reason.startswith(WAITING):
        return frozenset()
    parts = reason.removeprefix(WAITING).split("; ")
    return frozenset(p.removesuffix(PAUSED) for p in parts if p.endswith(PAUSED))
