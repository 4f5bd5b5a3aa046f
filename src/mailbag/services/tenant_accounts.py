"""Tenants' own provider accounts: an operator gives a tenant its own provider credentials
(`mailbag tenants account`, the admin API, the console), and every worker reads them all
(`accounts`) to build each tenant's own provider, the one its routes call `tenant`.

An account is a provider `kind` (a name providers.available() knows) and that kind's
settings without their MAILBAG_<KIND>_ prefix, as a `[providers.NAME]` table in
mailbag.toml has them (`{"api_key": ..., "base_url": ...}` for postmark). They are checked
by Settings.for_provider when set, and sealed as one JSON object with the hooks' SecretBox
under a key derived from the deployment's secret key (`keys.derive(key, ACCOUNT_PURPOSE)`),
so a dump of the database holds no credential. They are never shown again: `show` says
which keys are set, and the values of only those that are not secrets. The default tenant
has no own account: it sends through the deployment's providers.

Every door (CLI, admin API, console) goes through `TenantAccounts`, which checks the key,
the kind and the settings before it reads a tenant, and writes nothing when any is wrong.

Errors:
    NoAccountKey        no deployment key to seal or open with: 409, exit 1
    InvalidAccount      an unknown kind, a key the kind has not, a value it refuses, the
                        default tenant (the message names the key, never a value): 422, exit 2
    NoAccount           the tenant has no own account: 404, exit 1
    UnreadableAccount   its settings do not open with this key (sealed under another): 409,
                        exit 1
    UnknownTenant       (services.tenants) no tenant has that id or name: 404, exit 2
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, get_args

from pydantic import SecretStr, ValidationError

from mailbag import keys, log
from mailbag.domain.hooks import SecretBox, WrongHooksKey
from mailbag.domain.message import DEFAULT_TENANT
from mailbag.services.tenants import tenant_id_of
from mailbag.settings import SECRET_SETTINGS, InvalidSettings, Settings, problems
from mailbag.store import tenant_accounts as store
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase, AsyncSession
from mailbag.store.tenant_accounts import SealedAccount, StoredAccount

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

ACCOUNT_PURPOSE = "tenant-accounts"  # the subkey's purpose (keys.derive)
SETTINGS_MAX_BYTES = 8192  # the settings as JSON: a provider's table is a few hundred bytes
KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")  # a setting's name, as TOML writes it
Scalar = str | int | float | bool


class NoAccountKey(Exception):
    """No deployment key to seal or open accounts with; the message says what to set."""


class InvalidAccount(ValueError):
    """An account the rules refuse. The message names the key, never a value given."""


class NoAccount(LookupError):
    def __init__(self, tenant_id: str) -> None:
        super().__init__(f"tenant {tenant_id} has no own provider account")


class UnreadableAccount(RuntimeError):
    """The settings do not open with this deployment's key (sealed under another one)."""

    def __init__(self, tenant_id: str) -> None:
        super().__init__(
            f"tenant {tenant_id}'s own account does not open with this deployment's secret key "
            "(was SECRET_KEY changed?): set the account again, or remove it"
        )


@dataclass(frozen=True)
class TenantAccount:
    """A tenant's own account, opened: what a worker builds the tenant's provider from
    (`settings.for_provider(account.kind, account.settings)`)."""

    kind: str
    settings: Mapping[str, object]
    updated_at: datetime


@dataclass(frozen=True)
class AccountView:
    """A tenant's own account as people see it: which keys are set, and the values of
    only those that are not secrets."""

    tenant_id: str
    kind: str
    keys: tuple[str, ...]  # every key set, in order
    shown: Mapping[str, Scalar]  # the values of the keys that are not secrets
    created_at: datetime
    updated_at: datetime
    updated_by: str

    @property
    def secret_keys(self) -> tuple[str, ...]:
        return tuple(key for key in self.keys if key not in self.shown)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "kind": self.kind,
            "keys": list(self.keys),
            "secret_keys": list(self.secret_keys),
            "settings": dict(self.shown),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "updated_by": self.updated_by,
        }


def account_box(settings: Settings) -> SecretBox:
    """What seals and opens accounts: the hooks' SecretBox under a subkey of the deployment
    key (SECRET_KEY, or the key file beside an SQLite database). NoAccountKey if there is
    none: an account is never stored in clear."""
    try:
        key = settings.key
    except keys.MissingSecretKey as exc:
        raise NoAccountKey(f"tenants' own accounts are sealed with the secret key: {exc}") from None
    return SecretBox(keys.derive(key, ACCOUNT_PURPOSE).hex())


def is_secret(kind: str, key: str) -> bool:
    """Whether a setting's value is a secret (never shown): SECRET_SETTINGS names it, or
    Settings types it SecretStr; a key Settings does not know counts as one."""
    name = f"{kind}_{key}"
    setting = Settings.model_fields.get(name)
    if setting is None or name in SECRET_SETTINGS:
        return True
    return setting.annotation is SecretStr or SecretStr in get_args(setting.annotation)


def checked(settings: Settings, kind: str, table: Mapping[str, object]) -> dict[str, Scalar]:
    """The settings of an account of `kind`, as they will be sealed; InvalidAccount naming
    the first key that is wrong. Checked by the rules the worker builds the provider by
    (`settings.for_provider`, over the deployment's settings), so an account that is stored
    can be built."""
    from mailbag.providers import available

    known = available()
    if kind not in known:
        raise InvalidAccount(f"kind: not a provider (available: {', '.join(known)})")
    values: dict[str, Scalar] = {}
    for key, value in table.items():
        if not isinstance(key, str) or not KEY.match(key):
            raise InvalidAccount("settings: a key is not a setting's name (letters, digits, _)")
        if not isinstance(value, Scalar):
            raise InvalidAccount(f"settings.{key}: must be a string, a number or true/false")
        values[key] = value
    if len(_serialized(values)) > SETTINGS_MAX_BYTES:
        raise InvalidAccount(f"settings: more than {SETTINGS_MAX_BYTES} bytes as JSON")
    try:
        settings.for_provider(kind, values, where="settings")
    except InvalidSettings as exc:  # names the key, never the value
        raise InvalidAccount(str(exc)) from None
    except ValidationError as exc:  # pydantic's own text would quote the input
        raise InvalidAccount(problems(exc)) from None
    return values


def parse_pairs(
    pairs: Iterable[str], where: str = "--set", *, trim: bool = False
) -> dict[str, str]:
    """`key=value` pairs (the CLI's --set, the console's lines) as settings; InvalidAccount
    naming the pair's number (never its text) if one is not a pair. A value may hold `=`:
    the key is the text before the first. Blank pairs are skipped; `trim`: a value's
    surrounding spaces are dropped (typed into a form) rather than kept (given exactly)."""
    table: dict[str, str] = {}
    for number, pair in enumerate(pairs, 1):
        if not pair.strip():
            continue
        key, equals, value = pair.partition("=")
        key = key.strip()
        if not equals or not KEY.match(key):
            raise InvalidAccount(f"{where} {number}: not key=value (a setting's name, then =)")
        table[key] = value.strip() if trim else value
    return table


def _serialized(values: Mapping[str, Scalar]) -> str:
    return json.dumps(dict(values), sort_keys=True, separators=(",", ":"))


def _opened(box: SecretBox, account: SealedAccount) -> dict[str, Scalar]:
    try:
        values = json.loads(box.open(account.sealed_settings))
    except (WrongHooksKey, ValueError):
        raise UnreadableAccount(account.tenant_id) from None
    if not isinstance(values, dict):
        raise UnreadableAccount(account.tenant_id)
    return values


def _view(account: SealedAccount, values: Mapping[str, Scalar]) -> AccountView:
    order = sorted(values)
    shown = {key: values[key] for key in order if not is_secret(account.kind, key)}
    return AccountView(
        account.tenant_id,
        account.kind,
        tuple(order),
        MappingProxyType(shown),
        account.created_at,
        account.updated_at,
        account.updated_by,
    )


def _owner(tenant: str) -> Plan[str]:
    tenant_id = yield from tenant_id_of(tenant)
    if tenant_id == DEFAULT_TENANT:
        raise InvalidAccount(
            "tenant: the default tenant sends through the deployment's own providers; "
            "an own account is for a tenant made with `mailbag tenants create`"
        )
    return tenant_id


def _put(
    tenant: str, kind: str, values: dict[str, Scalar], sealed: str, now: datetime, actor: str
) -> Plan[tuple[AccountView, bool]]:
    tenant_id = yield from _owner(tenant)
    created = yield from store.put(tenant_id, kind, sealed, now=now, actor=actor)
    account = SealedAccount(tenant_id, kind, sealed, now, now, actor)
    if not created:  # its creation time is the stored one
        account = (yield from store.sealed_one(tenant_id)) or account
    return _view(account, values), created


def _show(tenant: str, box: SecretBox) -> Plan[AccountView]:
    tenant_id = yield from _owner(tenant)
    account = yield from store.sealed_one(tenant_id)
    if account is None:
        raise NoAccount(tenant_id)
    return _view(account, _opened(box, account))


def _remove(tenant: str) -> Plan[str]:
    tenant_id = yield from _owner(tenant)
    if not (yield from store.remove(tenant_id)):
        raise NoAccount(tenant_id)
    return tenant_id


def opened(box: SecretBox) -> Plan[dict[str, TenantAccount]]:
    """Every tenant's own account, opened, by tenant id: the plan `accounts` runs, for a
    caller's own transaction. An account that does not open (sealed under another key) is
    logged and left out, as if its tenant had none, and no other tenant's is touched."""
    found: dict[str, TenantAccount] = {}
    for account in (yield from store.sealed_all()):
        try:
            values = _opened(box, account)
        except UnreadableAccount as exc:
            log.get("mailbag.accounts").warning(
                "tenant_account_unreadable", tenant=account.tenant_id, error=str(exc)
            )
            continue
        found[account.tenant_id] = TenantAccount(
            account.kind, MappingProxyType(values), account.updated_at
        )
    return found


async def accounts(source: AsyncEngine | AsyncSession, box: SecretBox) -> dict[str, TenantAccount]:
    """Every tenant's own account, opened, by tenant id (see `opened`): on an engine, or in
    the session (`tx`) a caller holds."""
    if isinstance(source, AsyncSession):
        return await source.run(opened(box))
    async with AsyncDatabase(source).connect(read_only=True) as session:
        return await session.run(opened(box))


class TenantAccounts:
    """Tenants' own accounts for every door; a tenant is named by its id or its name."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.db, self.settings = AsyncDatabase(engine), settings

    def box(self) -> SecretBox:
        return account_box(self.settings)

    async def put(
        self, tenant: str, kind: str, table: Mapping[str, object], *, now: datetime, actor: str
    ) -> tuple[AccountView, bool]:
        """Give a tenant its own account of `kind` with exactly these settings, or replace
        the one it has; (the account as shown, True when it had none)."""
        box = self.box()
        values = checked(self.settings, kind, table)
        sealed = box.seal(_serialized(values))
        async with self.db.transaction() as tx:
            return await tx.run(_put(tenant, kind, values, sealed, now, actor))

    async def show(self, tenant: str) -> AccountView:
        box = self.box()
        async with self.db.connect(read_only=True) as session:
            return await session.run(_show(tenant, box))

    async def remove(self, tenant: str) -> str:
        """Take a tenant's own account away (no key needed); its id. NoAccount if none."""
        async with self.db.transaction() as tx:
            return await tx.run(_remove(tenant))

    async def listing(self) -> list[StoredAccount]:
        """Every tenant's own account without its settings (no key needed)."""
        async with self.db.connect(read_only=True) as session:
            return await session.run(store.listing())
