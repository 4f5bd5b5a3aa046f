"""What every provider module shares, so a provider is its payload, its table and its I/O.

Rules kept here, once:

- Outcome tables name the domain's outcome classes (`Accepted`, `Rejected`, `Deferred`,
  `Ambiguous`, `Disabled`, `Throttled` in domain.delivery), never a provider's own vocabulary. A
  first-match table (`first_match`) is rows of (key, outcome class): a `str` key is the
  provider's error code, an `int` or `range` an HTTP status, an exception class a failure
  raised on the way; a failure no row matches is Ambiguous, because nobody can prove the
  provider did not take the email. `failure_outcome` builds the outcome a row names.
- Error texts are stored, logged and shown: they go through `scrub` (the provider's
  secrets, secret-shaped tokens, credentials in URLs replaced; capped at ERROR_TEXT_MAX).
- A provider refuses what it cannot carry, never drops it: building a request calls
  `unsupported_feature`, which raises `UnsupportedFeature`, a ValueError, so the provider's
  "cannot build the request" path makes it Rejected (anymail's `unsupported_feature`).
  Today that is a non-ASCII local part for a provider without SMTPUTF8
  (`ascii_envelope_address`).
  What each provider carries of an `OutgoingEmail`: smtp, ses and file send our MIME
  (addresses and names of From, To, Cc and Reply-To, subject, both bodies, attachments
  and inline images, List-Unsubscribe, headers, Message-ID), brevo the same as JSON
  fields; `tags` are mailbag's own labels (stored and shown with the message), which brevo
  also sends as its tags. Bcc is envelope only on every provider, in no header: smtp's
  RCPT TO, ses's Destination, brevo's `bcc` field, file's `.envelope.json`, console's
  "envelope only" line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Final, NoReturn

from mailbag.domain import delivery
from mailbag.domain.message import ascii_domain

ERROR_TEXT_MAX: Final = 500
REDACTED: Final = "[redacted]"

OutcomeClass = (
    type[delivery.Accepted]
    | type[delivery.Rejected]
    | type[delivery.Deferred]
    | type[delivery.Ambiguous]
    | type[delivery.Disabled]
    | type[delivery.Throttled]
)
TableKey = str | int | range | type[BaseException]
OutcomeTable = Sequence[tuple[TableKey, OutcomeClass]]

# Credentials in a URL (`https://user:password@host`) are replaced wherever they appear.
_URL_USERINFO: Final = re.compile(r"(?<=://)[^/@\s]+@")


class UnsupportedFeature(ValueError):
    """The email asks for something this provider cannot carry: Rejected, never dropped."""

    def __init__(self, provider: str, feature: str) -> None:
        super().__init__(f"the {provider} provider cannot send {feature}")
        self.provider = provider
        self.feature = feature


def unsupported_feature(provider: str, feature: str) -> NoReturn:
    """Refuse `feature` (what the email asks for, as a phrase: "a non-ASCII local part")."""
    raise UnsupportedFeature(provider, feature)


def first_match(
    table: OutcomeTable,
    *,
    code: str | None = None,
    status: int | None = None,
    error: BaseException | None = None,
) -> OutcomeClass:
    """The outcome class of the first row matching the error code, the HTTP status or the
    exception; Ambiguous when none does."""
    for key, outcome_class in table:
        if isinstance(key, str):
            matched = key == code
        elif isinstance(key, int):
            matched = key == status
        elif isinstance(key, range):
            matched = status is not None and status in key
        else:
            matched = isinstance(error, key)
        if matched:
            return outcome_class
    return delivery.Ambiguous


def failure_outcome(
    outcome_class: OutcomeClass,
    error: str,
    *,
    keyed: bool,
    retry_after: timedelta | None = None,
    provider_fault: bool = True,
    domain_deferral: bool = False,
) -> delivery.SendOutcome:
    """The outcome a table row names, for a send that ended in `error` (scrubbed already).
    `keyed`: whether the request carried this email's own idempotency key (see
    `Ambiguous.keyed`); `retry_after`: the provider's hint, kept by a Deferred or Throttled
    only. A Deferred is the provider's fault unless said otherwise (`provider_fault`): an
    HTTP API that could not be reached or answered an error about itself (5xx, a redirect)
    has not judged the message; only SMTP's 4xx about a recipient is the message's.
    `domain_deferral`: the recipient's domain deferred it (see `Deferred`)."""
    if outcome_class is delivery.Deferred:
        return delivery.Deferred(
            error,
            retry_after=retry_after,
            provider_fault=provider_fault,
            domain_deferral=domain_deferral,
        )
    if outcome_class is delivery.Throttled:
        return delivery.Throttled(error, retry_after=retry_after)
    if outcome_class is delivery.Ambiguous:
        return delivery.Ambiguous(error, keyed=keyed)
    if outcome_class is delivery.Disabled:
        return delivery.Disabled(error)
    if outcome_class is delivery.Rejected:
        return delivery.Rejected(error)
    raise TypeError(f"{outcome_class.__name__} needs the provider's message id, not an error")


def describe(exc: BaseException) -> str:
    """An exception in one line: its class and the first line of its message, capped."""
    lines = str(exc).strip().splitlines()
    text = " ".join(lines[0].split()) if lines else ""
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:ERROR_TEXT_MAX]


def scrub(
    text: str, *secrets: str | None, patterns: Sequence[tuple[re.Pattern[str], str]] = ()
) -> str:
    """An error text safe to store and show: each secret given, then each pattern, then
    credentials in URLs replaced, and the whole capped at ERROR_TEXT_MAX. Whatever a server
    echoes back (a key, an Authorization header), it never reaches `last_error` or a log."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    for pattern, replacement in patterns:
        text = pattern.sub(replacement, text)
    return _URL_USERINFO.sub("[credentials]@", text)[:ERROR_TEXT_MAX]


def retry_after(
    headers: Mapping[str, str],
    names: Sequence[str] = ("retry-after",),
    *,
    now: datetime | None = None,
) -> timedelta | None:
    """The provider's wait hint: the first of the headers `names` (in order) that holds
    seconds (fractions allowed, as rate-limit-reset headers send them) or an HTTP date
    (Retry-After, RFC 9110) not in the past. None when no header gives a usable value."""
    for name in names:
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = parsedate_to_datetime(value)
            except (TypeError, ValueError):
                continue
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            seconds = (when - (now or datetime.now(UTC))).total_seconds()
        if seconds >= 0:  # neither NaN nor in the past
            try:
                return timedelta(seconds=seconds)
            except OverflowError:  # "inf", or beyond any calendar: no usable hint
                continue
    return None


def envelope_address(address: str) -> tuple[str, bool]:
    """The address with an ASCII (IDNA) domain, and whether its local part needs SMTPUTF8."""
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        raise ValueError(f"not an email address: {address!r}")
    return f"{local}@{ascii_domain(domain)}", not local.isascii()


def ascii_envelope_address(provider: str, address: str) -> str:
    """The address as a provider without SMTPUTF8 takes it: the domain in IDNA form; a
    non-ASCII local part is an unsupported feature (enqueue already refuses one for such a
    provider, see `Capabilities.utf8_local_part`; this is the last line)."""
    ascii_form, needs_smtputf8 = envelope_address(address)
    if needs_smtputf8:
        unsupported_feature(provider, f"to or from a non-ASCII local part ({address!r})")
    return ascii_form
