"""`mailbag domains`: sender domains with DKIM keys, the DNS records to publish for them,
and whether the published ones make them ready (the service the admin API and the
console use).

    mailbag domains add acme example.com          # a key; prints the records to publish
    mailbag domains check acme example.com        # exit 0 only when ready
    mailbag domains rotate acme example.com       # a next key, published beside the old
    mailbag domains rotate acme example.com --finish   # it signs; the old one is retired

Exits: 2 for bad input (a domain, a selector, an algorithm, a key file, a tenant), having
written nothing; 1 for what cannot be done (no secret key; a domain that exists, or does
not; a rotation step out of turn) and for a `check` that finds the domain not ready.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from mailbag.cli.help import Command, group
from mailbag.cli.invocation import fail, on_async_engine, prepare, settings

if TYPE_CHECKING:
    from mailbag.services.sender_domains import DomainView, SenderDomains

T = TypeVar("T")
ACTOR = "operator:cli"

domains = group("Sender domains: DKIM keys, the DNS records to publish, and readiness.")

TENANT = Annotated[str, typer.Argument(metavar="TENANT", help="Tenant id or name.")]
DOMAIN = Annotated[str, typer.Argument(metavar="DOMAIN", help="The domain mail is sent from.")]
AS_JSON = Annotated[bool, typer.Option("--json", help="Print JSON, for automation.")]
SELECTOR = Annotated[
    str | None,
    typer.Option(metavar="S", help="The key's selector (one DNS label); default mbYYYYMMDD."),
]
ALGORITHM = Annotated[
    str | None, typer.Option(metavar="rsa|ed25519", help="A new key's kind (default rsa).")
]
KEY_FILE = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="Use this PEM private key instead of making one."),
]


def _service(action: Callable[[SenderDomains], Awaitable[T]]) -> T:
    """Run one call of the domains service; its errors become messages and exits."""
    from mailbag.services import sender_domains as service

    config = settings()
    try:
        return on_async_engine(lambda engine: action(service.SenderDomains(engine, config)))
    except service.InvalidDomain as exc:
        fail(str(exc))
    except (
        service.NoDomainKey,
        service.DomainExists,
        service.UnknownDomain,
        service.RotationRefused,
    ) as exc:
        fail(str(exc), code=1)


def _key_file(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        fail(f"--key-file {path}: {exc.strerror or exc}")


def _print_records(shown: DomainView, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in shown.records], indent=2))
        return
    for record in shown.records:
        typer.echo(f"{record.type}\t{record.name}\t{record.value}")


def _print_findings(shown: DomainView) -> None:
    for finding in shown.findings:
        line = f"{finding['state']}\t{finding['purpose']}\t{finding['name']}"
        typer.echo(f"{line}\t{finding['fix']}" if finding["fix"] else line)


@domains.command("add", cls=Command)
def add(
    tenant: TENANT,
    domain: DOMAIN,
    selector: SELECTOR = None,
    algorithm: ALGORITHM = None,
    key_file: KEY_FILE = None,
    as_json: AS_JSON = False,
) -> None:
    """Add a sender domain with a new DKIM key (or --key-file's), and print the DNS records
    to publish: the key's TXT record, and the SPF and DMARC the providers need. Mail from
    the domain is signed from now; `check` says when DNS has the records."""
    from mailbag.clock import utcnow

    pem = _key_file(key_file)
    prepare(key=True)  # sealed with the key every worker opens it with
    shown = _service(
        lambda svc: svc.add(
            tenant,
            domain,
            now=utcnow(),
            actor=ACTOR,
            selector=selector,
            algorithm=algorithm or "rsa",
            key_file=pem,
        )
    )
    if not as_json:
        typer.echo(f"added {shown.domain} to {shown.tenant_id}; publish these records:")
    _print_records(shown, as_json)


@domains.command("records", cls=Command)
def records(tenant: TENANT, domain: DOMAIN, as_json: AS_JSON = False) -> None:
    """The DNS records a domain needs (every live key's, SPF, DMARC)."""
    shown = _service(lambda svc: svc.show(tenant, domain))
    _print_records(shown, as_json)


@domains.command("check", cls=Command)
def check(tenant: TENANT, domain: DOMAIN, as_json: AS_JSON = False) -> None:
    """Ask DNS for each record (DNS_NAMESERVERS, else the system's resolvers) and say of
    each whether it is ok, missing or wrong, with the fix. Exits 0 only when the domain is
    ready: the signing key's record, SPF and DMARC all ok."""
    from mailbag.clock import utcnow

    shown = _service(lambda svc: svc.check(tenant, domain, now=utcnow()))
    if as_json:
        typer.echo(json.dumps(shown.as_dict(), indent=2))
    else:
        _print_findings(shown)
        typer.echo(f"{shown.domain}: {shown.state}")
    if not shown.ready:
        raise typer.Exit(1)


@domains.command("list", cls=Command)
def list_(
    tenant: Annotated[
        str | None, typer.Argument(metavar="[TENANT]", help="Only this tenant's.")
    ] = None,
    as_json: AS_JSON = False,
) -> None:
    """Every sender domain: tenant, domain, readiness at its last check, the signing key."""
    found = _service(lambda svc: svc.listing(tenant))
    if as_json:
        typer.echo(json.dumps([d.as_dict() for d in found], indent=2))
        return
    for shown in found:
        signing = next((k.selector for k in shown.keys if k.state == "signing"), "-")
        checked = f"{shown.checked_at:%Y-%m-%dT%H:%M:%SZ}" if shown.checked_at else "never"
        typer.echo(f"{shown.tenant_id}\t{shown.domain}\t{shown.state}\t{signing}\t{checked}")


@domains.command("remove", cls=Command)
def remove(tenant: TENANT, domain: DOMAIN, selector: SELECTOR = None) -> None:
    """Remove a domain and its keys (its mail goes unsigned), or with --selector one key
    that no longer signs (a rotation's retired key, once the mail it signed is delivered)."""
    tenant_id = _service(lambda svc: svc.remove(tenant, domain, selector=selector))
    what = f"the key {selector} of {domain}" if selector else domain
    typer.echo(f"removed {what} from {tenant_id}")


@domains.command("rotate", cls=Command)
def rotate(
    tenant: TENANT,
    domain: DOMAIN,
    selector: SELECTOR = None,
    algorithm: ALGORITHM = None,
    key_file: KEY_FILE = None,
    finish: Annotated[
        bool,
        typer.Option(
            "--finish", help="The next key signs from now (once DNS has it); the old retires."
        ),
    ] = False,
    as_json: AS_JSON = False,
) -> None:
    """Rotate a domain's DKIM key in two steps, both keys published meanwhile: first a next
    key (print its record; the old key goes on signing), then, with --finish once `check`
    finds the next key's record, the next key signs and the old one is retired."""
    from mailbag.clock import utcnow

    if finish:
        if selector or algorithm or key_file:
            fail("--finish takes no --selector, --algorithm or --key-file")
        shown = _service(lambda svc: svc.finish_rotation(tenant, domain, now=utcnow()))
        signing = next(k.selector for k in shown.keys if k.state == "signing")
        typer.echo(f"{shown.domain} is signed with {signing} from now")
        return
    pem = _key_file(key_file)
    prepare(key=True)
    shown = _service(
        lambda svc: svc.rotate(
            tenant, domain, now=utcnow(), selector=selector, algorithm=algorithm, key_file=pem
        )
    )
    if not as_json:
        nxt = next(k.selector for k in shown.keys if k.state == "next")
        typer.echo(f"{shown.domain}: publish the next key {nxt} beside the signing one:")
    _print_records(shown, as_json)
