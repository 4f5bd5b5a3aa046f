"""The provider kit: what every provider shares, tested without I/O, and each provider's
table checked to speak only the domain's outcome classes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest

from mailbag import providers
from mailbag.domain.delivery import Accepted, Ambiguous, Deferred, Disabled, Rejected, SendOutcome
from mailbag.providers import brevo, http_api, postmark, resend, ses, smtp
from mailbag.providers.base import Capabilities
from mailbag.providers.file import FileProvider
from mailbag.providers.kit import (
    ERROR_TEXT_MAX,
    REDACTED,
    OutcomeTable,
    UnsupportedFeature,
    ascii_envelope_address,
    describe,
    envelope_address,
    failure_outcome,
    first_match,
    retry_after,
    scrub,
    unsupported_feature,
)
from mailbag.services.intake import address_rules
from mailbag.settings import Settings

from helpers import outgoing_email

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a request that left would be Deferred

# --- describe --------------------------------------------------------------------------------


def test_describe_is_the_class_and_the_first_line_of_the_message() -> None:
    assert describe(ConnectionResetError("reset  by\tpeer\nsecond line")) == (
        "ConnectionResetError: reset by peer"
    )
    assert describe(TimeoutError()) == "TimeoutError"
    assert describe(ValueError("  \n")) == "ValueError"
    assert len(describe(RuntimeError("x" * 5000))) == ERROR_TEXT_MAX


# --- scrub -----------------------------------------------------------------------------------


def test_scrub_replaces_every_secret_given_and_credentials_in_urls() -> None:
    text = "auth key-123 failed for https://user:pw@relay.example/x (key-123, c2VjcmV0)"

    scrubbed = scrub(text, "key-123", None, "", "c2VjcmV0")

    assert scrubbed == (
        f"auth {REDACTED} failed for https://[credentials]@relay.example/x ({REDACTED}, {REDACTED})"
    )


def test_scrub_applies_patterns_and_caps_after_replacing() -> None:
    key_id = re.compile(r"AKIA[A-Z0-9]{16}")
    # A secret straddling the cap would leave its first half if the cap came first.
    text = "x" * (ERROR_TEXT_MAX - 5) + "AKIAIOSFODNN7EXAMPLE"

    scrubbed = scrub(text, patterns=[(key_id, "[key]")])

    assert "AKIA" not in scrubbed and len(scrubbed) == ERROR_TEXT_MAX
    assert scrub("AKIAIOSFODNN7EXAMPLE", patterns=[(key_id, "[key]")]) == "[key]"


# --- retry_after -----------------------------------------------------------------------------

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("42", timedelta(seconds=42)),
        (" 7 ", timedelta(seconds=7)),
        ("1.5", timedelta(seconds=1.5)),  # rate-limit-reset headers send fractions
        ("0", timedelta(0)),
        (format_datetime(NOW + timedelta(minutes=2), usegmt=True), timedelta(minutes=2)),
        (format_datetime(NOW - timedelta(minutes=2), usegmt=True), None),  # already past
        ("-3", None),
        ("soon", None),
        ("", None),
        ("nan", None),
        ("inf", None),
        ("1e300", None),
    ],
)
def test_retry_after_reads_seconds_or_an_http_date(value: str, expected: timedelta | None) -> None:
    assert retry_after({"retry-after": value}, now=NOW) == expected


def test_retry_after_takes_the_first_header_with_a_usable_value() -> None:
    names = ("x-sib-ratelimit-reset", "retry-after")
    both = httpx.Headers({"X-Sib-RateLimit-Reset": "0", "Retry-After": "30"})
    only_standard = httpx.Headers({"Retry-After": "30"})
    unusable_first = httpx.Headers({"x-sib-ratelimit-reset": "later", "retry-after": "30"})

    assert retry_after(both, names) == timedelta(0)  # a zero hint is still the hint
    assert retry_after(only_standard, names) == timedelta(seconds=30)
    assert retry_after(unusable_first, names) == timedelta(seconds=30)
    assert retry_after(httpx.Headers(), names) is None


# --- unsupported features --------------------------------------------------------------------


def test_an_unsupported_feature_is_a_value_error_naming_the_provider_and_the_feature() -> None:
    with pytest.raises(UnsupportedFeature) as raised:
        unsupported_feature("postmark", "an AMP body")

    assert isinstance(raised.value, ValueError)
    assert (raised.value.provider, raised.value.feature) == ("postmark", "an AMP body")
    assert str(raised.value) == "the postmark provider cannot send an AMP body"


def test_envelope_addresses_get_an_ascii_domain_and_say_when_they_need_smtputf8() -> None:
    assert envelope_address("a@bücher.example") == ("a@xn--bcher-kva.example", False)
    assert envelope_address("zoë@example.com") == ("zoë@example.com", True)
    assert ascii_envelope_address("ses", "a@bücher.example") == "a@xn--bcher-kva.example"
    with pytest.raises(UnsupportedFeature, match="non-ASCII local part"):
        ascii_envelope_address("ses", "zoë@example.com")
    with pytest.raises(ValueError, match="not an email address"):
        envelope_address("nobody")


async def test_brevo_and_ses_refuse_what_they_cannot_carry_without_a_request() -> None:
    sent = outgoing_email(1, to_email="zoë@example.com")
    senders: list[Any] = [
        brevo.BrevoProvider(api_key="xkeysib-test", base_url=NOWHERE),
        ses.SESProvider(region="us-east-1", endpoint_url=NOWHERE),
    ]
    for provider in senders:
        try:
            outcome = await provider.send(sent)
        finally:
            await provider.aclose()
        # Refused while building: a request that had left would be Deferred (nothing listens).
        assert isinstance(outcome, Rejected), (provider.name, outcome)
        assert f"the {provider.name} provider cannot send" in outcome.error


@pytest.mark.parametrize("role", ["cc", "bcc", "reply_to"])
async def test_ses_refuses_a_non_ascii_local_part_in_any_role_without_a_request(role: str) -> None:
    from mailbag.domain.content import Address, Recipients

    someone = (Address("zoë@example.com"),)
    if role == "reply_to":
        sent = outgoing_email(1, reply_to=someone)
    else:
        to = (Address("ann@example.com"),)
        sent = outgoing_email(1, recipients=Recipients(to=to, **{role: someone}))
    provider = ses.SESProvider(region="us-east-1", endpoint_url=NOWHERE)
    try:
        outcome = await provider.send(sent)
    finally:
        await provider.aclose()
    # Refused while building: a request that had left would be Deferred (nothing listens).
    assert isinstance(outcome, Rejected), outcome
    assert "zoë@example.com" in outcome.error


async def test_every_provider_turns_a_feature_refused_while_building_into_rejected(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The hook for the next message feature: refusing it while the request is built is a
    Rejected outcome in every provider, and nothing is sent."""

    def refuse(*_: object) -> Any:
        unsupported_feature("any", "the next feature")

    monkeypatch.setattr(smtp.Envelope, "of", refuse)
    monkeypatch.setattr(FileProvider, "_write", refuse)
    monkeypatch.setattr(ses.SESProvider, "_request", refuse)
    monkeypatch.setattr(brevo, "single_payload", refuse)
    senders: list[Any] = [
        smtp.SMTPProvider(host="127.0.0.1", port=9),
        FileProvider(tmp_path),
        ses.SESProvider(region="us-east-1", endpoint_url=NOWHERE),
        brevo.BrevoProvider(api_key="xkeysib-test", base_url=NOWHERE),
    ]
    for provider in senders:
        try:
            outcome = await provider.send(outgoing_email(2))
        finally:
            await provider.aclose()
        assert isinstance(outcome, Rejected), (provider.name, outcome)
        assert "the any provider cannot send the next feature" in outcome.error
    assert list(tmp_path.iterdir()) == []


# --- outcome tables --------------------------------------------------------------------------

OUTCOME_CLASSES = set(get_args(SendOutcome))


def test_every_providers_table_names_only_domain_outcome_classes() -> None:
    smtp_classes = {cls for row in smtp.OUTCOME_TABLE.values() for cls in row}
    tables: list[OutcomeTable] = [
        brevo.RESPONSE_TABLE,
        http_api.TRANSPORT_TABLE,
        ses.ERROR_OUTCOMES,
        postmark.RESPONSE_TABLE,
        tuple(postmark.ERROR_CODES.items()),
        resend.RESPONSE_TABLE,
    ]
    row_classes = {cls for table in tables for _key, cls in table}

    assert smtp_classes | row_classes <= OUTCOME_CLASSES
    assert {Deferred, Rejected, Ambiguous, Disabled} <= smtp_classes
    assert Accepted in row_classes  # Brevo's 2xx


def test_first_match_takes_the_first_row_that_matches_and_ambiguous_otherwise() -> None:
    table: OutcomeTable = (
        ("Throttling", Deferred),
        (409, Disabled),
        (range(400, 500), Rejected),
        (ConnectionError, Deferred),
        (OSError, Disabled),
    )

    assert first_match(table, code="Throttling", status=400) is Deferred
    assert first_match(table, code="Other", status=409) is Disabled
    assert first_match(table, status=404) is Rejected
    assert first_match(table, error=ConnectionResetError()) is Deferred
    assert first_match(table, error=FileNotFoundError()) is Disabled
    assert first_match(table, status=503, error=ValueError()) is Ambiguous
    assert first_match((), status=200) is Ambiguous


def test_failure_builds_the_outcome_a_row_names() -> None:
    hint = timedelta(seconds=9)

    # A table's Deferred is the provider's own failure (nothing judged the message) unless
    # the provider says it was about the message (SMTP's 4xx to a recipient).
    assert failure_outcome(Deferred, "e", keyed=True, retry_after=hint) == Deferred(
        "e", retry_after=hint, provider_fault=True
    )
    assert failure_outcome(Deferred, "e", keyed=True, provider_fault=False) == Deferred("e")
    assert failure_outcome(Ambiguous, "e", keyed=False, retry_after=hint) == Ambiguous(
        "e", keyed=False
    )
    assert failure_outcome(Rejected, "e", keyed=True, retry_after=hint) == Rejected("e")
    assert failure_outcome(Disabled, "e", keyed=True) == Disabled("e")
    with pytest.raises(TypeError):
        failure_outcome(Accepted, "e", keyed=True)  # an acceptance needs the provider's id


# --- construction ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(providers.BUILTIN))
async def test_the_registry_builds_each_builtin_provider_through_from_settings(
    name: str, tmp_path: Path
) -> None:
    settings = Settings(provider=name, file_dir=tmp_path)
    factory = providers.factory_for(name)

    provider = providers.create(name, settings)
    try:
        cls = type(provider)
        assert factory == cls.from_settings  # type: ignore[attr-defined]
        assert provider.name == name
        # Enqueue's address rules read the class's declaration without building a provider.
        assert isinstance(cls.capabilities, Capabilities)
        utf8 = cls.capabilities.utf8_local_part
        assert address_rules(settings).utf8_local_part is utf8
    finally:
        await provider.aclose()
