"""The pure core: transition table, retry policy, validation. No database here."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mailbag.domain import states
from mailbag.domain.ids import uuid7
from mailbag.domain.message import (
    ANY_ADDRESS,
    ERROR_MAX,
    AddressRules,
    InvalidMessage,
    ascii_address,
    new_message,
    normalize_address,
    truncate_error,
    unsafe_text,
)
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import CLAIMABLE, TERMINAL, Action, Status


def test_every_state_is_reachable_from_creation():
    reached, frontier = set(), {None}
    while frontier:
        nxt = {t.target for t in states.TRANSITIONS if t.source in frontier} - reached
        reached |= nxt
        frontier = nxt
    assert reached == set(Status)


def test_terminal_states_have_no_way_out_but_an_operator_requeue():
    for transition in states.TRANSITIONS:
        if transition.source in TERMINAL:
            assert transition.action is Action.REQUEUE and transition.source is Status.DEAD


def test_unknown_leaves_only_by_evidence_or_an_operator():
    leaving = {
        t.action
        for t in states.TRANSITIONS
        if t.source is Status.UNKNOWN and t.target is not Status.UNKNOWN
    }
    assert leaving == {Action.REQUEUE, Action.RESOLVE_SENT, Action.RESOLVE_FAILED}
    assert states.is_allowed(Status.UNKNOWN, Action.FLAG, Status.UNKNOWN)  # stays, flagged


def test_only_pending_and_retrying_are_claimable():
    assert states.sources(Action.CLAIM) == CLAIMABLE == {Status.PENDING, Status.RETRYING}


def test_every_finalize_starts_from_processing():
    for action in (
        Action.MARK_SENT,
        Action.RETRY,
        Action.FAIL,
        Action.BURY,
        Action.MARK_UNKNOWN,
        Action.RELEASE,
        Action.EXPIRE,
    ):
        assert states.sources(action) == {Status.PROCESSING}


def test_release_returns_to_where_the_message_came_from():
    assert states.MESSAGES.target_for(Action.RELEASE, {"attempt_count": 0}) is Status.PENDING
    assert states.MESSAGES.target_for(Action.RELEASE, {"attempt_count": 2}) is Status.RETRYING
    assert states.targets(Action.RELEASE) == {Status.PENDING, Status.RETRYING}


def test_backoff_grows_five_fold_from_five_minutes_and_is_capped():
    policy = RetryPolicy()
    assert [policy.ceiling(n) for n in (1, 2, 3)] == [
        timedelta(minutes=5),
        timedelta(minutes=25),
        timedelta(minutes=125),
    ]
    assert policy.ceiling(50) == policy.cap == timedelta(hours=6)


@given(st.integers(min_value=1, max_value=200), st.integers(min_value=0, max_value=2**32))
def test_full_jitter_stays_between_zero_and_the_ceiling(attempts, seed):
    policy = RetryPolicy()
    delay = policy.delay(attempts, random.Random(seed))
    assert timedelta(0) <= delay <= policy.ceiling(attempts)


def test_jitter_spreads_a_herd():
    policy = RetryPolicy()
    rng = random.Random(7)
    delays = {policy.delay(1, rng) for _ in range(100)}
    assert len(delays) > 90


def test_the_attempt_budget_ends_in_the_dead_letter():
    policy = RetryPolicy(max_attempts=3)
    assert [policy.after_transient_failure(n) for n in (1, 2, 3)] == [
        Action.RETRY,
        Action.RETRY,
        Action.BURY,
    ]
    assert policy.after_transient_failure(3, max_attempts=4) is Action.RETRY


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base=timedelta(0))


def test_a_valid_message_is_normalized():
    m = new_message(to="Ada@EXAMPLE.COM", template="welcome", data={"n": 1}, tags=["x", "x"])
    assert m.to_address == "Ada@example.com"
    assert list(m.tags) == ["x"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"to": "x@y\r\nBcc: z@w"}, "to"),
        ({"to": "not-an-address"}, "to"),
        ({"to": "a@" + "b" * 300 + ".com"}, "to"),
        ({"subject": "s" * 501}, "subject"),
        ({"subject": "hi\nBcc: evil@example.com"}, "subject"),
        ({"to_name": "Ada\r\nBcc: x@y"}, "to_name"),
        ({"from_address": "x@y\nz"}, "from"),
        ({"headers": {"X-A": "v\r\nBcc: x@y"}}, "headers"),
        ({"headers": {"Bad Name": "v"}}, "headers"),
        ({"headers": {"Subject": "override"}}, "headers"),
        ({"tags": ["ok", "bad\ntag"]}, "tags"),
        ({"data": {"when": datetime.now(UTC)}}, "data"),
        ({"data": {"x": float("nan")}}, "data"),
        ({"data": ["not", "an", "object"]}, "data"),
        ({"template": "Welcome!"}, "template"),
        ({"template": "t" * 101}, "template"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
        ({"send_at": datetime(2026, 1, 1)}, "send_at"),
    ],
)
def test_invalid_fields_are_rejected_with_the_field_named(fields, field):
    base = {"to": "a@example.com", "template": "welcome"}
    with pytest.raises(InvalidMessage) as excinfo:
        new_message(**{**base, **fields})
    assert field in excinfo.value.errors


def test_unknown_templates_are_rejected_when_the_catalog_is_known():
    with pytest.raises(InvalidMessage, match="unknown template"):
        new_message(to="a@example.com", template="nope", known_templates={"welcome"})
    assert new_message(to="a@example.com", template="nope").template_name == "nope"


def test_all_problems_are_reported_at_once():
    with pytest.raises(InvalidMessage) as excinfo:
        new_message(to="bad", template="Bad!", subject="x" * 600)
    assert set(excinfo.value.errors) == {"to", "template", "subject"}


def test_errors_are_truncated_to_the_column_limit():
    assert truncate_error("e" * 5000) is not None
    assert len(truncate_error("e" * 5000) or "") == ERROR_MAX
    assert truncate_error("short") == "short"


def test_ids_are_time_ordered_and_unique():
    ids = [uuid7() for _ in range(10_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.version == 7 for i in ids)


# --- what a header may hold, and who may be written to ---------------------------------


def test_every_character_that_breaks_a_line_is_refused_in_header_text():
    breakers = {ch for ch in map(chr, range(0x110000)) if len(f"a{ch}b".splitlines()) > 1}
    assert breakers == set("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
    for ch in breakers:
        assert "line break" in (unsafe_text(f"a{ch}b") or "")
    for ch in ["\x00", "\x07", "\x1b", "\x7f", "\x9b", "\ud800"]:
        assert unsafe_text(f"a{ch}b") is not None
    assert unsafe_text("tab\tand =?utf-8?q?words?= Zoë 東京") is None
    assert unsafe_text("tab\t", tab=False) is not None


@pytest.mark.parametrize("field", ["subject", "to_name", "headers", "tags"])
@pytest.mark.parametrize("char", ["\v", "\f", "\x1c", "\x85", "\u2028", "\x00", "\ud800"])
def test_new_message_refuses_them_in_every_text_field(field, char):
    value = f"a{char}b"
    fields = {
        "subject": {"subject": value},
        "to_name": {"to_name": value},
        "headers": {"headers": {"X-Note": value}},
        "tags": {"tags": [value]},
    }[field]
    with pytest.raises(InvalidMessage) as caught:
        new_message(to="a@example.com", template="welcome", **fields)
    assert field in caught.value.errors


def test_test_domains_follow_the_rules_and_name_the_setting():
    strict, lenient = AddressRules(), AddressRules(allow_test_domains=True)
    for address in ("reader@example.test", "a@b.invalid", "a@localhost", "a@app.localhost"):
        with pytest.raises(ValueError, match="MAILBAG_ALLOW_TEST_DOMAINS"):
            normalize_address(address, strict)
        assert normalize_address(address, lenient) == address
    assert normalize_address("Reader@Example.TEST", lenient) == "Reader@example.test"
    assert normalize_address("a@example.com", strict) == "a@example.com"
    assert normalize_address("a@shop.example", strict) == "a@shop.example"  # not special-use
    with pytest.raises(ValueError):
        normalize_address("a@x.test.", lenient)  # a trailing dot is no test domain


def test_a_utf8_local_part_is_refused_only_where_the_provider_cannot_carry_it():
    assert normalize_address("zoë@example.com", AddressRules()) == "zoë@example.com"
    ses = AddressRules(utf8_local_part=False, provider="ses")
    with pytest.raises(ValueError, match=r"\(ses\) cannot send"):
        normalize_address("zoë@example.com", ses)
    assert normalize_address("user@bücher.example", ses) == "user@bücher.example"
    assert normalize_address("zoë@x.test", ANY_ADDRESS) == "zoë@x.test"


def test_ascii_addresses_use_idna_2008_as_the_validator_does():
    assert ascii_address("u@bücher.example") == "u@xn--bcher-kva.example"
    assert ascii_address("u@straße.de") == "u@xn--strae-oqa.de"  # IDNA 2003 said strasse.de
    assert ascii_address("zoë@example.com") == "zoë@example.com"


# Pieces an address is made of, many of them at an edge of email_validator's rules: the
# per-domain path (domain/message.py `_plain`) must take none the library would not.
_LOCAL_PIECES = st.sampled_from(
    [
        *("a", "Z9", "x" * 64, "x" * 65, ".", "..", "+tag", "o'neil", '"q"', "zoë", " "),
        *("a b", "@", "-"),
        *("News", "POSTMASTER", "Info"),  # RFC 2142 names, which the library lowercases
    ]
)
_DOMAIN_PIECES = st.sampled_from(
    [
        "example.com",
        "EXAMPLE.com",
        "bücher.example",
        "xn--bcher-kva.example",
        "ex_ample.com",
        "-bad.com",
        "com",
        "a." * 60 + "com",
        "b." * 95 + "com",  # with 64 characters before the @-sign, over 254 in all
        "[127.0.0.1]",
        "example.com.",
        "exa mple.com",
        "example.com>",
        "ｅxample.com",
        "x" * 64 + ".com",
        "straße.de",
    ]
)


@given(
    st.lists(_LOCAL_PIECES, min_size=0, max_size=3).map("".join),
    st.lists(_DOMAIN_PIECES, min_size=1, max_size=2).map(".".join),
)
@example("x" * 64, "b." * 95 + "com")  # every part valid, the whole too long
@example("a", "xn--bcher-kva.example")  # normalized to Unicode
@example("a", "EXAMPLE.com")
@example("News", "Acme.Example")  # lowercased whole: news@acme.example
def test_an_address_checked_per_domain_is_what_the_library_makes_of_it(local, domain):
    from email_validator import validate_email

    address = f"{local}@{domain}"
    try:
        expected: str | Exception = validate_email(address, check_deliverability=False).normalized
    except ValueError as exc:
        expected = exc
    try:
        got: str | Exception = normalize_address(address, ANY_ADDRESS)
    except ValueError as exc:
        got = exc
    if isinstance(expected, Exception):
        assert isinstance(got, Exception), (address, got)
    else:
        assert got == expected, address
