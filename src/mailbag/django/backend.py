"""Django's email backend for mailbag: `send_mail` and friends write into the outbox, on
Django's own database connection, inside the caller's `transaction.atomic()`.

    EMAIL_BACKEND = "mailbag.django.EmailBackend"

    with transaction.atomic():
        order = Order.objects.create(...)
        send_mail("Your order", "Thanks!", None, [order.email])
    # committed: the worker (`manage.py mailbag_worker`) sends it; rolled back: nothing is sent

Rules:
- every message of one call is validated first (convert.py); with fail_silently=False one
  invalid message raises InvalidMessage and nothing is enqueued; with fail_silently=True the
  invalid ones are logged (their problems' field names, never their addresses) and skipped;
- the messages are written together in `transaction.atomic(using=alias)`: a savepoint when
  the caller has a transaction open (a failed write leaves the caller's transaction usable),
  its own transaction otherwise (Django's autocommit would commit each statement alone);
- the return value is how many of the messages are in the outbox to be sent: created now,
  or already there under the same Idempotency-Key; a message written as failed at once
  (every To on the suppression list) does not count;
- idle workers in this process are woken when Django commits (`transaction.on_commit`);
  PostgreSQL's NOTIFY, sent from the same transaction, wakes the others (outbox.write).

Options (EMAIL_BACKEND takes them from settings.MAILBAG; Django 6.1's MAILERS passes its
OPTIONS as keyword arguments, which win): `tenant`, `database` (a DATABASES alias),
`max_attempts`; any other is refused (TypeError). Django's `auth_user`/`auth_password`
mean nothing here and are refused too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.core.mail.backends.base import BaseEmailBackend

from mailbag import log
from mailbag.django import conf
from mailbag.django.convert import message_fields
from mailbag.django.outbox import write
from mailbag.domain.content import Address
from mailbag.domain.message import InvalidMessage, NewMessage
from mailbag.domain.states import Status
from mailbag.services.intake import Rules

if TYPE_CHECKING:
    from mailbag.settings import Settings


class EmailBackend(BaseEmailBackend):  # type: ignore[misc]  # Django ships no types
    def __init__(
        self,
        fail_silently: bool = False,
        *,
        tenant: str | None = None,
        database: str | None = None,
        max_attempts: int | None = None,
        username: str | None = None,
        password: str | None = None,
        alias: str | None = None,
        **options: Any,
    ) -> None:
        # `alias`: the name of the MAILERS entry, which Django 6.1 passes and keeps.
        super().__init__(**({"alias": alias} if alias is not None else {}))
        self.fail_silently = fail_silently
        if username is not None or password is not None:
            raise ImproperlyConfigured(
                "mailbag.django.EmailBackend takes no auth_user/auth_password: the worker "
                "sends with mailbag's provider settings"
            )
        if options:
            raise TypeError(
                f"mailbag.django.EmailBackend got unknown options: {', '.join(sorted(options))} "
                "(it takes tenant, database and max_attempts)"
            )
        self.database = conf.database_alias(database)
        self.tenant = conf.tenant(tenant)
        self.max_attempts = max_attempts
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        """mailbag's settings (read once per backend): the address rules and size limits
        messages are checked against are the worker's."""
        if self._settings is None:
            self._settings = conf.mailbag_settings(self.database)
        return self._settings

    def send_messages(self, email_messages: Sequence[Any]) -> int:
        if not email_messages:
            return 0
        built = self._validated(email_messages)
        if not built:
            return 0
        try:
            results = write(
                self.database,
                built,
                max_attempts=self.max_attempts or self.settings.max_attempts,
                rules=Rules.of(self.settings),  # cheap: its parts are read once each
            )
        except Exception as exc:
            if not self.fail_silently:
                raise
            log.get("mailbag.django").warning(
                "emails not enqueued", count=len(built), error=type(exc).__name__
            )
            return 0
        return sum(1 for result in results if result.message.status != Status.FAILED)

    def _validated(self, email_messages: Sequence[Any]) -> list[NewMessage]:
        config = self.settings
        rules = Rules.of(config)  # what mailbag.enqueue and the API check, from these settings
        default_from = Address(config.from_email, config.from_name)
        built = []
        for message in email_messages:
            try:
                fields = message_fields(message, tenant=self.tenant, default_from=default_from)
                built.append(rules.message(**fields))
            except InvalidMessage as exc:
                if not self.fail_silently:
                    raise
                log.get("mailbag.django").warning("email not enqueued", problems=sorted(exc.errors))
        return built
