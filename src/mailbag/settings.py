"""Settings: environment variables with the MAILBAG_ prefix, or a TOML file.

The TOML file is `mailbag.toml` in the working folder, or the path in MAILBAG_CONFIG; its
keys are the setting names in lower case (`database_url = "..."`). The environment wins.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mailbag import keys
from mailbag.database_url import dialect_of
from mailbag.domain.content import BODY_MAX_BYTES, MIB, Limits
from mailbag.domain.message import AddressRules
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.verification import TOKEN_PURPOSE, Tokens

MIN_ADMIN_PASSWORD_LENGTH = 12
SECRET_SETTINGS = (
    "secret_key",
    "admin_password",
    "admin_token",
    "brevo_webhook_secret",
    "ses_webhook_secret",
    "metrics_token",
    "smtp_password",
    "brevo_api_key",
    "hooks_key",
)

TLSMode = Literal["auto", "starttls", "implicit", "none"]  # SMTP_TLS: see providers/smtp.py
ProviderName = str  # one of the registered providers: console, file, smtp, ses, brevo, ...


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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

    api_host: str = "127.0.0.1"
    api_port: int = Field(8025, ge=0, le=65535)
    api_pool_size: int = Field(20, ge=1, le=500)  # database connections per API process
    idempotency_ttl_hours: float = Field(24.0, gt=0)
    max_body_bytes: int = Field(256 * 1024, ge=1024)  # every request but POST /v1/messages
    # How much one message may carry (domain.content.Limits); POST /v1/messages takes a body
    # as large as such a message needs (`message_body_bytes`).
    max_recipients: int = Field(50, ge=1, le=1000)  # to, cc and bcc together
    max_attachment_bytes: int = Field(10 * MIB, ge=1)
    max_message_bytes: int = Field(10 * MIB, ge=1)  # attachments and bodies, before encoding
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
    # Let endpoints use http:// to localhost (tests, local development); never in production.
    hook_allow_http_localhost: bool = False

    @field_validator(*SECRET_SETTINGS, mode="before")
    @classmethod
    def _empty_secret_is_unset(cls, value: object) -> object:
        # `MAILBAG_ADMIN_TOKEN=` must switch the admin API off, never on with an empty token.
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("admin_password")
    @classmethod
    def _long_admin_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_ADMIN_PASSWORD_LENGTH:
            raise ValueError(
                f"ADMIN_PASSWORD must be at least {MIN_ADMIN_PASSWORD_LENGTH} characters "
                "(unset it to turn the console off)"
            )
        return value

    @field_validator("hooks_key")
    @classmethod
    def _long_hooks_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < keys.MIN_LENGTH:
            raise ValueError(
                f"HOOKS_KEY must be at least {keys.MIN_LENGTH} characters "
                "(unset it to turn event hooks off)"
            )
        return value

    @property
    def hooks_enabled(self) -> bool:
        return self.hooks_key is not None

    @cached_property
    def hook_retry_policy(self) -> RetryPolicy:
        base = timedelta(seconds=self.hook_retry_base_seconds)
        return RetryPolicy(
            max_attempts=self.hook_max_attempts,
            base=base,
            multiplier=5.0,
            cap=max(base, timedelta(hours=6)),
        )

    @cached_property
    def key(self) -> bytes:
        """The deployment's secret key; raises keys.MissingSecretKey saying what to set."""
        secret = self.secret_key.get_secret_value() if self.secret_key else None
        return keys.load(secret, self.database_url)

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
            dialect_of(value)  # raises UnsupportedDatabase with a clear message
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

    @cached_property
    def address_rules(self) -> AddressRules:
        """The addresses enqueue accepts: ALLOW_TEST_DOMAINS and the provider decide."""
        from mailbag.providers.base import address_rules

        return address_rules(self)

    @cached_property
    def limits(self) -> Limits:
        """How much one message may carry: these settings and what the provider cannot
        carry. The API and the CLI pass them to new_message."""
        from mailbag.providers.base import message_limits

        return message_limits(self)

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
