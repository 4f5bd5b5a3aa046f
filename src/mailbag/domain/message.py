"""A new outbox message and the rules it must satisfy before anything is written."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict

import idna
from email_validator import EmailNotValidError, validate_email
from email_validator.rfc_constants import (
    CASE_INSENSITIVE_MAILBOX_NAMES,
    DOT_ATOM_TEXT,
    EMAIL_MAX_LENGTH,
    LOCAL_PART_MAX_LENGTH,
)

from mailbag.domain import storable
from mailbag.domain.bulk import BULK_TAG
from mailbag.domain.content import (
    BODY_MAX_BYTES,
    FILENAME_MAX,
    UNSUBSCRIBE_URL_MAX,
    Address,
    Attachment,
    AttachmentRef,
    Limits,
    Priority,
    Recipients,
    content_id_problem,
    content_type_problem,
    inline_css,
    text_from_html,
    unresolved_cid,
)
from mailbag.domain.states import Status
from mailbag.domain.templates import TEMPLATE_NAME_MAX as TEMPLATE_NAME_MAX  # read here too
from mailbag.domain.templates import Pin, locale_problem, normal_locale, template_name_problem

# Column limits (the seed design's, plus the ones it left open). The schema uses the same names.
ADDRESS_MAX = 255
NAME_MAX = 255
SUBJECT_MAX = 500
ERROR_MAX = 2000
IDEMPOTENCY_KEY_MAX = 255
TENANT_ID_MAX = 100
TAG_MAX = 100
TAGS_MAX = 20
HEADER_NAME_MAX = 100
HEADER_VALUE_MAX = 998  # RFC 5322's line limit
HEADERS_MAX = 50
TEMPLATE_DATA_MAX_BYTES = 64 * 1024

DEFAULT_TENANT = "default"

_HEADER_NAME = re.compile(r"^[!-9;-~]+$")  # RFC 5322 field name: printable ASCII but ':'
# Headers mailbag writes itself; letting a caller set them would break threading or delivery.
RESERVED_HEADERS = frozenset(
    {
        "to",
        "from",
        "subject",
        "message-id",
        "date",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
        "bcc",
        "cc",
        "sender",
        "x-mailbag-message-id",
    }
)


# Custom headers with a structure of their own (addresses, message ids, URLs): the caller
# writes their wire form, which goes out as given, so it must be printable ASCII. Any other
# header is unstructured text, encoded (RFC 2047) when it needs to be.
STRUCTURED_HEADERS = frozenset(
    {
        "reply-to",
        "in-reply-to",
        "references",
        "list-id",
        "list-unsubscribe",
        "list-unsubscribe-post",
        "list-help",
        "list-subscribe",
        "list-post",
        "list-owner",
        "list-archive",
        "auto-submitted",
        "precedence",
        "feedback-id",
    }
)
# The top-level domains reserved for tests and documentation (RFC 2606, RFC 6761).
TEST_DOMAINS = ("test", "example", "invalid", "localhost")
ALLOW_TEST_DOMAINS_SETTING = "MAILBAG_ALLOW_TEST_DOMAINS"


@dataclass(frozen=True)
class AddressRules:
    """Which addresses this deployment can send to: the settings and the provider decide
    (services.intake.address_rules, which every door goes through).

    The default, for callers that know no provider: no test domains, UTF-8 local parts
    allowed (a provider that cannot carry one rejects the send). `provider` only names the
    provider in error texts."""

    allow_test_domains: bool = False
    utf8_local_part: bool = True
    provider: str | None = None


# For looking addresses up (filters, events): refuse nothing a deployment may have sent to.
ANY_ADDRESS = AddressRules(allow_test_domains=True, utf8_local_part=True)


class InvalidMessage(ValueError):
    """A message that must not be written. `errors` maps each field to what is wrong with it."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{name}: {problem}" for name, problem in self.errors.items()))


class MessageTooLarge(InvalidMessage):
    """A message over a size limit (an attachment, a body, the whole): HTTP 413."""


@dataclass(frozen=True)
class NewMessage:
    """A validated, normalized message, ready for the store. Build it with `new_message`.

    Its content is a template (`template_name`, rendered at send time) or ready-made
    (`template_name` None; `subject`, `html` and `text` as they go out)."""

    recipients: Recipients
    template_name: str | None
    template_data: Mapping[str, Any] = field(default_factory=dict)
    from_address: str | None = None
    from_name: str | None = None
    reply_to: tuple[Address, ...] = ()
    subject: str | None = None
    html: str | None = None
    text: str | None = None
    attachments: tuple[Attachment, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: Sequence[str] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    tenant_id: str = DEFAULT_TENANT
    idempotency_key: str | None = None
    send_at: datetime | None = None
    expires_at: datetime | None = None
    priority: Priority = Priority.NORMAL
    unsubscribe_url: str | None = None
    unsubscribe_mailto: str | None = None
    max_attempts: int | None = None
    # Bulk mail (newsletters, announcements: what `mailbag send-bulk` and
    # `POST /v1/messages/batch` send, or `bulk=True` / `"bulk": true` says) as opposed to
    # transactional mail (a verification, a password reset, a receipt: everything else).
    # The one definition: claiming puts transactional mail ahead of bulk mail without
    # starving it (store/fair.py), and whatever else treats bulk mail differently asks this.
    bulk: bool = False
    locale: str | None = None  # BCP 47, canonical case (domain.templates.locale)
    # The template version it renders with, decided when it is written (services.outbox);
    # None until then.
    pin: Pin | None = None

    def pinned_to(self, pin: Pin) -> NewMessage:
        """This message with its template version: `dataclasses.replace` without running
        __init__ for every field again (once per row of a bulk send)."""
        pinned = object.__new__(NewMessage)
        pinned.__dict__.update(self.__dict__, pin=pin)
        return pinned

    @property
    def to_address(self) -> str:
        return self.recipients.to[0].address

    @property
    def to_name(self) -> str | None:
        return self.recipients.to[0].name

    def fields(self) -> dict[str, Any]:
        """The `new_message` arguments that build this message again, so that a message
        made under one set of rules can be checked under another (the deployment's, at
        `mailbag.enqueue_many`). HTML is already inlined and its text part made."""
        return {
            "to": self.recipients.to,
            "cc": self.recipients.cc,
            "bcc": self.recipients.bcc,
            "reply_to": self.reply_to,
            "from_address": self.from_address,
            "from_name": self.from_name,
            "template": self.template_name,
            "data": self.template_data if self.template_name is not None else None,
            "subject": self.subject,
            "html": self.html,
            "text": self.text,
            "attachments": self.attachments,
            "headers": self.headers,
            "tags": self.tags,
            "metadata": self.metadata,
            "tenant_id": self.tenant_id,
            "idempotency_key": self.idempotency_key,
            "send_at": self.send_at,
            "expires_at": self.expires_at,
            "priority": self.priority,
            "unsubscribe_url": self.unsubscribe_url,
            "unsubscribe_mailto": self.unsubscribe_mailto,
            "max_attempts": self.max_attempts,
            "bulk": self.bulk,
            "locale": self.locale,
        }


def truncate_error(error: str | None) -> str | None:
    """last_error keeps at most ERROR_MAX characters; the tail of a long trace is dropped."""
    if error is None or len(error) <= ERROR_MAX:
        return error
    return error[: ERROR_MAX - 1] + "…"


def normalize_address(address: str, rules: AddressRules = AddressRules()) -> str:
    """Syntax check and normalization (domain lowercased, IDNA) without any DNS lookup,
    and refusal of what `rules` say cannot be sent (test domains, a UTF-8 local part)."""
    if (problem := unsafe_text(address, tab=False)) is not None:
        raise EmailNotValidError(problem)
    local, at, domain = address.rpartition("@")
    tld = domain.rpartition(".")[2].lower()
    if at and tld in TEST_DOMAINS and tld != "example":  # .example is an ordinary name
        if not rules.allow_test_domains:
            raise EmailNotValidError(
                f"the domain is a special-use or reserved name (.{tld}); set "
                f"{ALLOW_TEST_DOMAINS_SETTING}=true to send to test domains"
            )
        # email_validator accepts only .test (test_environment): check the address with the
        # reserved name swapped for "test", then put it back.
        checked = validate_email(
            f"{local}@{domain[: len(domain) - len(tld)]}test",
            check_deliverability=False,
            test_environment=True,
        ).normalized
        normalized = checked[: -len("test")] + tld
    else:
        normalized = _plain(local, at, domain) or _validated(address)
    if not rules.utf8_local_part and not normalized.rpartition("@")[0].isascii():
        carrier = f"the configured provider ({rules.provider})" if rules.provider else "it"
        raise EmailNotValidError(
            f"the part before the @-sign is not ASCII, and {carrier} cannot send to such "
            "addresses (they need SMTPUTF8; the smtp provider can)"
        )
    return normalized


def _validated(address: str) -> str:
    return validate_email(address, check_deliverability=False).normalized


def _plain(local: str, at: str, domain: str) -> str | None:
    """The normalized form of a plain address (an ASCII dot-atom of at most 64 characters
    before the @-sign), as email_validator gives it, or None: the library decides the rest.
    A bulk list holds thousands of addresses on a few domains, and the domain is most of
    the library's cost (IDNA, UTS #46): it is checked once per domain."""
    if not at or len(local) > LOCAL_PART_MAX_LENGTH or not DOT_ATOM_TEXT.match(local):
        return None
    if local.lower() in CASE_INSENSITIVE_MAILBOX_NAMES:  # RFC 2142: the library lowercases
        return None
    if (domains := _domain(domain)) is None:
        return None
    normalized, ascii_form = domains
    # The library's length checks: the address as given, normalized and in ASCII.
    longest = max(len(domain.encode()), len(normalized.encode()), len(ascii_form))
    if len(local) + 1 + longest > EMAIL_MAX_LENGTH:
        return None
    return f"{local}@{normalized}"


@functools.lru_cache(maxsize=4096)
def _domain(domain: str) -> tuple[str, str] | None:
    """A domain as email_validator normalizes it and its ASCII form, or None when the
    library refuses it (the whole address then goes through the library for its reason)."""
    try:
        checked = validate_email(f"a@{domain}", check_deliverability=False)
    except EmailNotValidError:
        return None
    return checked.domain, checked.ascii_domain


def ascii_address(address: str) -> str:
    """The address with its domain in ASCII (IDNA 2008, as email_validator normalizes it),
    the form headers and most providers' APIs carry. The local part is left as it is."""
    local, _, domain = address.rpartition("@")
    return f"{local}@{ascii_domain(domain)}"


def ascii_domain(domain: str) -> str:
    if domain.isascii():
        return domain
    try:
        return idna.encode(domain, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise ValueError(f"the domain {domain!r} has no ASCII (IDNA) form: {exc}") from exc


def unsafe_text(value: str, *, tab: bool = True) -> str | None:
    """Why `value` cannot go into a header, or None. Refused: every character that breaks
    a line somewhere (CR, LF, VT, FF, FS, GS, RS, NEL, LS, PS: `str.splitlines`), the other
    C0 and C1 controls and DEL (tab only when `tab` is False), and lone surrogates, which
    no encoding can carry."""
    if value.isprintable():  # the usual case, at C speed: every refused character is not
        return None
    for ch in value:
        if ch == "\t" and tab:
            continue
        category = unicodedata.category(ch)
        if ch in _LINE_BREAKS:
            return f"must not contain a line break (found U+{ord(ch):04X}; header injection)"
        if category == "Cc":
            return f"must not contain control characters (found U+{ord(ch):04X})"
        if category == "Cs":
            return f"must be valid Unicode (found a lone surrogate U+{ord(ch):04X})"
    return None


# Everything str.splitlines() breaks at.
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


AddressInput = str | Address | Mapping[str, Any]


def new_message(
    *,
    to: AddressInput | Sequence[AddressInput],
    template: str | None = None,
    data: Mapping[str, Any] | None = None,
    to_name: str | None = None,
    cc: Sequence[AddressInput] | None = None,
    bcc: Sequence[AddressInput] | None = None,
    reply_to: AddressInput | Sequence[AddressInput] | None = None,
    from_address: str | None = None,
    from_name: str | None = None,
    subject: str | None = None,
    html: str | None = None,
    text: str | None = None,
    inline_css: bool = False,
    attachments: Sequence[Attachment] | None = None,
    headers: Mapping[str, str] | None = None,
    tags: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    tenant_id: str = DEFAULT_TENANT,
    idempotency_key: str | None = None,
    send_at: datetime | None = None,
    expires_at: datetime | None = None,
    priority: Priority | str | int | None = None,
    unsubscribe_url: str | None = None,
    unsubscribe_mailto: str | None = None,
    max_attempts: int | None = None,
    bulk: bool = False,
    locale: str | None = None,
    known_templates: Collection[str] | None = None,
    address_rules: AddressRules = AddressRules(),
    limits: Limits = Limits(),
) -> NewMessage:
    """Validate and normalize every field, reporting all problems at once.

    `to`, `cc`, `bcc` and `reply_to` take addresses as strings, `Address`es or
    {"address", "name"} mappings (`to_name` names a single `to` given as a string). The
    content is a `template` with `data`, or ready-made: `subject` with `html` and/or
    `text` (the text part is generated from the HTML when only HTML is given;
    `inline_css` moves its <style> rules into style attributes first). `address_rules`
    says what the deployment can send to, `limits` how much one message may carry
    (services.intake passes the deployment's). `bulk` marks bulk mail (NewMessage.bulk).
    `locale` (BCP 47) picks the template's locale (domain/templates.py).
    Size problems raise MessageTooLarge."""
    check = _Check(address_rules, limits)
    # Each group of fields has its checks, run in this order (errors name the fields in the
    # order they were found).
    parties = _parties(to, to_name, cc, bcc, reply_to, from_address, from_name, check)
    _check_text("subject", subject, SUBJECT_MAX, check.errors)
    owner = _owner(tenant_id, idempotency_key, check.errors)
    content = _content(
        template, data, subject, html, text, inline_css, attachments, known_templates, check
    )
    unsubscribing = unsubscribe_url is not None or unsubscribe_mailto is not None
    labels = _labels(metadata, headers, tags, bool(parties["reply_to"]), unsubscribing, check)
    delivery = _delivery(
        priority, unsubscribe_url, unsubscribe_mailto, max_attempts, send_at, expires_at, check
    )
    if not isinstance(bulk, bool):
        check.errors["bulk"] = "must be true or false"
    if locale is not None and (problem := locale_problem(locale)) is not None:
        check.errors["locale"] = problem
    check.verdict()
    bulk = bulk or BULK_TAG in labels["tags"]  # a category may say it too (domain/bulk.py)
    return NewMessage(
        **parties,
        **owner,
        **content,
        **labels,
        **delivery,
        bulk=bulk,
        locale=normal_locale(locale) if locale is not None else None,
    )


@dataclass(frozen=True)
class _Check:
    """What the checks of one new message share: the deployment's rules, and the problems
    found so far (size problems apart: they make the error a MessageTooLarge)."""

    rules: AddressRules
    limits: Limits
    errors: dict[str, str] = field(default_factory=dict)
    too_large: dict[str, str] = field(default_factory=dict)

    def verdict(self) -> None:
        """Raise what was found, all of it at once."""
        if self.too_large:
            raise MessageTooLarge({**self.errors, **self.too_large})
        if self.errors:
            raise InvalidMessage(self.errors)


# What each group of checks hands to NewMessage.
class _Parties(TypedDict):
    recipients: Recipients
    reply_to: tuple[Address, ...]
    from_address: str | None
    from_name: str | None


class _Owner(TypedDict):
    tenant_id: str
    idempotency_key: str | None


class _Content(TypedDict):
    template_name: str | None
    template_data: dict[str, Any]
    subject: str | None
    html: str | None
    text: str | None
    attachments: tuple[Attachment, ...]


class _Labels(TypedDict):
    headers: dict[str, str]
    tags: list[str]
    metadata: dict[str, Any]


class _Delivery(TypedDict):
    priority: Priority
    unsubscribe_url: str | None
    unsubscribe_mailto: str | None
    max_attempts: int | None
    send_at: datetime | None
    expires_at: datetime | None


def _check_text(name: str, value: str | None, limit: int, errors: dict[str, str]) -> None:
    """A single-line text: a string, safe in a header, at most `limit` characters."""
    if value is None:
        return
    if not isinstance(value, str):
        errors[name] = "must be a string"
    elif (problem := unsafe_text(value)) is not None:
        errors[name] = problem
    elif len(value) > limit:
        errors[name] = f"is {len(value)} characters; the limit is {limit}"


def _parties(
    to: AddressInput | Sequence[AddressInput],
    to_name: str | None,
    cc: Sequence[AddressInput] | None,
    bcc: Sequence[AddressInput] | None,
    reply_to: AddressInput | Sequence[AddressInput] | None,
    from_address: str | None,
    from_name: str | None,
    check: _Check,
) -> _Parties:
    """Who the message goes to (to, cc, bcc), whom replies go to, and whom it is from."""
    errors, rules, limits = check.errors, check.rules, check.limits
    _check_text("to_name", to_name, NAME_MAX, errors)
    if isinstance(to, str) and to_name and "to_name" not in errors:
        to = Address(to, to_name)
    # Counted before any address is checked: a list of a million is refused at once.
    given = sum(_count(value) for value in (to, cc, bcc))
    if given > limits.max_recipients:
        errors["to"] = (
            f"{given} recipients (to, cc and bcc together); the limit is {limits.max_recipients}"
        )
        recipients = Recipients(to=())
    else:
        recipients = Recipients(
            to=_addresses("to", to, errors, rules, limits, required=True),
            cc=_addresses("cc", cc, errors, rules, limits),
            bcc=_addresses("bcc", bcc, errors, rules, limits),
        )
    replies = _addresses("reply_to", reply_to, errors, rules, limits)
    if limits.max_reply_to is not None and len(replies) > limits.max_reply_to:
        errors["reply_to"] = (
            f"the configured provider ({limits.provider}) takes at most "
            f"{limits.max_reply_to} Reply-To address(es)"
        )
    sender = _address("from", from_address, errors, rules) if from_address is not None else None
    _check_text("from_name", from_name, NAME_MAX, errors)
    return {
        "recipients": recipients,
        "reply_to": replies,
        "from_address": sender,
        "from_name": from_name or None,
    }


def _owner(tenant_id: str, idempotency_key: str | None, errors: dict[str, str]) -> _Owner:
    """Whose message it is, and the key it is known by."""
    _check_text("tenant_id", tenant_id, TENANT_ID_MAX, errors)
    if not tenant_id:
        errors["tenant_id"] = "must not be empty"
    _check_text("idempotency_key", idempotency_key, IDEMPOTENCY_KEY_MAX, errors)
    if idempotency_key is not None and not idempotency_key.strip():
        errors["idempotency_key"] = "must not be blank"
    return {"tenant_id": tenant_id, "idempotency_key": idempotency_key}


def _content(
    template: str | None,
    data: Mapping[str, Any] | None,
    subject: str | None,
    html: str | None,
    text: str | None,
    inline: bool,
    attachments: Sequence[Attachment] | None,
    known_templates: Collection[str] | None,
    check: _Check,
) -> _Content:
    """What the message says: a template with its data, or ready-made bodies; and what it
    carries (attachments), within the message's size limit."""
    errors, too_large, limits = check.errors, check.too_large, check.limits
    ready_made = html is not None or text is not None
    data = _template(template, data, subject, ready_made, inline, known_templates, errors)
    html, text = _body(html, text, inline, errors, too_large)
    files = _attachments(attachments, errors, too_large, limits)
    body_bytes = sum(len(part.encode()) for part in (html or "", text or ""))
    total = body_bytes + sum(a.size for a in files)
    if total > limits.max_message_bytes and not too_large:
        too_large["attachments"] = (
            f"the message carries {total} bytes (bodies and attachments); the limit is "
            f"{limits.max_message_bytes}"
        )
    cid_problem = unresolved_cid(html, files) if html is not None else None
    if cid_problem is not None and "attachments" not in errors:
        errors["html"] = cid_problem
    return {
        "template_name": template,
        "template_data": storable.json_object("data", data, errors, TEMPLATE_DATA_MAX_BYTES),
        "subject": subject,
        "html": html,
        "text": text,
        "attachments": files,
    }


def _template(
    template: str | None,
    data: Mapping[str, Any] | None,
    subject: str | None,
    ready_made: bool,
    inline: bool,
    known_templates: Collection[str] | None,
    errors: dict[str, str],
) -> Mapping[str, Any] | None:
    """A template (a known name) or ready-made content (html, text), never both; the data
    a template has."""
    if template is None and not ready_made:
        errors["template"] = "give a template, or ready-made content (subject with html or text)"
    elif template is not None and ready_made:
        errors["template"] = "give a template or ready-made html/text, not both"
    elif template is not None:
        if (problem := template_name_problem(template)) is not None:
            errors["template"] = problem
        elif known_templates is not None and template not in known_templates:
            errors["template"] = f"unknown template {template!r}"
    elif not subject:
        errors["subject"] = "is required with ready-made html or text"
    if template is not None and data is None:
        data = {}
    if ready_made and data:
        errors["data"] = "is for templates; ready-made content is sent as given"
    if template is not None and inline:
        errors["inline_css"] = "applies to ready-made html only"
    return data


def _labels(
    metadata: Mapping[str, Any] | None,
    headers: Mapping[str, str] | None,
    tags: Sequence[str] | None,
    replying: bool,
    unsubscribing: bool,
    check: _Check,
) -> _Labels:
    """What the message is labelled with: the caller's metadata, extra headers (none that
    a field of its own sets: Reply-To, List-Unsubscribe) and tags."""
    errors = check.errors
    meta = storable.json_object("metadata", metadata, errors, TEMPLATE_DATA_MAX_BYTES)
    clean_headers = _headers(headers or {}, errors)
    for header, given in (("reply-to", replying), ("list-unsubscribe", unsubscribing)):
        if given and any(name.lower() == header for name in clean_headers):
            errors["headers"] = f"{header} is set by its own field here; do not give both"
    return {"headers": clean_headers, "tags": _tags(tags or (), errors), "metadata": meta}


def _delivery(
    priority: Priority | str | int | None,
    unsubscribe_url: str | None,
    unsubscribe_mailto: str | None,
    max_attempts: int | None,
    send_at: datetime | None,
    expires_at: datetime | None,
    check: _Check,
) -> _Delivery:
    """How and when it goes out: its priority, its List-Unsubscribe targets (a one-click
    https:// URL, a mailto: address), how many attempts, from when and until when."""
    errors = check.errors
    level = _priority(priority, errors)
    if unsubscribe_url is not None and (problem := _unsubscribe_url_problem(unsubscribe_url)):
        errors["unsubscribe_url"] = problem
    mailto = (
        _address("unsubscribe_mailto", unsubscribe_mailto, errors, check.rules)
        if unsubscribe_mailto is not None
        else None
    )
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        errors["max_attempts"] = "must be a positive integer"
    for name, moment in (("send_at", send_at), ("expires_at", expires_at)):
        if moment is not None and moment.tzinfo is None:
            errors[name] = "must carry a time zone"
        elif moment is not None and (problem := storable.time_problem(moment)) is not None:
            errors[name] = problem
    # Compared only when both carry a zone: a naive one is refused above, and comparing it
    # with an aware one would raise TypeError.
    zoned = send_at and expires_at and send_at.tzinfo and expires_at.tzinfo
    if zoned and send_at and expires_at and expires_at <= send_at and "send_at" not in errors:
        errors["expires_at"] = "must be after send_at"
    return {
        "priority": level,
        "unsubscribe_url": unsubscribe_url,
        "unsubscribe_mailto": mailto,
        "max_attempts": max_attempts,
        "send_at": send_at,
        "expires_at": expires_at,
    }


def _count(value: object) -> int:
    if value is None or isinstance(value, str | Address | Mapping):
        return 0 if value is None else 1
    return len(value) if isinstance(value, Sequence) else 1


def _addresses(
    name: str,
    value: AddressInput | Sequence[AddressInput] | None,
    errors: dict[str, str],
    rules: AddressRules,
    limits: Limits,
    *,
    required: bool = False,
) -> tuple[Address, ...]:
    """A list of mailboxes, each checked and normalized as a single address is."""
    if value is None or (isinstance(value, Sequence) and not isinstance(value, str) and not value):
        if required:
            errors[name] = "needs at least one address"
        return ()
    items = [value] if isinstance(value, str | Address | Mapping) else list(value)
    found: list[Address] = []
    for item in items:
        address: object
        display: object
        if isinstance(item, Address):
            address, display = item.address, item.name
        elif isinstance(item, Mapping):
            address, display = item.get("address"), item.get("name")
        else:
            address, display = item, None
        if display is not None:
            if not isinstance(display, str) or len(display) > NAME_MAX:
                errors[name] = f"each name is a string of at most {NAME_MAX} characters"
                return ()
            if (problem := unsafe_text(display)) is not None:
                errors[name] = f"the name of {address!r} {problem}"
                return ()
            if limits.max_name_length is not None and len(display) > limits.max_name_length:
                errors[name] = (
                    f"the name of {address!r} is {len(display)} characters; the configured "
                    f"provider ({limits.provider}) takes at most {limits.max_name_length}"
                )
                return ()
        normalized = _address(name, address, errors, rules)
        if name in errors:
            return ()
        found.append(Address(normalized, display if isinstance(display, str) and display else None))
    return tuple(found)


def _body(
    html: str | None,
    text: str | None,
    inline: bool,
    errors: dict[str, str],
    too_large: dict[str, str],
) -> tuple[str | None, str | None]:
    for name, value in (("html", html), ("text", text)):
        if value is None:
            continue
        if not isinstance(value, str):
            errors[name] = "must be a string"
        elif any(unicodedata.category(ch) == "Cs" for ch in value):
            errors[name] = "must be valid Unicode (found a lone surrogate)"
        elif "\x00" in value:
            errors[name] = "must not contain NUL characters"
        elif len(value.encode()) > BODY_MAX_BYTES:
            too_large[name] = f"is larger than {BODY_MAX_BYTES} bytes"
        elif not value.strip():
            errors[name] = "must not be blank"
    if errors.keys() & {"html", "text"} or too_large:
        return html, text
    if html is not None:
        if inline:
            html = inline_css(html)
        if text is None:
            text = text_from_html(html)
    return html, text


def _attachments(
    attachments: Sequence[Attachment] | None,
    errors: dict[str, str],
    too_large: dict[str, str],
    limits: Limits,
) -> tuple[Attachment, ...]:
    if not attachments:
        return ()
    if len(attachments) > limits.max_attachments:
        errors["attachments"] = f"at most {limits.max_attachments} attachments"
        return ()
    content_ids: set[str] = set()
    for index, item in enumerate(attachments):
        where = f"attachments[{index}]"
        if not isinstance(item, Attachment):
            errors["attachments"] = f"{where} is not an Attachment"
            return ()
        if (
            not item.filename
            or len(item.filename) > FILENAME_MAX
            or (problem := unsafe_text(item.filename, tab=False)) is not None
            or "/" in item.filename
            or "\\" in item.filename
        ):
            errors["attachments"] = (
                f"{where}.filename must be 1 to {FILENAME_MAX} characters, with no path "
                "separator and no control characters"
            )
            return ()
        if (problem := limits.extension_problem(item.filename)) is not None:
            errors["attachments"] = f"{where}.filename {problem}"
            return ()
        if (problem := content_type_problem(item.content_type)) is not None:
            errors["attachments"] = f"{where}.content_type {problem}"
            return ()
        if item.content_id is not None:
            if (problem := content_id_problem(item.content_id)) is not None:
                errors["attachments"] = f"{where}.content_id {problem}"
                return ()
            if item.content_id in content_ids:
                errors["attachments"] = f"{where}.content_id {item.content_id!r} is used twice"
                return ()
            content_ids.add(item.content_id)
        if item.size > limits.max_attachment_bytes:
            too_large["attachments"] = (
                f"{where} ({item.filename!r}) is {item.size} bytes; the limit for one "
                f"attachment is {limits.max_attachment_bytes}"
            )
            return ()
    return tuple(attachments)


def _priority(value: Priority | str | int | None, errors: dict[str, str]) -> Priority:
    if value is None:
        return Priority.NORMAL
    try:
        return Priority.named(value) if isinstance(value, str) else Priority(value)
    except (KeyError, ValueError):
        errors["priority"] = "must be high, normal or low"
        return Priority.NORMAL


def _unsubscribe_url_problem(url: object) -> str | None:
    # RFC 8058: the one-click URI must be HTTPS; it goes into a header inside <...>.
    if not isinstance(url, str):
        return "must be a string"
    if not url.startswith("https://") or len(url) <= len("https://"):
        return "must be an https:// URL (RFC 8058)"
    if len(url) > UNSUBSCRIBE_URL_MAX:
        return f"is longer than {UNSUBSCRIBE_URL_MAX} characters"
    if not url.isascii() or any(ch in url for ch in ' <>"\t') or unsafe_text(url) is not None:
        return "must be printable ASCII without spaces, quotes or angle brackets (percent-encode)"
    return None


def _address(name: str, value: object, errors: dict[str, str], rules: AddressRules) -> str:
    if not isinstance(value, str):
        errors[name] = "must be a string"
        return ""
    if (problem := unsafe_text(value, tab=False)) is not None:
        errors[name] = problem
        return ""
    if len(value) > ADDRESS_MAX:
        errors[name] = f"is longer than {ADDRESS_MAX} characters"
        return ""
    try:
        return normalize_address(value, rules)
    except EmailNotValidError as exc:
        errors[name] = f"is not a valid email address: {exc}"
        return ""


def _headers(headers: Mapping[str, str], errors: dict[str, str]) -> dict[str, str]:
    if not isinstance(headers, Mapping):
        errors["headers"] = "must be an object of header names to values"
        return {}
    if len(headers) > HEADERS_MAX:
        errors["headers"] = f"at most {HEADERS_MAX} headers"
        return {}
    clean: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not _HEADER_NAME.match(key) or len(key) > HEADER_NAME_MAX:
            errors["headers"] = f"invalid header name {key!r}"
        elif key.lower() in RESERVED_HEADERS:
            errors["headers"] = f"header {key!r} is set by mailbag"
        elif not isinstance(value, str):
            errors["headers"] = f"header {key!r} must have a string value"
        elif (problem := unsafe_text(value)) is not None:
            errors["headers"] = f"header {key!r} {problem}"
        elif key.lower() in STRUCTURED_HEADERS and not value.isascii():
            errors["headers"] = (
                f"header {key!r} is structured: give its ASCII wire form (RFC 2047 words "
                "for non-ASCII names, IDNA for domains)"
            )
        elif len(value) > HEADER_VALUE_MAX:
            errors["headers"] = f"header {key!r} is longer than {HEADER_VALUE_MAX} characters"
        else:
            clean[key] = value
    return clean


def _tags(tags: Sequence[str], errors: dict[str, str]) -> list[str]:
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        errors["tags"] = "must be a list of strings"
        return []
    if len(tags) > TAGS_MAX:
        errors["tags"] = f"at most {TAGS_MAX} tags"
        return []
    for tag in tags:
        if (
            not isinstance(tag, str)
            or not tag
            or len(tag) > TAG_MAX
            or unsafe_text(tag, tab=False) is not None
        ):
            errors["tags"] = f"each tag is 1 to {TAG_MAX} characters, no control characters"
            return []
    return list(dict.fromkeys(tags))


@dataclass(frozen=True)
class Message:
    """A message as the store holds it (every column of outbox_messages)."""

    id: Any  # uuid.UUID
    tenant_id: str
    idempotency_key: str | None
    to_address: str
    to_name: str | None
    from_address: str | None
    subject: str | None
    template_name: str | None  # None: ready-made content (html, text)
    template_data: Mapping[str, Any]
    headers: Mapping[str, str]
    tags: Sequence[str]
    metadata: Mapping[str, Any]
    status: str
    attempt_count: int
    max_attempts: int
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime
    claim_token: Any | None
    claimed_by: str | None
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    provider: str | None
    provider_message_id: str | None
    last_error: str | None
    sent_at: datetime | None
    ambiguous_since: datetime | None
    # Added with what a message can carry (migration 0006): columns first, in order,
    expires_at: datetime | None = None
    priority: int = Priority.NORMAL
    claim_order_at: datetime | None = None
    attachment_count: int = 0
    bulk: bool = False  # NewMessage.bulk (migration 0019)
    # domain.templates.Pin (migration 0021): the version's id, its number, its locale
    template_version_id: int | None = None
    template_version: int | None = None
    template_locale: str | None = None
    # then what the `carried` JSON column holds (store.message_transitions unpacks it),
    from_name: str | None = None
    recipients: Recipients | None = None  # None: to_address alone (see `all_recipients`)
    reply_to: tuple[Address, ...] = ()
    html: str | None = None
    text: str | None = None
    unsubscribe_url: str | None = None
    unsubscribe_mailto: str | None = None
    suppressed: tuple[str, ...] = ()  # recipients dropped at enqueue: on the suppression list
    locale: str | None = None  # the locale it asked for (BCP 47)
    # and the attachments' references, read from message_attachments when asked for.
    attachments: tuple[AttachmentRef, ...] = ()

    @property
    def all_recipients(self) -> Recipients:
        return self.recipients or Recipients(to=(Address(self.to_address, self.to_name),))

    @property
    def ready_made(self) -> bool:
        return self.template_name is None

    @property
    def attempt(self) -> int:
        """The number of the attempt a claimed message is on (attempts count when finalized)."""
        return self.attempt_count + 1


@dataclass(frozen=True)
class Filter:
    """Which messages are meant (every field optional; all given ones must hold): by id, or
    by what an operator filters on. Plain data: the store turns it into SQL."""

    status: Status | None = None
    tenant_id: str | None = None
    to: str | None = None  # compared in lower case
    template: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None  # exclusive
    ids: Sequence[Any] | None = None  # uuid.UUIDs
