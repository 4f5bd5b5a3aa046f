"""Settings: environment variables with the MAILBAG_ prefix, or a TOML file.

The TOML file is `mailbag.toml` in the working folder, or the path in MAILBAG_CONFIG; its
keys are the setting names in lower case (`database_url = "..."`). The environment wins.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mailbag import keys
from mailbag.database_url import UnsupportedDatabase, dialect_of
from mailbag.domain.content import BODY_MAX_BYTES, MIB
from mailbag.domain.erasure import ErasureKey
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.routing import TENANT_ACCOUNT, InvalidRouting, Match, Route, Routing
from mailbag.domain.verification import TOKEN_PURPOSE, Tokens

if TYPE_CHECKING:
    from pydantic import ValidationInfo

    from mailbag.domain.breaker import Breaker
    from mailbag.domain.bulk import UnsubscribeLinks
    from mailbag.domain.domain_shaping import Shaping
    from mailbag.domain.hooks.urls import Policy as HookUrlPolicy

MIN_ADMIN_PASSWORD_LENGTH = 12
UNSUBSCRIBE_PURPOSE = "unsubscribe-links"  # the subkey's purpose (keys.derive)
SECRET_SETTINGS = (
    "secret_key",
    "admin_password",
    "admin_token",
    "brevo_webhook_secret",
    "ses_webhook_secret",
    "metrics_token",
    "smtp_password",
    "brevo_api_key",
    "postmark_api_key",
    "postmark_webhook_secret",
    "resend_api_key",
    "resend_webhook_secret",
    "sendgrid_api_key",
    "mailgun_api_key",
    "mailgun_webhook_signing_key",
    "hooks_key",
)

TLSMode = Literal["auto", "starttls", "implicit", "none"]  # SMTP_TLS: see providers/smtp.py
ProviderName = str  # one of the registered providers: console, file, smtp, ses, brevo, ...
PROVIDER_TABLE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,49}")  # fits messages.provider


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class MatchTable(BaseModel):
    """A route's `match`: what it applies to (every key given must fit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tenant: str | None = None  # a tenant's id
    tags: list[str] = Field(default_factory=list)  # the message has every one
    recipient_domain: str | None = None  # every recipient is at this domain


class RouteTable(BaseModel):
    """One `[[routes]]`: its providers (names of `[providers.NAME]` tables, or `tenant`:
    the message's tenant's own account), tried in this order."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    providers: list[str] = Field(min_length=1)
    match: MatchTable | None = None

    def route(self) -> Route:
        if self.match is None:
            return Route(tuple(self.providers))
        domain = self.match.recipient_domain
        return Route(
            tuple(self.providers),
            Match(self.match.tenant, frozenset(self.match.tags), domain and domain.lower()),
        )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MAILBAG_", extra="ignore")

    database_url: str = "sqlite:///mailbag.db"
    # How long the API and the worker wait for the database (a connect, a statement, a
    # request's database work) before it counts as unavailable: 503 with Retry-After.
    database_timeout_seconds: float = Field(5.0, gt=0, le=3600)
    # Behind PgBouncer in transaction mode: LISTEN and the scheduler's lock need a session of
    # their own (a direct connection, LISTEN_URL), and migrations one that may take long
    # locks (MIGRATE_URL). Unset: DATABASE_URL.
    listen_url: str | None = None
    migrate_url: str | None = None

    provider: ProviderName = "file"
    # Several providers, each a name of your choosing: `[providers.NAME]` tables in
    # mailbag.toml, or MAILBAG_PROVIDERS as JSON ({"main": {"kind": "postmark", "api_key":
    # "..."}}). Each has a `kind` (a registered provider) and that kind's settings without
    # MAILBAG_<KIND>_ (`host` for SMTP_HOST). Set, they replace PROVIDER (docs/providers.md).
    providers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Which providers a message goes through, in order: `[[routes]]` (MAILBAG_ROUTES as a
    # JSON list), the first whose `match` fits; one without `match` is the default.
    routes: list[RouteTable] = Field(default_factory=list)
    # How long a message may wait in the queue for its providers (an outage, an open
    # breaker, a pause) before it is dead: Postfix's maximal_queue_lifetime. Waiting spends
    # none of its attempts. `5d`, `12h`, or seconds.
    queue_lifetime: timedelta = timedelta(days=5)
    file_dir: Path = Path("mail")
    from_email: str = "mailbag@localhost"
    from_name: str = "mailbag"
    # Accept recipients at .test, .example, .invalid and .localhost; unset: only with the
    # console and file providers, where nothing leaves the machine.
    allow_test_domains: bool | None = None
    message_id_domain: str | None = None  # right side of Message-ID; default FROM_EMAIL's domain
    templates_dir: Path | None = None

    smtp_host: str = "localhost"
    smtp_port: int = 25
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    # auto: STARTTLS when the server offers it; starttls: required; implicit: TLS from the
    # first byte (port 465); none: plain text.
    smtp_tls: TLSMode = "auto"
    smtp_timeout: float = 30.0
    smtp_tls_verify: bool = True
    smtp_ca_file: Path | None = None  # trust this CA (a private relay, or the tests' own)

    ses_region: str = "us-east-1"
    ses_endpoint_url: str | None = None
    ses_configuration_set: str | None = None

    brevo_api_key: SecretStr | None = None
    brevo_base_url: str = "https://api.brevo.com"
    brevo_timeout: float = 30.0

    # postmark (providers/postmark.py): the server token, and the message stream it sends on.
    postmark_api_key: SecretStr | None = None
    postmark_base_url: str = "https://api.postmarkapp.com"
    postmark_timeout: float = 30.0
    postmark_message_stream: str = "outbound"
    # The password of the webhook URL's userinfo (or X-Mailbag-Webhook-Secret): Postmark
    # does not sign its webhooks.
    postmark_webhook_secret: SecretStr | None = None

    # resend (providers/resend.py); RESEND_WEBHOOK_SECRET is the webhook's `whsec_...`
    # signing secret (Svix, the Standard Webhooks scheme).
    resend_api_key: SecretStr | None = None
    resend_base_url: str = "https://api.resend.com"
    resend_timeout: float = 30.0
    resend_webhook_secret: SecretStr | None = None

    # sendgrid (providers/sendgrid.py). EU regional subusers: https://api.eu.sendgrid.com.
    # SENDGRID_WEBHOOK_PUBLIC_KEY is the Signed Event Webhook's verification key (base64 DER
    # as SendGrid shows it, or PEM): a public key, so not a secret; unset, the webhook is off.
    sendgrid_api_key: SecretStr | None = None
    sendgrid_base_url: str = "https://api.sendgrid.com"
    sendgrid_timeout: float = 30.0
    sendgrid_webhook_public_key: str | None = None

    # mailgun (providers/mailgun.py): the sending domain, and the region's API (EU:
    # https://api.eu.mailgun.net). MAILGUN_WEBHOOK_SIGNING_KEY is the account's HTTP webhook
    # signing key (not the API key).
    mailgun_api_key: SecretStr | None = None
    mailgun_base_url: str = "https://api.mailgun.net"
    mailgun_timeout: float = 30.0
    mailgun_domain: str | None = None
    mailgun_webhook_signing_key: SecretStr | None = None

    # faults (providers/faults.py, for tests: mailbag.testing.faults): fails as real providers
    # do, around FAULTS_INNER. FAULTS_RATES `timeout_after_accept=0.05,throttle=0.1` (of
    # domain.faults.RATE_NAMES); FAULTS_SCRIPT `throttle,accept,timeout_after_accept`, one
    # answer per email before the rates; FAULTS_SEED: the same answers every run.
    faults_rates: str = ""
    faults_script: str = ""
    faults_seed: int | None = None
    faults_inner: ProviderName = "capture"
    faults_batch_size: int = Field(50, ge=1, le=10_000)

    @field_validator("faults_rates", "faults_script", "faults_inner")
    @classmethod
    def _fault_plan(cls, value: str, info: ValidationInfo) -> str:
        from mailbag.domain import faults

        faults.check_setting(str(info.field_name), value)  # ValueError naming what is wrong
        return value

    lease_seconds: float = Field(120.0, gt=0)
    max_attempts: int = Field(5, ge=1)
    retry_base_seconds: float = Field(300.0, gt=0)
    retry_multiplier: float = Field(5.0, ge=1)
    retry_cap_seconds: float = Field(6 * 3600.0, gt=0)
    batch_size: int = Field(100, ge=1, le=10_000)
    concurrency: int = Field(32, ge=1, le=10_000)
    poll_interval: float = Field(1.0, gt=0)
    shutdown_grace: float = Field(30.0, ge=0)
    worker_id: str = Field(default_factory=default_worker_id)

    # Secrets: unset or empty turns each feature off (see _empty_secret_is_unset).
    # SECRET_KEY signs console sessions and derives verification tokens (see mailbag.keys).
    secret_key: SecretStr | None = None
    admin_password: SecretStr | None = None  # unset: the console is off
    admin_token: SecretStr | None = None  # unset: the admin API is off
    # Failed console logins / admin tokens per minute before 429 (per API process).
    auth_failures_per_client: int = Field(5, ge=1)
    auth_failures_overall: int = Field(50, ge=1)
    brevo_webhook_secret: SecretStr | None = None
    ses_webhook_secret: SecretStr | None = None
    ses_topic_arns: str = ""  # comma-separated SNS topics whose notifications are accepted
    sns_cert_hosts: str = r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$"
    reconcile_every_seconds: float = Field(60.0, gt=0)
    reconcile_flag_after_minutes: float = Field(60.0, gt=0)
    # Periodic jobs (reconciliation, purge, expiries) run on one replica, elected with a
    # database lock; a replica tries to take it this often, so a dead holder is replaced
    # within this long.
    scheduler_lease_seconds: float = Field(15.0, gt=0, le=3600)
    purge_after_days: float = Field(30.0, ge=0)  # finished messages kept this long; 0: never purged
    # How often the scheduler purges, drops expired idempotency records and expires stale
    # verifications (each run is cheap when there is little to do: indexed, in short chunks).
    maintenance_every_seconds: float = Field(300.0, gt=0)
    # Messages per second for the whole fleet through this provider; unset: no limit. A
    # provider's own throttling answer lowers it for PROVIDER_RATE_COOLDOWN_SECONDS.
    provider_rate: float | None = Field(None, gt=0)
    provider_rate_cooldown_seconds: float = Field(60.0, gt=0)
    # Per-recipient-domain shaping (domain.domain_shaping): a recipient domain that defers
    # (SMTP 421/451/4.7.x, a provider's throttle naming it) is sent to more slowly by the
    # whole fleet, halved from DOMAIN_SHAPING_CEILING_PER_MINUTE at its first deferral and
    # at each later one, never below DOMAIN_SHAPING_FLOOR_PER_MINUTE, climbing back to the
    # ceiling over DOMAIN_SHAPING_RECOVERY_SECONDS after the last; other domains go on as
    # before. Off: deferrals only retry their own message.
    domain_shaping: bool = True
    domain_shaping_ceiling_per_minute: float = Field(600.0, gt=0, le=1_000_000)
    domain_shaping_floor_per_minute: float = Field(1.0, gt=0)
    domain_shaping_recovery_seconds: float = Field(600.0, gt=0, le=7 * 86400)

    api_host: str = "127.0.0.1"
    api_port: int = Field(8025, ge=0, le=65535)
    api_pool_size: int = Field(20, ge=1, le=500)  # database connections per API process
    # Shedding hostile load, in each API process (api/connection_limits.py for the
    # connection, api/intake_limits.py for bodies). A request's line and headers must arrive
    # within API_HEADER_TIMEOUT_SECONDS of its first byte, or of the connection's start (as
    # nginx's client_header_timeout), and be at most API_MAX_HEADER_BYTES: else 408 or 431,
    # and the connection closes.
    api_header_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    api_max_header_bytes: int = Field(32 * 1024, ge=1024)
    # A body may pause at most API_BODY_TIMEOUT_SECONDS between two reads (nginx's
    # client_body_timeout) and must arrive within that plus its size at
    # API_BODY_MIN_BYTES_PER_SECOND (Apache's MinRate): else 408. 64 KiB/s gives a body at
    # the message limit about 6 minutes.
    api_body_timeout_seconds: float = Field(20.0, gt=0, le=3600)
    api_body_min_bytes_per_second: int = Field(64 * 1024, ge=1)
    # Request bodies one process holds at once; one that would go past it is a 503 with
    # Retry-After. Unset: three bodies at the message limit (about 65 MiB by default).
    api_body_bytes_in_flight: int | None = Field(None, ge=64 * 1024)
    # An idle connection between two requests is closed after this long (uvicorn's
    # timeout_keep_alive). Behind a proxy that reuses connections, set it above the proxy's
    # own idle timeout, or the proxy may send on a connection just being closed.
    api_keep_alive_seconds: float = Field(5.0, gt=0, le=3600)
    # Open connections one process serves; a request on one beyond them is a 503 with
    # Retry-After, and its connection is closed.
    api_max_connections: int = Field(512, ge=1)
    idempotency_ttl_hours: float = Field(24.0, gt=0)
    max_body_bytes: int = Field(256 * 1024, ge=1024)  # every request but POST /v1/messages
    # How much one message may carry (domain.content.Limits); POST /v1/messages takes a body
    # as large as such a message needs (`message_body_bytes`).
    max_recipients: int = Field(50, ge=1, le=1000)  # to, cc and bcc together
    max_attachment_bytes: int = Field(10 * MIB, ge=1)
    max_message_bytes: int = Field(10 * MIB, ge=1)  # attachments and bodies, before encoding
    # The attachment bytes one worker holds at once (its claims keep what fits).
    max_bytes_in_flight: int = Field(256 * MIB, ge=1)
    verification_ttl_minutes: float = Field(24 * 60.0, gt=0)
    verification_sends_per_email_per_hour: int = Field(5, ge=1)
    verification_sends_per_tenant_per_hour: int = Field(1000, ge=1)
    log_level: str = "INFO"
    metrics_port: int | None = Field(None, ge=0, le=65535)  # `worker`: serve /metrics here
    metrics_token: SecretStr | None = None  # set: /metrics wants `Authorization: Bearer ...`
    metrics_tenant_labels: bool = False  # per-tenant series name tenant ids: off unless asked
    # A scrape reads the outbox's gauges from the database at most this often per process.
    metrics_cache_seconds: float = Field(15.0, ge=0, le=3600)

    # Event hooks (domain/hooks.py). HOOKS_KEY encrypts endpoint secrets at rest; unset or
    # empty turns hooks off everywhere: no fan-out, no deliveries, admin routes answer 404.
    hooks_key: SecretStr | None = None
    hook_max_attempts: int = Field(8, ge=1, le=100)
    hook_timeout_seconds: float = Field(10.0, gt=0, le=300)  # one POST, connect to last byte
    hook_retry_base_seconds: float = Field(10.0, gt=0)  # then x5 each time, at most 6 hours
    # Let endpoints reach this machine (loopback, and http:// to it): tests and local
    # development; never in production (domain/hooks/urls.py has the whole rule).
    hook_allow_http_localhost: bool = False
    # Let endpoints reach private networks (RFC 1918, fc00::/7, 100.64/10) and internal
    # names (`.internal`, single labels): receivers inside your network. Never loopback,
    # link-local or cloud metadata addresses.
    hook_allow_private_networks: bool = False
    # At most this many deliveries to one endpoint in flight at once (per claim, so a fleet
    # of N deliverers may briefly hold N times as many): a slow receiver holds only its own.
    hook_max_in_flight_per_endpoint: int = Field(4, ge=1, le=1000)
    # After this many failed attempts in a row an endpoint's breaker opens: its deliveries
    # wait HOOK_BREAKER_SECONDS (doubling while it keeps failing, at most an hour), then
    # one probe goes; a success closes it. The attempts of the waiting ones are not spent.
    hook_breaker_failures: int = Field(5, ge=1, le=1000)
    hook_breaker_seconds: float = Field(30.0, gt=0, le=3600)
    # After this many sure failures in a row of one provider (unreachable, an error about
    # itself, disabled) its breaker opens for the whole fleet: its messages go to the next
    # provider of their route, or wait, no attempt spent, PROVIDER_BREAKER_SECONDS (doubling
    # while it keeps failing, at most an hour); then one probe goes, and an answer closes it.
    provider_breaker_failures: int = Field(5, ge=1, le=1000)
    provider_breaker_seconds: float = Field(30.0, gt=0, le=3600)
    # DNS servers for the lookups mailbag makes itself (hook receivers' names, sender
    # domains' records): a comma list of host[:port]; empty: the system's resolver.
    dns_nameservers: str = ""
    dns_timeout_seconds: float = Field(5.0, gt=0, le=60)  # one lookup, every try included
    # Sender domains (`mailbag domains`): with REQUIRE_READY_DOMAINS, enqueue refuses a From
    # on a domain whose last check did not find it ready; the elected scheduler re-checks
    # each domain this often.
    require_ready_domains: bool = False
    domain_check_every_seconds: float = Field(3600.0, gt=0)
    # Where recipients reach this deployment's API (https://mail.example.com): mailbag's
    # own one-click unsubscribe links for bulk mail live under it. Unset: none are made, and
    # with REQUIRE_UNSUBSCRIBE_FOR_BULK a bulk message must bring its own target.
    public_url: str | None = None
    require_unsubscribe_for_bulk: bool = False

    @field_validator(*SECRET_SETTINGS, mode="before")
    @classmethod
    def _empty_secret_is_unset(cls, value: object) -> object:
        # `MAILBAG_ADMIN_TOKEN=` must switch the admin API off, never on with an empty token.
        if isinstance(value, str) and not value.strip():
            return None
        return value

    # These messages name no value: problems() puts the setting's name before them and never
    # the input (it is a secret).
    @field_validator("admin_password")
    @classmethod
    def _long_admin_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_ADMIN_PASSWORD_LENGTH:
            raise ValueError(
                f"must be at least {MIN_ADMIN_PASSWORD_LENGTH} characters "
                "(unset it to turn the console off)"
            )
        return value

    @field_validator("queue_lifetime", mode="before")
    @classmethod
    def _span(cls, value: object) -> object:
        from mailbag.domain import spans

        if isinstance(value, str) and value.strip().isdigit():
            return int(value)  # seconds
        if isinstance(value, str) and value.strip()[-1:] in spans.UNITS:
            return spans.parse(value)
        return value

    @field_validator("public_url", mode="before")
    @classmethod
    def _public_url(cls, value: object) -> object:
        from urllib.parse import urlsplit

        if isinstance(value, str) and not value.strip():
            return None
        if not isinstance(value, str):
            return value
        parts = urlsplit(value.strip())
        local = parts.hostname in ("localhost", "127.0.0.1", "::1")
        if parts.scheme != "https" and not (parts.scheme == "http" and local):
            raise ValueError("must be an https:// URL (http:// only for localhost)")
        if not parts.hostname or parts.query or parts.fragment:
            raise ValueError("must be a base URL: https://host[:port][/path], no query")
        return value.strip().rstrip("/")

    @field_validator("dns_nameservers")
    @classmethod
    def _dns_servers(cls, value: str) -> str:
        from mailbag.resolver import nameservers

        nameservers(value)  # raises ValueError naming the entry that is wrong
        return value

    @field_validator("resend_webhook_secret")
    @classmethod
    def _signing_secret(cls, value: SecretStr | None) -> SecretStr | None:
        from mailbag.domain.hooks.signing import parse_secret

        if value is not None:
            parse_secret(value.get_secret_value())  # ValueError: "whsec_ followed by base64"
        return value

    @field_validator("hooks_key")
    @classmethod
    def _long_hooks_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < keys.MIN_LENGTH:
            raise ValueError(
                f"must be at least {keys.MIN_LENGTH} characters (unset it to turn event hooks off)"
            )
        return value

    @field_validator("secret_key")
    @classmethod
    def _long_secret_key(cls, value: SecretStr | None) -> SecretStr | None:
        # Refused when read, as the other secrets are, not first when a command loads the key.
        if value is not None and len(value.get_secret_value()) < keys.MIN_LENGTH:
            raise ValueError(f"must be at least {keys.MIN_LENGTH} characters; {keys.GENERATE_HINT}")
        return value

    @model_validator(mode="after")
    def _fleet(self) -> Settings:
        # Every table checked now, so a worker never starts half configured.
        for name in self.providers:
            self.provider_table(name)
        if self.routes and not self.providers:
            raise ValueError("routes: name [providers.NAME] tables (none are configured)")
        self.routing  # noqa: B018 (InvalidRouting names the route and key)
        if self.max_bytes_in_flight < self.max_message_bytes:
            raise ValueError(
                "max_bytes_in_flight: must be at least max_message_bytes"
                f" ({self.max_message_bytes}): a worker must be able to hold one message"
            )
        if self.domain_shaping_floor_per_minute > self.domain_shaping_ceiling_per_minute:
            raise ValueError(
                "domain_shaping_floor_per_minute: must not be above"
                f" domain_shaping_ceiling_per_minute ({self.domain_shaping_ceiling_per_minute:g})"
            )
        return self

    def provider_table(self, name: str) -> tuple[str, Settings]:
        """The kind of `[providers.NAME]` and the settings its provider is built from."""
        if not PROVIDER_TABLE_NAME.fullmatch(name) or name == TENANT_ACCOUNT:
            raise ValueError(
                f"providers.{name[:60]}: a provider's name is 1 to 50 of a-z, 0-9, _ and -"
                f" (and not {TENANT_ACCOUNT!r}, which routes use for a tenant's own account)"
            )
        table = dict(self.providers[name])
        kind = table.pop("kind", None)
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"providers.{name}.kind: missing (a registered provider's name)")
        return kind, self.for_provider(kind, table, where=f"providers.{name}")

    def for_provider(
        self, kind: str, table: Mapping[str, object], *, where: str = "providers"
    ) -> Settings:
        """These settings with `table`'s (a kind's settings without MAILBAG_<KIND>_: `host`
        for SMTP_HOST) in place, checked as if they had been set: InvalidSettings names
        `where`.KEY and what is wrong, never the value."""
        prefix = f"{kind}_"
        fields = type(self).model_fields
        known = sorted(f.removeprefix(prefix) for f in fields if f.startswith(prefix))
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise InvalidSettings(
                f"{where}.{unknown[0][:60]}: not a setting of {kind}"
                f" (its settings: {', '.join(known) or 'none'})"
            )
        # A copy that is one provider's deployment, each of the table's values validated as
        # its setting would be (constraints, validators) by pydantic's assignment check.
        alone = self.model_copy(update={"provider": kind, "providers": {}, "routes": []})
        try:
            for key, value in table.items():
                type(self).__pydantic_validator__.validate_assignment(alone, prefix + key, value)
        except ValidationError as exc:
            raise InvalidSettings(
                problems(exc, named=lambda path: f"{where}.{path.removeprefix(prefix)}")
            ) from None
        return alone

    @property
    def routing(self) -> Routing:
        """Which providers each message may go through (domain/routing.py)."""
        if not self.providers:
            return Routing.single(self.provider)
        try:
            return Routing.of([r.route() for r in self.routes], self.providers)
        except InvalidRouting as exc:
            raise ValueError(str(exc)) from None

    @property
    def hooks_enabled(self) -> bool:
        return self.hooks_key is not None

    @property
    def hook_breaker(self) -> Breaker:
        from mailbag.domain.breaker import Breaker

        return Breaker(
            failures=self.hook_breaker_failures, base=timedelta(seconds=self.hook_breaker_seconds)
        )

    @property
    def shaping(self) -> Shaping | None:
        """DOMAIN_SHAPING's numbers; None when it is off."""
        from mailbag.domain.domain_shaping import Shaping

        if not self.domain_shaping:
            return None
        return Shaping.per_minute(
            self.domain_shaping_ceiling_per_minute,
            self.domain_shaping_floor_per_minute,
            self.domain_shaping_recovery_seconds,
        )

    @property
    def provider_breaker(self) -> Breaker:
        from mailbag.domain.breaker import Breaker

        return Breaker(
            failures=self.provider_breaker_failures,
            base=timedelta(seconds=self.provider_breaker_seconds),
        )

    @property
    def hook_url_policy(self) -> HookUrlPolicy:
        """What hook URLs may reach beyond the public internet (domain/hooks/urls.py)."""
        from mailbag.domain.hooks.urls import Policy  # httpx: not for every command's start

        return Policy(
            allow_loopback=self.hook_allow_http_localhost,
            allow_private=self.hook_allow_private_networks,
        )

    @cached_property
    def hook_retry_policy(self) -> RetryPolicy:
        base = timedelta(seconds=self.hook_retry_base_seconds)
        return RetryPolicy(
            max_attempts=self.hook_max_attempts,
            base=base,
            multiplier=5.0,
            cap=max(base, timedelta(hours=6)),
        )

    @property
    def ready_from(self) -> str | None:
        """With REQUIRE_READY_DOMAINS, the From a message without its own is checked under
        (FROM_EMAIL); None: sender domains' readiness is not checked at enqueue."""
        return self.from_email if self.require_ready_domains else None

    @cached_property
    def key(self) -> bytes:
        """The deployment's secret key; raises keys.MissingSecretKey saying what to set."""
        secret = self.secret_key.get_secret_value() if self.secret_key else None
        return keys.load(secret, self.database_url)

    @cached_property
    def erasure_key(self) -> ErasureKey | None:
        """What erased addresses are hashed under (services/erasure.py); None without a key."""
        try:
            return ErasureKey.of(self.key)
        except keys.MissingSecretKey:
            return None

    @cached_property
    def unsubscribe_links(self) -> UnsubscribeLinks | None:
        """mailbag's own one-click unsubscribe links (PUBLIC_URL, signed with a subkey of
        the deployment key); None without PUBLIC_URL or a key."""
        from mailbag.domain.bulk import UnsubscribeLinks

        if self.public_url is None:
            return None
        try:
            key = self.key
        except keys.MissingSecretKey:
            return None
        return UnsubscribeLinks(self.public_url, keys.derive(key, UNSUBSCRIBE_PURPOSE))

    @cached_property
    def verification_tokens(self) -> Tokens:
        """Derives each verification email's token from the key (API and worker alike)."""
        return Tokens(keys.derive(self.key, TOKEN_PURPOSE))

    @field_validator("listen_url", "migrate_url", "provider_rate", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # `MAILBAG_LISTEN_URL=` means "not set" (DATABASE_URL), `MAILBAG_PROVIDER_RATE=` no limit.
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("database_url", "listen_url", "migrate_url")
    @classmethod
    def _known_database(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                dialect_of(value)
            except UnsupportedDatabase:  # its message names the scheme only
                raise
            except Exception:  # SQLAlchemy's parse errors may quote the URL, password and all
                raise ValueError(
                    "is not a database URL: use sqlite:///PATH, "
                    "postgresql://USER:PASSWORD@HOST:PORT/NAME or mysql://USER:PASSWORD@HOST/NAME"
                ) from None
        return value

    @property
    def session_url(self) -> str:
        """A direct connection's URL, for what needs a session of its own (LISTEN, the
        scheduler's lock): LISTEN_URL, else DATABASE_URL."""
        return self.listen_url or self.database_url

    @property
    def schema_url(self) -> str:
        """Where schema changes run: MIGRATE_URL, else DATABASE_URL."""
        return self.migrate_url or self.database_url

    @property
    def message_body_bytes(self) -> int:
        """The largest POST /v1/messages body: one at the limits always fits. Base64 makes
        attachments 4/3 their size; JSON escapes can triple a body's bytes (\\u00e9 for é), so
        the two bodies' escapes are allowed for on top; the rest is max_body_bytes, as for
        every other request."""
        encoded = -(-self.max_message_bytes * 4 // 3)
        escapes = 2 * 2 * min(BODY_MAX_BYTES, self.max_message_bytes)
        return self.max_body_bytes + encoded + escapes

    @cached_property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            base=timedelta(seconds=self.retry_base_seconds),
            multiplier=self.retry_multiplier,
            cap=timedelta(seconds=max(self.retry_cap_seconds, self.retry_base_seconds)),
        )

    @property
    def message_id_host(self) -> str:
        return self.message_id_domain or self.from_email.rpartition("@")[2] or "mailbag.local"

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.lease_seconds)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = Path(os.environ.get("MAILBAG_CONFIG", "mailbag.toml"))
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=toml_file),
        )


class InvalidSettings(ValueError):
    """Settings that cannot be read. The message names each bad setting and what is wrong
    with it, never the value given: that may be a secret (a key, a password, a URL with one)."""


def read_settings(**overrides: Any) -> Settings:
    """The settings (the environment, the TOML file; `overrides` first); InvalidSettings if
    any is wrong. Every entry point reads them here, so none shows a value in its error."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise InvalidSettings(problems(exc)) from None
    except ValueError as exc:  # an unreadable TOML file (line and column, never its text)
        raise InvalidSettings(f"{type(exc).__name__}: {exc}") from None


def problems(exc: ValidationError, *, named: Callable[[str], str] | None = None) -> str:
    """Each problem as `name (MAILBAG_NAME): what is wrong` (`named`: how else to name the
    setting at a path): pydantic's own text carries the input (`input_value='...'`), left
    out here."""
    found = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        message = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:
            found.append(message)
            continue
        path = ".".join(str(part) for part in error["loc"])
        label = named(path) if named else f"{path} (MAILBAG_{str(error['loc'][0]).upper()})"
        found.append(f"{label}: {message}")
    return "; ".join(found)
