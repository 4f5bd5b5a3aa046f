"""Erasure of one person's data (`mailbag erase ADDRESS`): the rules, no I/O.

What an erased row keeps: its skeleton (ids, states, times, counts), so the outbox's
history and metrics stay whole. What it loses: the address and everything personal a
message carried (names, subject, bodies, template data, headers, metadata, tags, errors).

The address itself is never written anywhere, not even in the erasure's own record: that
record and the suppression that keeps the person from being mailed again hold its keyed
hash (`ErasureKey.hashed`, an HMAC under a subkey of SECRET_KEY), which only a process that
has the key can compute from an address, and no one can turn back into one.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from enum import StrEnum

from mailbag import keys

PURPOSE = "erasure"  # the subkey's purpose (keys.derive)
HASH_PREFIX = "erased:"  # what a suppression's `email` starts with when it is a hash
PLACEHOLDER = "erased@erased.invalid"  # a NOT NULL address column of an erased row
ERASED_TEXT = "erased"  # a NOT NULL text column of an erased row
ERASED_BODY = '{"erased":true}'  # a NOT NULL JSON text (a hook delivery's payload)
CHUNK = 500  # messages (or rows of another table) per transaction


class State(StrEnum):
    RUNNING = "running"  # chunks remain (or the run was interrupted: run it again)
    WAITING = "waiting"  # only messages a worker holds right now remain: run it again
    DONE = "done"


@dataclass(frozen=True)
class ErasureKey:
    """The key erased addresses are hashed under (a subkey of the deployment's key)."""

    subkey: bytes

    @classmethod
    def of(cls, deployment_key: bytes) -> ErasureKey:
        return cls(keys.derive(deployment_key, PURPOSE))

    def hashed(self, address: str) -> str:
        """The suppression list's form of an erased address: the same for every case."""
        digest = hmac.new(self.subkey, address.lower().encode(), hashlib.sha256).hexdigest()
        return HASH_PREFIX + digest


def mentions(text: str | None, address: str) -> bool:
    """Whether a text quotes the address, in any case (the rule the SQL search follows)."""
    return text is not None and address.lower() in text.lower()
