"""A sender domain's DNS records: what to publish (`records`), and what the published ones
say (`judge`), each record `ok`, `missing`, `wrong` (with the fix) or `unchecked` (the
lookup failed: which record, which resolver). A domain is ready when every one is ok.

- DKIM: TXT at `SELECTOR._domainkey.DOMAIN` for each live key (the signing one, and during
  a rotation the next or the retired one): ok when a record there publishes that key.
- SPF: TXT at DOMAIN: exactly one `v=spf1` record (RFC 7208 4.5: two are a permanent
  error), holding the mechanism of each configured provider that declares one
  (providers' `Capabilities.spf`); with none declared, any one record is ok.
- DMARC: TXT at `_dmarc.DOMAIN`: exactly one `v=DMARC1` record with a policy (`p=`).
  Checked at the domain itself, not at its organizational domain.

Pure: the answers come in as data (services/sender_domains.py asks the resolver).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

SPF_FALLBACK = "v=spf1 a mx ~all"  # what to publish when no provider names its mechanism
DMARC_DEFAULT = "v=DMARC1; p=none; adkim=r; aspf=r"  # monitor first, then tighten p=
DMARC_POLICIES = frozenset({"none", "quarantine", "reject"})


class Purpose(StrEnum):
    DKIM = "dkim"
    SPF = "spf"
    DMARC = "dmarc"


class State(StrEnum):
    OK = "ok"
    MISSING = "missing"
    WRONG = "wrong"
    UNCHECKED = "unchecked"  # the lookup failed: nothing is known


@dataclass(frozen=True)
class Record:
    """A record to publish: `{"type", "name", "value"}` as `--json` prints it."""

    purpose: Purpose
    name: str
    value: str
    selector: str | None = None  # a DKIM record's
    type: str = "TXT"

    def as_dict(self) -> dict[str, str]:
        return {"type": self.type, "name": self.name, "value": self.value}


@dataclass(frozen=True)
class Finding:
    record: Record
    state: State
    found: tuple[str, ...] = ()  # the TXT values at the name (a DKIM key shortened)
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.record.as_dict(),
            "purpose": self.record.purpose.value,
            "state": self.state.value,
            "found": list(self.found),
            "fix": self.fix,
        }


@dataclass(frozen=True)
class Unanswered:
    """A lookup that failed (a timeout, SERVFAIL): says which resolver."""

    reason: str


Answer = Sequence[str] | Unanswered  # a name's TXT values (none: NXDOMAIN or no TXT)


def records(domain: str, dkim: Mapping[str, str], spf_mechanisms: Iterable[str]) -> list[Record]:
    """The records a domain needs: one DKIM record per live key (`dkim`: selector to its
    TXT value, the signing one first), then SPF and DMARC."""
    mechanisms = sorted(set(spf_mechanisms))
    spf = f"v=spf1 {' '.join(mechanisms)} ~all" if mechanisms else SPF_FALLBACK
    return [
        *(
            Record(Purpose.DKIM, f"{selector}._domainkey.{domain}", value, selector)
            for selector, value in dkim.items()
        ),
        Record(Purpose.SPF, domain, spf),
        Record(Purpose.DMARC, f"_dmarc.{domain}", DMARC_DEFAULT),
    ]


def judge(record: Record, answer: Answer, spf_mechanisms: Iterable[str] = ()) -> Finding:
    """What the published TXT values at `record.name` say of it."""
    if isinstance(answer, Unanswered):
        return Finding(record, State.UNCHECKED, fix=f"the lookup failed: {answer.reason}")
    if record.purpose is Purpose.DKIM:
        return _dkim(record, answer)
    if record.purpose is Purpose.SPF:
        return _spf(record, answer, sorted(set(spf_mechanisms)))
    return _dmarc(record, answer)


def ready(findings: Iterable[Finding]) -> bool:
    return all(f.state is State.OK for f in findings)


def tags(value: str) -> dict[str, str]:
    """A DKIM or DMARC record's tag=value list (RFC 6376 3.2), names in lower case."""
    found: dict[str, str] = {}
    for part in value.split(";"):
        name, equals, tag_value = part.partition("=")
        if equals:
            found.setdefault(name.strip().lower(), "".join(tag_value.split()))
    return found


def _publish(record: Record) -> str:
    return f'publish TXT {record.name} "{record.value}"'


def _dkim(record: Record, answer: Sequence[str]) -> Finding:
    keys = [v for v in answer if tags(v).get("v", "DKIM1") == "DKIM1" and "p" in tags(v)]
    found = tuple(_shortened(v) for v in answer)
    if not keys:
        return Finding(record, State.MISSING, found, _publish(record))
    wanted = tags(record.value)
    for value in keys:
        have = tags(value)
        if have["p"] == wanted["p"] and have.get("k", "rsa") == wanted["k"]:
            return Finding(record, State.OK, found)
    fix = f"replace it: {_publish(record)} (it publishes another key)"
    return Finding(record, State.WRONG, found, fix)


def _spf(record: Record, answer: Sequence[str], mechanisms: list[str]) -> Finding:
    spf = [v for v in answer if v.lower() == "v=spf1" or v.lower().startswith("v=spf1 ")]
    found = tuple(spf)
    if not spf:
        return Finding(record, State.MISSING, found, _publish(record))
    if len(spf) > 1:
        fix = f"merge them into one (two SPF records are an error): {record.value}"
        return Finding(record, State.WRONG, found, fix)
    have = {term.lower() for term in spf[0].split()[1:]}
    lacking = [m for m in mechanisms if m.lower() not in have]
    if not lacking:
        return Finding(record, State.OK, found)
    terms = spf[0].split()
    ending = [t for t in terms[1:] if t.lower().endswith("all")]  # `~all` stays last
    kept = [t for t in terms[1:] if t not in ending]
    merged = " ".join(["v=spf1", *kept, *lacking, *ending])
    fix = f"add {', '.join(lacking)}: {merged}"
    return Finding(record, State.WRONG, found, fix)


def _dmarc(record: Record, answer: Sequence[str]) -> Finding:
    dmarc = [v for v in answer if tags(v).get("v", "").upper() == "DMARC1"]
    found = tuple(dmarc)
    if not dmarc:
        return Finding(record, State.MISSING, found, _publish(record))
    if len(dmarc) > 1:
        return Finding(record, State.WRONG, found, "keep one DMARC record (receivers ignore two)")
    if tags(dmarc[0]).get("p", "").lower() not in DMARC_POLICIES:
        fix = f"give it a policy, p=none, quarantine or reject: {record.value}"
        return Finding(record, State.WRONG, found, fix)
    return Finding(record, State.OK, found)


def _shortened(value: str, keep: int = 60) -> str:
    return value if len(value) <= keep else f"{value[:keep]}..."
