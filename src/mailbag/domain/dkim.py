"""DKIM for sender domains: names, keys, the record that publishes a key, and signing.

A sender domain's key is RSA 2048 (`rsa`, what every receiver verifies) or Ed25519
(`ed25519`, RFC 8463: short records, fast, verified by fewer receivers). Its public half is
published as TXT at `SELECTOR._domainkey.DOMAIN` (`dkim_record`); its private half is
sealed at rest (services/sender_domains.py) and signs every message whose From is on the
domain (`sign`, over the exact bytes a provider sends: compose.OutgoingEmail.raw).

Pure: key generation and signing use `cryptography` and dkimpy, no I/O.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from mailbag.domain.message import ascii_domain

DOMAIN_MAX = 253  # RFC 1035, in its dotted form
LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
# A selector is one DNS label here: dots would put the key under a deeper name, which a
# `domains check` of `S._domainkey.DOMAIN` would then not find where it says.
SELECTOR = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
RSA_BITS = 2048
KEY_FILE_MAX = 16_384  # a PEM private key of 4096 bits is about 3.3 kB


class Algorithm(StrEnum):
    RSA = "rsa"
    ED25519 = "ed25519"

    @property
    def signature(self) -> bytes:
        """dkimpy's (and the DKIM-Signature `a=` tag's) name of the algorithm."""
        return b"rsa-sha256" if self is Algorithm.RSA else b"ed25519-sha256"


class InvalidDomain(ValueError):
    """A domain, selector or key the rules refuse; the message says which and why."""


def sender_domain(text: str) -> str:
    """A sender domain in its canonical form (lower case, ASCII/IDNA, no trailing dot):
    InvalidDomain when it is not a domain name of at least two labels."""
    value = text.strip().rstrip(".").lower()
    if not value or any(ch.isspace() for ch in value) or "@" in value:
        raise InvalidDomain(f"domain: {text[:80]!r} is not a domain name")
    try:
        value = ascii_domain(value)
    except ValueError:
        raise InvalidDomain(f"domain: {text[:80]!r} has no ASCII (IDNA) form") from None
    labels = value.split(".")
    if len(value) > DOMAIN_MAX or len(labels) < 2 or not all(LABEL.match(x) for x in labels):
        raise InvalidDomain(
            f"domain: {text[:80]!r} is not a domain name (labels of letters, digits and -, "
            "at least two of them)"
        )
    if labels[-1].isdigit():
        raise InvalidDomain(f"domain: {text[:80]!r} is an address, not a domain name")
    return value


def selector(text: str) -> str:
    """A DKIM selector (one DNS label, lower case): InvalidDomain otherwise."""
    value = text.strip().lower()
    if not SELECTOR.match(value):
        raise InvalidDomain(
            f"selector: {text[:80]!r} must be one DNS label: letters, digits and -, "
            "no dots or spaces, at most 63 characters"
        )
    return value


@dataclass(frozen=True)
class KeyPair:
    algorithm: Algorithm
    private: bytes  # PEM (rsa) or the base64 of the 32-byte seed (ed25519): dkimpy's forms
    public: str  # the record's p=: base64 of the DER SubjectPublicKeyInfo, or the raw key

    @property
    def record(self) -> str:
        return dkim_record(self.algorithm, self.public)


def dkim_record(algorithm: Algorithm, public: str) -> str:
    """The TXT value that publishes a public key (RFC 6376 section 3.6.1)."""
    return f"v=DKIM1; k={algorithm.value}; p={public}"


def generate(algorithm: Algorithm) -> KeyPair:
    """A new key pair."""
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    if algorithm is Algorithm.RSA:
        return _pair(rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS))
    return _pair(ed25519.Ed25519PrivateKey.generate())


def imported(text: bytes) -> KeyPair:
    """A key pair from a PEM private key (RSA of 1024 bits or more, or Ed25519), as a key
    file holds it: InvalidDomain when it does not parse (the message never quotes it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    if len(text) > KEY_FILE_MAX:
        raise InvalidDomain(f"key: more than {KEY_FILE_MAX} bytes: not a private key file")
    try:
        key = serialization.load_pem_private_key(text, password=None)
    except (ValueError, TypeError):  # its message can hold the input's bytes
        raise InvalidDomain(
            "key: not an unencrypted PEM private key (RSA or Ed25519; "
            "`openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048` makes one)"
        ) from None
    if isinstance(key, rsa.RSAPrivateKey):
        if key.key_size < 1024:  # RFC 8301: verifiers refuse shorter keys
            raise InvalidDomain(f"key: RSA of {key.key_size} bits; DKIM needs 1024 or more")
        return _pair(key)
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return _pair(key)
    raise InvalidDomain("key: neither RSA nor Ed25519")


def _pair(key: object) -> KeyPair:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    if isinstance(key, rsa.RSAPrivateKey):
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,  # dkimpy reads PKCS#1
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return KeyPair(Algorithm.RSA, private, base64.b64encode(public).decode("ascii"))
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    seed = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KeyPair(Algorithm.ED25519, base64.b64encode(seed), base64.b64encode(raw).decode())


@dataclass(frozen=True)
class SigningKey:
    """The key that signs a domain's mail now."""

    domain: str
    selector: str
    algorithm: Algorithm
    private: bytes = b""

    def __repr__(self) -> str:  # never the private key, in a log or a traceback
        return f"SigningKey({self.domain!r}, {self.selector!r}, {self.algorithm.value})"


# What is signed: the headers a receiver shows or a replay would change. dkimpy signs
# those of them a message has; From is always one.
SIGNED_HEADERS = (
    "from",
    "to",
    "cc",
    "reply-to",
    "subject",
    "date",
    "message-id",
    "mime-version",
    "content-type",
    "list-unsubscribe",
    "list-unsubscribe-post",
    "feedback-id",
)


def sign(raw: bytes, key: SigningKey) -> bytes:
    """`raw` with a DKIM-Signature header in front (relaxed/simple, as dkimpy defaults)."""
    import dkim

    present = {
        line.split(b":", 1)[0].strip().lower().decode("ascii", "replace")
        for line in raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        if line and not line[:1].isspace()
    }
    headers = [name.encode() for name in SIGNED_HEADERS if name in present or name == "from"]
    signature: bytes = dkim.sign(
        raw,
        key.selector.encode("ascii"),
        key.domain.encode("ascii"),
        key.private,
        signature_algorithm=key.algorithm.signature,
        include_headers=headers,
        linesep=b"\r\n",
    )
    return signature + raw


def signing_key(
    keys: Mapping[tuple[str, str], SigningKey], tenant_id: str, from_email: str, default: str
) -> SigningKey | None:
    """The key for a From address: its domain's of the message's tenant, else of the
    deployment's (the `default` tenant's); None when neither has the domain."""
    domain = from_email.rpartition("@")[2].lower()
    if not keys or not domain:
        return None
    try:
        domain = ascii_domain(domain)
    except ValueError:
        return None
    return keys.get((tenant_id, domain)) or keys.get((default, domain))
