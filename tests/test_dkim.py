"""Sender domains' rules without a database: which names and selectors are domains and
selectors, keys made and imported (and key files refused), signatures that dkimpy's own
verifier accepts against the published record and refuses once a byte changes, and how
each DNS answer is judged: ok, missing, wrong with the fix, or unchecked."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

import dkim as dkimpy
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from mailbag.compose import OutgoingEmail
from mailbag.domain import dkim
from mailbag.domain import sender_domains as rules
from mailbag.domain.content import Address, Recipients
from mailbag.domain.dkim import Algorithm, InvalidDomain, SigningKey
from mailbag.domain.sender_domains import Purpose, State, Unanswered


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("example.com", "example.com"),
        ("  Mail.Example.COM. ", "mail.example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("a-b.c-d.example", "a-b.c-d.example"),
    ],
)
def test_a_sender_domain_is_kept_in_its_canonical_form(given: str, canonical: str) -> None:
    assert dkim.sender_domain(given) == canonical


@pytest.mark.parametrize(
    "given",
    [
        "",
        "localhost",
        "example..com",
        "-example.com",
        "example-.com",
        "exa mple.com",
        "ada@example.com",
        "1.2.3.4",
        "example.com\nX-Evil: 1",
        "_dmarc.example.com",
        ("a" * 64) + ".com",
        ".".join(["abcdefghij"] * 26),  # 285 characters
    ],
)
def test_what_is_not_a_domain_name_is_refused_without_being_echoed_whole(given: str) -> None:
    with pytest.raises(InvalidDomain) as caught:
        dkim.sender_domain(given)
    assert str(caught.value).startswith("domain:")
    assert "\n" not in str(caught.value).replace("\\n", "")


@pytest.mark.parametrize("given", ["", "a.b", "two words", "s1;", "-s", "s" * 64, "sé"])
def test_a_selector_is_one_dns_label(given: str) -> None:
    with pytest.raises(InvalidDomain, match="selector"):
        dkim.selector(given)
    assert dkim.selector(" MB2026-12 ") == "mb2026-12"


def _pem(key: object) -> bytes:
    return key.private_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def test_key_files_that_do_not_parse_or_cannot_sign_are_refused() -> None:
    refused = [
        b"",
        b"not a key",
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        _pem(ec.generate_private_key(ec.SECP256R1())),  # DKIM has no ECDSA
        rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass"),  # encrypted: no passphrase here
        ),
        b"x" * 20_000,
    ]
    for text in refused:
        with pytest.raises(InvalidDomain, match=r"^key:") as caught:
            dkim.imported(text)
        assert "AAAA" not in str(caught.value)


def test_an_imported_key_publishes_its_own_public_half() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pair = dkim.imported(_pem(key))
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert pair.algorithm is Algorithm.RSA and pair.public == base64.b64encode(der).decode()
    edkey = ed25519.Ed25519PrivateKey.generate()
    raw = edkey.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert dkim.imported(_pem(edkey)).record == (
        f"v=DKIM1; k=ed25519; p={base64.b64encode(raw).decode()}"
    )


def _email(**overrides: object) -> OutgoingEmail:
    fields: dict[str, object] = {
        "message_id": uuid.UUID(int=7),
        "attempt": 1,
        "tenant_id": "default",
        "from_email": "billing@example.com",
        "from_name": "Billing",
        "recipients": Recipients(to=(Address("ada@example.org", "Ada"),)),
        "subject": "Your invoice ünïcode",
        "html": "<p>Hello</p>",
        "text": "Hello",
        "rfc_message_id": "<7@example.com>",
        "date": datetime(2026, 12, 2, tzinfo=UTC),
        "unsubscribe_url": "https://example.com/u/1",
    }
    fields.update(overrides)
    return OutgoingEmail(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_a_signed_email_verifies_against_its_record_and_fails_once_changed(
    algorithm: Algorithm,
) -> None:
    pair = dkim.generate(algorithm)
    key = SigningKey("example.com", "s1", algorithm, pair.private)
    looked_up: list[bytes] = []

    def dns(name: bytes, timeout: int = 5) -> bytes:
        looked_up.append(name)
        return pair.record.encode()

    raw = _email(dkim=key).raw
    assert raw.startswith(b"DKIM-Signature: ")
    assert raw.endswith(_email().raw)  # the signature is added in front, nothing else
    assert dkimpy.verify(raw, dnsfunc=dns)
    assert looked_up == [b"s1._domainkey.example.com."]
    signature = raw.split(b"\r\n\r\n", 1)[0].decode()
    for header in ("from", "to", "subject", "date", "message-id", "list-unsubscribe"):
        assert header in signature.split("h=", 1)[1].split(";", 1)[0].replace(" ", "")
    tampered = raw.replace(b"Hello", b"Hellp", 1)
    assert not dkimpy.verify(tampered, dnsfunc=dns)
    other = dkim.generate(algorithm)
    assert not dkimpy.verify(raw, dnsfunc=lambda name, timeout=5: other.record.encode())


def test_the_key_for_a_from_is_its_tenants_then_the_deployments() -> None:
    own, deployment = (SigningKey("example.com", s, Algorithm.RSA) for s in ("own", "dep"))
    keys = {("acme", "example.com"): own, ("default", "example.com"): deployment}
    assert dkim.signing_key(keys, "acme", "Billing@Example.COM", "default") is own
    assert dkim.signing_key(keys, "other", "billing@example.com", "default") is deployment
    assert dkim.signing_key(keys, "acme", "billing@example.net", "default") is None
    assert "private" not in repr(own) and "own" in repr(own)


DKIM_RECORD = rules.Record(
    Purpose.DKIM, "s1._domainkey.example.com", "v=DKIM1; k=rsa; p=AAAB", "s1"
)
SPF_RECORD = rules.Record(Purpose.SPF, "example.com", "v=spf1 include:amazonses.com ~all")
DMARC_RECORD = rules.Record(Purpose.DMARC, "_dmarc.example.com", rules.DMARC_DEFAULT)


@pytest.mark.parametrize(
    ("record", "answer", "state", "fix"),
    [
        (DKIM_RECORD, [], State.MISSING, 'publish TXT s1._domainkey.example.com "v=DKIM1'),
        (DKIM_RECORD, ["v=DKIM1; k=rsa; p=AAAB"], State.OK, ""),
        (DKIM_RECORD, ["v=DKIM1; k=rsa; p=AA AB"], State.OK, ""),  # split strings, joined
        (DKIM_RECORD, ["v=DKIM1; k=rsa; p=ZZZZ"], State.WRONG, "another key"),
        (DKIM_RECORD, ["v=DKIM1; k=ed25519; p=AAAB"], State.WRONG, "another key"),
        (DKIM_RECORD, ["google-site-verification=x"], State.MISSING, "publish"),
        (SPF_RECORD, [], State.MISSING, "publish TXT example.com"),
        (SPF_RECORD, ["v=spf1 include:amazonses.com -all"], State.OK, ""),
        (
            SPF_RECORD,
            ["v=spf1 mx ~all"],
            State.WRONG,
            "add include:amazonses.com: v=spf1 mx include:amazonses.com ~all",
        ),
        (
            SPF_RECORD,
            ["v=spf1 include:amazonses.com ~all", "v=spf1 mx ~all"],
            State.WRONG,
            "merge them into one",
        ),
        (DMARC_RECORD, [], State.MISSING, "publish TXT _dmarc.example.com"),
        (DMARC_RECORD, ["v=DMARC1; p=reject; rua=mailto:d@example.com"], State.OK, ""),
        (DMARC_RECORD, ["v=DMARC1; rua=mailto:d@example.com"], State.WRONG, "give it a policy"),
        (DMARC_RECORD, ["v=DMARC1; p=none", "v=DMARC1; p=reject"], State.WRONG, "keep one"),
        (SPF_RECORD, Unanswered("TXT example.com: no answer"), State.UNCHECKED, "no answer"),
    ],
)
def test_each_answer_is_judged(
    record: rules.Record, answer: rules.Answer, state: State, fix: str
) -> None:
    finding = rules.judge(record, answer, ["include:amazonses.com"])
    assert finding.state is state
    assert fix in finding.fix
    assert (fix == "") == (finding.fix == "")


def test_records_name_every_live_key_and_the_providers_spf() -> None:
    found = rules.records(
        "example.com", {"new": "v=DKIM1; k=rsa; p=N", "old": "v=DKIM1; k=rsa; p=O"}, ["b", "a"]
    )
    assert [r.as_dict() for r in found] == [
        {"type": "TXT", "name": "new._domainkey.example.com", "value": "v=DKIM1; k=rsa; p=N"},
        {"type": "TXT", "name": "old._domainkey.example.com", "value": "v=DKIM1; k=rsa; p=O"},
        {"type": "TXT", "name": "example.com", "value": "v=spf1 a b ~all"},
        {"type": "TXT", "name": "_dmarc.example.com", "value": rules.DMARC_DEFAULT},
    ]
    assert rules.records("example.com", {}, [])[0].value == rules.SPF_FALLBACK
