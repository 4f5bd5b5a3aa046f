"""Sign SNS messages the way Amazon SNS does, with a local key, so tests can post validly
signed notifications without AWS.

`SnsSigner` holds a fresh RSA key and a self-signed certificate for it. `signer.sign(envelope)`
returns the envelope with SignatureVersion, Signature and SigningCertURL set, signed over
the canonical string AWS documents (docs.aws.amazon.com/sns/latest/dg/
sns-verify-signature-of-message.html). The string is built here on its own, not by
mailbag's code, so a test that verifies these signatures checks mailbag against the
documentation rather than against itself.

A test that serves the certificate must let mailbag trust the URL it uses, e.g.
`is_trusted_cert_url(url, allowed_hosts_pattern=r"^localhost$")`.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

DEFAULT_CERT_URL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-test.pem"
TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:mailbag-ses-events"

NOTIFICATION_KEYS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_KEYS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
SIGNED_KEYS = {
    "Notification": NOTIFICATION_KEYS,
    "SubscriptionConfirmation": CONFIRMATION_KEYS,
    "UnsubscribeConfirmation": CONFIRMATION_KEYS,
}
HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}


def string_to_sign(envelope: Mapping[str, Any]) -> bytes:
    """Each signed key, in the documented order, as "Key\\nvalue\\n"; absent keys skipped."""
    keys = SIGNED_KEYS[envelope["Type"]]
    return "".join(f"{k}\n{envelope[k]}\n" for k in keys if envelope.get(k) is not None).encode()


@dataclass(frozen=True)
class SnsSigner:
    private_key: rsa.RSAPrivateKey
    certificate_pem: bytes
    cert_url: str = DEFAULT_CERT_URL

    @classmethod
    def create(
        cls,
        cert_url: str = DEFAULT_CERT_URL,
        common_name: str = "sns.amazonaws.com",
        *,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
    ) -> SnsSigner:
        """A signer whose certificate is valid from a day ago for 30 days, unless told
        otherwise (an expired or not-yet-valid certificate for the tests that need one)."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.now(UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid_from or now - timedelta(days=1))
            .not_valid_after(valid_until or now + timedelta(days=30))
            .sign(key, hashes.SHA256())
        )
        return cls(key, certificate.public_bytes(serialization.Encoding.PEM), cert_url)

    def sign(self, envelope: Mapping[str, Any], version: str = "1") -> dict[str, Any]:
        """A copy of the envelope, signed with SignatureVersion `version` ("1" or "2")."""
        signed = {**envelope, "SignatureVersion": version, "SigningCertURL": self.cert_url}
        signature = self.private_key.sign(
            string_to_sign(signed), padding.PKCS1v15(), HASHES[version]()
        )
        signed["Signature"] = base64.b64encode(signature).decode()
        return signed


@cache
def shared_signer() -> SnsSigner:
    """One signer per test session: making an RSA key takes a noticeable moment."""
    return SnsSigner.create()


def sns_time(moment: datetime) -> str:
    """A time as SNS writes its Timestamp: 2026-11-30T06:10:00.123Z."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def notification(
    message: str | Mapping[str, Any],
    *,
    subject: str | None = "Amazon SES Email Event Notification",
    message_id: str | None = None,
    timestamp: str | None = None,
    topic_arn: str = TOPIC_ARN,
) -> dict[str, Any]:
    """An unsigned SNS Notification envelope around `message` (an SES record or text),
    sent now unless `timestamp` says otherwise (mailbag refuses messages over an hour old)."""
    envelope: dict[str, Any] = {
        "Type": "Notification",
        "MessageId": message_id or str(uuid.uuid4()),
        "TopicArn": topic_arn,
        "Message": message if isinstance(message, str) else json.dumps(message),
        "Timestamp": timestamp or sns_time(datetime.now(UTC)),
        "UnsubscribeURL": (
            "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe"
            f"&SubscriptionArn={topic_arn}:{uuid.uuid4()}"
        ),
    }
    if subject is not None:
        envelope["Subject"] = subject
    return envelope
